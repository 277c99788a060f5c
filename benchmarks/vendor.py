"""quantscan against a real vendor simulator, per public asset model: `quantscan vendor rknn` on each.

For every asset model the toolkit accepts: output cosine of quantscan's simulation (scan --profile
TARGET) and of the vendor's simulator (same samples, same preprocessing), Spearman of quantscan's
isolated/cumulative cosine against the vendor's single/entire, how many of each side's 5 worst layers
the other also has, placement mismatches (unexplained/explained), and the time of each.

Spearman is given per quantscan site first (the headline) and per vendor layer after it: RKNN reports
one site as several layers (a Gemm's `out0_mm`, then its Reshape `out0_int8` and DataConvert `out0`)
that repeat one quantscan figure against the copies' ~1.0, ties that rank correlation counts as
disagreement (MTCNN ONet: 0.71 over 13 layers, 0.98 over its 8 sites; see `align.by_site`).
Goals (issue 12): |delta output cosine| <= 0.01, Spearman >= 0.9, zero unexplained mismatches.

Run: python benchmarks/vendor.py --python /path/to/venv-rknn/bin/python [--target rk3588]
     [--limit N] [--analysis-samples N] [--models a,b] [ASSETS_DIR]
Needs the vendor toolkit in that Python (never in ours); prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from quantscan.api import scan
from quantscan.errors import QuantscanError
from quantscan.toolchains.rknn.run import run_rknn

STATEFUL = {"silero_vad_openvino_16k"}
"""Recurrent models need their state fed back per sample; the vendor simulator is run one sample at a
time from the files, so these are left out (said in the table)."""


def _fmt(value: float | int | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assets", nargs="?", default=str(Path(__file__).resolve().parents[2] / "shared" / "assets"))
    parser.add_argument("--python", required=True)
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--analysis-samples", type=int, default=None)
    parser.add_argument("--models", default=None, help="comma-separated model stems (default: every asset)")
    parser.add_argument("--out", default=None, help="keep the run folders here")
    args = parser.parse_args()
    assets = Path(args.assets)
    names = args.models.split(",") if args.models else sorted(p.stem for p in (assets / "models").glob("*.onnx"))
    out_root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="quantscan-vendor-bench-"))
    header = ("| model | samples | analysed | stage | qs cos | vendor cos | delta | rho iso/single per site (sites) "
              "| rho cum/entire per site (sites) | rho iso/single per layer (layers) | rho cum/entire per layer "
              "| top-5 iso | top-5 cum | lowering | placement unexplained/explained | qs scan s "
              "| vendor build s | vendor sim s | vendor analysis s |")
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    notes = []
    for name in names:
        if name in STATEFUL:
            notes.append(f"- {name}: left out (recurrent state fed back per sample; not driven here)")
            continue
        print(f"[vendor bench] {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            run = run_rknn(assets / "models" / f"{name}.onnx", assets / "calib" / name, target=args.target,
                           out=out_root / name, scan=scan, python=args.python, limit=args.limit,
                           analysis_samples=args.analysis_samples)
        except QuantscanError as exc:
            notes.append(f"- {name}: not run ({exc})")
            continue
        meta = json.loads((out_root / name / "vendor.json").read_text())
        agree, times = meta["agreement"], meta["times"]
        output, qs, vendor = run.headline
        mismatches = meta["placement_mismatches"]
        rows.append(
            f"| {name} | {run.samples} | {run.analysis_samples} | {run.stage_reached} | {_fmt(qs)} | {_fmt(vendor)} "
            f"| {_fmt(vendor - qs if output else None)} "
            f"| {_fmt(agree.get('spearman_isolated_sites'), 3)} ({agree.get('isolated_sites', 0)}) "
            f"| {_fmt(agree.get('spearman_cumulative_sites'), 3)} ({agree.get('cumulative_sites', 0)}) "
            f"| {_fmt(agree.get('spearman_isolated'), 3)} ({agree.get('isolated_layers', 0)}) "
            f"| {_fmt(agree.get('spearman_cumulative'), 3)} ({agree.get('cumulative_layers', 0)}) "
            f"| {agree.get('top5_overlap_isolated', 0)}/5 | {agree.get('top5_overlap_cumulative', 0)}/5 "
            f"| {meta['loss'].get('lowering', 0)} | {mismatches['unexplained']}/{mismatches['explained']} "
            f"| {_fmt(times.get('quantscan_scan_s'), 1)} | {_fmt(times.get('vendor_build_s'), 1)} "
            f"| {_fmt(times.get('vendor_simulator_s'), 1)} | {_fmt(times.get('vendor_accuracy_analysis_s'), 1)} |"
        )
        if run.error:
            notes.append(f"- {name}: {run.tool} stopped in {run.error['stage']}: {run.error['message'][:300]}")
        print(f"[vendor bench] {name} done in {time.perf_counter() - t0:.0f} s: {rows[-1]}", file=sys.stderr,
              flush=True)
    print(f"quantscan vendor benchmark: rknn-toolkit2 ({args.python}), target {args.target}, "
          f"limit {args.limit or 'all'}, analysis samples {args.analysis_samples or 'all'}; run folders in {out_root}")
    print("\n".join(rows))
    if notes:
        print("\n" + "\n".join(notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
