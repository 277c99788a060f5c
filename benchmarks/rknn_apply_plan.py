"""Apply one more bisect plan through RKNN hybrid quantization, reusing a finished `quantscan vendor rknn` folder.

Why: `vendor rknn --plan` also rebuilds all-int8 and re-runs quantscan's scan (PP-OCRv4 rec: ~7 min of scan
on a shared machine) when only the plan's build is new. This writes the same preprocessed samples again
(the vendor run removes them), reuses the folder's job.json, and runs only the hybrid build and simulator
(`toolchains.rknn.run.apply_plan`); rknn/hybrid/sim_outputs.npz is then what benchmarks/plan_holdout.py reads.

Run: PYTHONPATH=src python benchmarks/rknn_apply_plan.py MODEL CALIB --plan plan.json --vendor VENDOR_OUT
     --python ~/venv-rknn/bin/python [--limit 16]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from quantscan.calib import load_calibration
from quantscan.model import graph_inputs, load_model
from quantscan.toolchains.rknn.run import apply_plan, fp32_outputs, write_samples


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("calib", type=Path)
    ap.add_argument("--plan", type=Path, required=True)
    ap.add_argument("--vendor", type=Path, required=True)
    ap.add_argument("--python", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=16)
    args = ap.parse_args()
    loaded = load_model(args.model)
    specs = graph_inputs(loaded.proto)
    names = [s.name for s in specs]
    work = (args.vendor / "rknn").resolve()
    cset = load_calibration(args.calib, specs, limit=args.limit)
    samples = write_samples(cset, names, work / "data")
    job = json.loads((work / "job.json").read_text(encoding="utf-8"))
    if job["samples"] != samples:
        raise SystemExit("the vendor folder's job.json names other samples (another --limit or calibration folder)")
    try:
        reference = fp32_outputs(loaded, samples, names, 1)
        outputs = [o.name for o in loaded.proto.graph.output]
        result = apply_plan(args.plan.resolve(), args.python, job, work, reference, outputs, args.vendor.resolve())
    finally:
        shutil.rmtree(work / "data", ignore_errors=True)
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
