"""Dumps the way onnxruntime writes them: quantscan's saved QDQ model with every original tensor as an
output, run by a plain InferenceSession (not quantscan's runner), one .npz per sample (the npy format);
and faults planted into that graph after a site's output, so they propagate as a real one would."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from quantscan.api import scan
from quantscan.graph.qdq import topological_sort

SAMPLES = 4


def saved_qdq(tmp: Path, model: Path, calib: Path) -> onnx.ModelProto:
    path = tmp / "qdq.onnx"
    scan(model, calib, save_qdq=path, gain_candidates=0)
    return onnx.load(path)


def tensor_names(model: Path) -> list[str]:
    proto = onnx.load(model)
    return [o for n in proto.graph.node for o in n.output if o]


def plant(qdq: onnx.ModelProto, tensor: str, kind: str, channel: int = 0) -> onnx.ModelProto:
    """`tensor` (a site output, written by its DequantizeLinear) passed through a fault first: scaled by 2,
    offset by 1.5, or `channel` zeroed."""
    out = onnx.ModelProto()
    out.CopyFrom(qdq)
    for node in out.graph.node:
        node.output[:] = [f"{tensor}__pre" if o == tensor else o for o in node.output]
    if kind == "channel":
        mask = np.ones(16, np.float32)
        mask[channel] = 0.0
        const, op = numpy_helper.from_array(mask, "fault_c"), "Mul"
    else:
        const = numpy_helper.from_array(np.array(2.0 if kind == "scale" else 1.5, np.float32), "fault_c")
        op = "Mul" if kind == "scale" else "Add"
    out.graph.initializer.append(const)
    out.graph.node.append(helper.make_node(op, [f"{tensor}__pre", "fault_c"], [tensor], name="fault"))
    return topological_sort(out)


def dump(qdq: onnx.ModelProto, names: list[str], calib: Path, folder: Path, level: str = "disable") -> Path:
    """onnxruntime's values of every `names` tensor of `qdq`, one .npz per sample (000.npz, ...)."""
    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    options = ort.SessionOptions()
    options.graph_optimization_level = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = np.load(calib / "x.npy")
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(SAMPLES):
        values = session.run(names, {"x": x[i : i + 1]})
        np.savez(folder / f"{i:03d}.npz", **dict(zip(names, values, strict=True)))
    return folder
