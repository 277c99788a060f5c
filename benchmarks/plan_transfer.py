"""Does a bisect plan hold where it is applied? Claimed vs RKNN vs onnxruntime, per plan and Pareto point.

    python benchmarks/plan_transfer.py PLAN.json [PLAN.json ...] --limit 16 --python ~/venv-rknn/bin/python

Per plan.json (from `quantscan bisect`, any search) and per point (the plan, then every Pareto point):
the metric quantscan claims, its `interval` when plan.json has one, the cosine rknn-toolkit2's simulator
gets with the point's sites float16 (hybrid quantization through `toolchains/rknn/hybrid.py`: step 1 once,
one step-2 build per distinct point), the cosine of onnxruntime's `quantize_static` called with the plan's
onnxruntime export (`ort_quant_config.json`, the point's nodes excluded), all on the same first `--limit`
samples of the calibration folder the plan was measured on, against FP32. The builds column says what
each mode costs in vendor builds: `--verify` one per distinct point, `--evaluator rknn` one per search
evaluation (read from the plan when it was searched that way). Prints a Markdown table; `--json` keeps
the rows. The 'plans' engineer reruns it on plans from their search: only the plan.json path changes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _common import markdown_table  # noqa: E402

from quantscan.bisect.exports import onnxruntime_config  # noqa: E402
from quantscan.bisect.external import kernel_sites  # noqa: E402
from quantscan.calib import load_calibration  # noqa: E402
from quantscan.model import graph_inputs, load_model  # noqa: E402
from quantscan.records import Plan, PlanSite  # noqa: E402
from quantscan.runner import Runner, quantize_static_model  # noqa: E402
from quantscan.scanning.prepare import ScanContext, prepare_scan  # noqa: E402
from quantscan.toolchains.interpreter import find_python  # noqa: E402
from quantscan.toolchains.rknn.hybrid import HybridRknn  # noqa: E402
from quantscan.toolchains.rknn.kit import PYTHON as RKNN_PYTHON  # noqa: E402
from quantscan.toolchains.rknn.run import output_cosines  # noqa: E402


def _points(plan: Plan) -> list[tuple[str, tuple[str, ...], float, dict[str, Any] | None]]:
    """(label, site nodes, claimed value, interval) for the plan and each Pareto point."""
    raw = plan.to_json()
    points = []
    if plan.reached:
        claimed = (plan.achieved or {}).get("cosine", math.nan)
        points.append(("plan", tuple(s.node for s in plan.sites), claimed, raw.get("interval")))
    for p, p_raw in zip(plan.pareto, raw.get("pareto", []), strict=True):
        points.append((f"pareto {p.float_sites}", p.sites, p.value, p_raw.get("interval")))
    return points


def _sites(ctx: ScanContext, plan: Plan, nodes: tuple[str, ...]) -> list[PlanSite]:
    prec = [str(plan.fallback) if s.node in set(nodes) else "int8" for s in ctx.graph.sites]
    return kernel_sites(ctx, prec)


def _ort_cosine(plan: Plan, sites: list[PlanSite], hybrid: HybridRknn, feeds: list[dict[str, Any]]) -> float:
    """quantize_static with the point's onnxruntime export, on the same samples, against FP32."""
    call = onnxruntime_config(replace(plan, sites=tuple(sites)))["quantize_static"]
    qdq = quantize_static_model(hybrid.loaded.proto, iter(feeds), call)
    session = Runner().session(qdq)
    got = {}
    for i, feed in enumerate(feeds):
        out = session.run(feed)
        for k, name in enumerate(hybrid.output_names):
            got[f"{i}:{k}"] = out[name]
    cosines = output_cosines(hybrid.reference, got, hybrid.output_names)
    return min(cosines.values()) if cosines else math.nan


def _interval(interval: dict[str, Any] | None) -> str:
    if not isinstance(interval, dict):
        return "-"
    return f"[{float(interval.get('low', math.nan)):.4f}, {float(interval.get('high', math.nan)):.4f}]"


