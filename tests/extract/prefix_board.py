"""onnxruntime as the board of a prefix kit: each prefix model quantized on its own by onnxruntime's
`quantize_static` (QDQ, MinMax, per-channel int8 weights, uint8 activations: another toolchain's
calibration and rounding than quantscan's), run by a plain InferenceSession at full graph optimisation
(integer kernels where it fuses QDQ), its one output saved as the kit's layout says
(OUTPUTS/<prefix>/<sample>.npy). `fault` perturbs one Conv's weights in every prefix that holds it, as a
compiler bug in that layer would reach every prefix compiled through it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper, version_converter
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

Fault = Callable[[np.ndarray], np.ndarray]


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _feeds(kit: Path, samples: list[str]) -> list[dict[str, np.ndarray]]:
    out = []
    for name in samples:
        with np.load(kit / "inputs" / f"{name}.npz") as data:
            out.append({k: data[k] for k in data.files})
    return out


def perturbed(model: onnx.ModelProto, node: str, fault: Fault) -> onnx.ModelProto:
    """`model` with `fault` applied to the weight (input 1) of `node`, when the model holds that node."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    target = next((n for n in out.graph.node if n.name == node), None)
    if target is None:
        return out
    for i, init in enumerate(out.graph.initializer):
        if init.name == target.input[1]:
            out.graph.initializer[i].CopyFrom(numpy_helper.from_array(fault(numpy_helper.to_array(init)), init.name))
    return out


def _with_per_channel_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Per-channel DequantizeLinear (its `axis`) needs opset 13: an older prefix (YOLOX exports are 11) is
    raised to 13 first, as onnxruntime's own quantization docs advise."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return version_converter.convert_version(model, 13) if opset < 13 else model


def run_board(kit: Path, outputs: Path, work: Path, fault_node: str | None = None, fault: Fault | None = None) -> Path:
    """Every prefix of `kit` quantized and run by onnxruntime on the kit's samples; outputs as the kit says."""
    import json

    manifest = json.loads((kit / "prefixes.json").read_text())
    samples = manifest["samples"]
    feeds = _feeds(kit, samples)
    work.mkdir(parents=True, exist_ok=True)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    for prefix in manifest["prefixes"]:
        model = onnx.load(kit / prefix["file"])
        if fault_node is not None and fault is not None:
            model = perturbed(model, fault_node, fault)
        model = _with_per_channel_opset(model)
        source, quantized = work / f"{prefix['file']}.float.onnx", work / prefix["file"]
        onnx.save(model, source)
        quantize_static(str(source), str(quantized), _Reader(feeds), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
        session = ort.InferenceSession(str(quantized), options, providers=["CPUExecutionProvider"])
        folder = outputs / Path(prefix["file"]).stem
        folder.mkdir(parents=True, exist_ok=True)
        for name, feed in zip(samples, feeds, strict=True):
            np.save(folder / f"{name}.npy", session.run(None, feed)[0])
    return outputs
