"""Every point a `bisect --verify rknn` run built, quantscan's simulation beside RKNN's, per sample split.

    python benchmarks/rknn_plan_points.py MODEL CALIB LIMIT BISECT_OUT [N,N,...]

BISECT_OUT is the bisect's `--out` folder: its plan.json and the `toolchain/verify-NNN-*/sim_outputs.npz` of each
point (NNN = float sites). For each point (or the float-site counts given), quantscan's mixed model
(`scanning.gain.mixed_builder`, realisation 0: plan.json's claims) and RKNN's recorded simulator outputs are
scored against one FP32 pass on the held-out (odd), searched (even) and all samples, worst output pooled as
plan.json does; then per sample. Why: a claim that misses RKNN on the held-out samples only is a sample's
rounding, one that misses on every sample is a mechanism the simulation lacks (issue 38: PicoDet's Sigmoid grid).
The last column says whether the held-out samples can decide a 0.005 goal at all: RKNN's own held-out figure
with each held-out sample left out in turn.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from quantscan.calib import load_calibration
from quantscan.model import graph_inputs, load_model
from quantscan.runner import Runner
from quantscan.scanning.gain import mixed_builder
from quantscan.scanning.prepare import prepare_scan


def _sums(reference: list[list[np.ndarray]], outputs: list[list[np.ndarray]]) -> np.ndarray:
    """[sample, output, (xy, xx, yy)] of FP32 against a simulation."""
    return np.array([[[float(r.ravel().astype(np.float64) @ o.ravel()), float(r.ravel().astype(np.float64) @ r.ravel()),
                       float(o.ravel().astype(np.float64) @ o.ravel())] for r, o in zip(ref, out, strict=True)]
                     for ref, out in zip(reference, outputs, strict=True)])


def _cosine(sums: np.ndarray, samples: list[int]) -> float:
    total = sums[samples].sum(axis=0)
    return float(np.min(total[:, 0] / np.sqrt(total[:, 1] * total[:, 2])))


def main() -> int:
    model_path, calib, limit, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    only = {int(v) for v in sys.argv[5].split(",")} if len(sys.argv) > 5 else None
    plan = json.loads((folder / "plan.json").read_text(encoding="utf-8"))
    loaded = load_model(model_path)
    cset = load_calibration(calib, graph_inputs(loaded.proto), limit=limit)
    builder = mixed_builder(prepare_scan(loaded, cset, profile="rk3588", limit=limit, gain_candidates=0))
    names = [o.name for o in loaded.proto.graph.output]
    samples = list(cset.samples())
    fp32 = Runner().session(loaded.proto)
    reference = [[fp32.run(s)[n] for n in names] for s in samples]
    n = len(samples)
    splits = {"held out": list(range(1, n, 2)), "searched": list(range(0, n, 2)), "all": list(range(n))}
    print("| float sites | " + " | ".join(f"{k}: quantscan / RKNN / diff" for k in splits)
          + " | RKNN held out, one sample left out |")
    print("|---|" + "---|" * (len(splits) + 1))
    per_sample = []
    for point in plan["pareto"]:
        count = point["float_sites"] if isinstance(point["float_sites"], int) else len(point["float_sites"])
        if only is not None and count not in only:
            continue
        sim = np.load(next((folder / "toolchain").glob(f"verify-{count:03d}-*")) / "sim_outputs.npz")
        rknn = _sums(reference, [[sim[f"{i}:{k}"].reshape(reference[i][k].shape) for k in range(len(names))]
                                 for i in range(n)])
        sites = [s["node"] if isinstance(s, dict) else s for s in point["sites"]]
        session = Runner().session(builder.model(builder.precisions(sites)), built=True)
        ours = _sums(reference, [[session.run(s)[k] for k in names] for s in samples])
        cells = [f"{_cosine(ours, idx):.5f} / {_cosine(rknn, idx):.5f} / {_cosine(rknn, idx) - _cosine(ours, idx):+.4f}"
                 for idx in splits.values()]
        held = splits["held out"]
        left_out = [_cosine(rknn, [i for i in held if i != drop]) for drop in held] if len(held) > 1 else [math.nan]
        print(f"| {count} | " + " | ".join(cells) + f" | {min(left_out):.5f} - {max(left_out):.5f} |", flush=True)
        per_sample.append((count, [_cosine(ours, [i]) for i in range(n)], [_cosine(rknn, [i]) for i in range(n)]))
    print("\nper sample (quantscan | RKNN):")
    for count, ours_s, rknn_s in per_sample:
        print(f"{count:4d}: " + " ".join(f"{v:.4f}" for v in ours_s) + " | " + " ".join(f"{v:.4f}" for v in rknn_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