def measure(plan_path: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every point of one plan applied in RKNN and with quantize_static (module docstring)."""
    plan = Plan.from_json(json.loads(plan_path.read_text(encoding="utf-8")))
    model = Path(args.model or plan.model)
    calib = Path(args.calib or plan.calibration["path"])
    target = args.target or (plan.recipe or {}).get("profile") or "rk3588"
    loaded = load_model(model)
    cset = load_calibration(calib, graph_inputs(loaded.proto), limit=args.limit)
    ctx = prepare_scan(loaded, cset, profile=(plan.recipe or {}).get("profile"), limit=args.limit)
    work = Path(args.work) / f"{model.stem}-{int(time.time())}"
    hybrid = HybridRknn.create(loaded, cset, find_python(RKNN_PYTHON, args.python), target, work)
    feeds = [dict(s) for s in cset.samples()]
    session = json.loads((plan_path.parent / "session.json").read_text()) if (
        plan_path.parent / "session.json").exists() else {}
    searched_in_rknn = session.get("options", {}).get("evaluator") == "rknn"
    rows, seen = [], set()
    for label, nodes, claimed, interval in _points(plan):
        sites = _sites(ctx, plan, nodes)
        applied = hybrid.apply(sites, f"point-{len(rows):02d}")
        seen.add(frozenset(nodes))
        rows.append({
            "model": model.stem, "plan": str(plan_path), "point": label, "float_sites": len(nodes),
            "claimed": claimed, "interval": interval, "rknn": applied["cosine"],
            "ort": _ort_cosine(plan, sites, hybrid, feeds), "vanished": applied["vanished"],
            "honoured": sum(1 for h in applied["honoured"] if h["honoured"] is True),
            "unknown": sum(1 for h in applied["honoured"] if h["honoured"] is None),
            "sites_in_table": len(applied["honoured"]),
            "error": applied["error"], "build_s": applied["seconds"],
        })
        print(f"{model.stem} {label}: claimed {claimed:.5f}, rknn {applied['cosine']:.5f}, "
              f"ort {rows[-1]['ort']:.5f}", file=sys.stderr)
    for row in rows:
        row["builds_verify"] = len(seen)
        row["builds_search"] = plan.evaluations if searched_in_rknn else 0
        row["step1_s"] = round(hybrid.step1_seconds, 1)
    hybrid.close()
    return rows


def _vanished(nodes: list[str]) -> str:
    """The sites RKNN could not be told about: all when few, else how many and the first three."""
    if len(nodes) <= 3:
        return ", ".join(nodes) or "-"
    return f"{len(nodes)}: {', '.join(nodes[:3])}, ..."


def table(rows: list[dict[str, Any]]) -> str:
    headers = ["model", "point", "float sites", "claimed", "interval", "RKNN applied", "RKNN - claimed",
               "ORT applied", "ORT - claimed", "honoured / sites (unknown)", "vanished",
               "vendor builds (search + verify)"]
    body = []
    for r in rows:
        body.append([
            r["model"], r["point"], str(r["float_sites"]), f"{r['claimed']:.5f}", _interval(r["interval"]),
            f"{r['rknn']:.5f}", f"{r['rknn'] - r['claimed']:+.5f}", f"{r['ort']:.5f}",
            f"{r['ort'] - r['claimed']:+.5f}", f"{r['honoured']}/{r['sites_in_table']} ({r['unknown']})",
            _vanished(r["vanished"]), f"{r['builds_search']} + {r['builds_verify']}",
        ])
    return markdown_table(headers, body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plans", nargs="+", type=Path)
    parser.add_argument("--model", default=None, help="default: the plan's model")
    parser.add_argument("--calib", default=None, help="default: the plan's calibration folder")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--target", default=None, help="chip (default: the plan's profile)")
    parser.add_argument("--python", default=None, help="rknn-toolkit2's Python")
    parser.add_argument("--work", default="/tmp/plan_transfer")
    parser.add_argument("--json", default=None, type=Path)
    args = parser.parse_args()
    rows = [row for path in args.plans for row in measure(path, args)]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
