"""The generic npy format against onnxruntime's own dumps of quantscan's saved QDQ model.

Oracle: the QDQ model `--save-qdq` writes, every original tensor added as a graph output and run by a
plain onnxruntime InferenceSession (not quantscan's runner); its per-tensor values, written as the
contract's npy dumps, are the simulation itself, so every site must line up by name with the device
equal to the simulation. Faults planted into that ONNX graph (a Mul/Add after site K's output, so
they propagate downstream as a real one would) must be located at K.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from quantscan.device import compare_dumps, compare_with, simulate
from quantscan.device.dumps import open_dumps
from quantscan.scanning import scan
from tests.builders import write_chain

SAMPLES = 4


def _saved_qdq(tmp: Path, model: Path, calib: Path) -> onnx.ModelProto:
    path = tmp / "qdq.onnx"
    scan(model, calib, save_qdq=path, gain_candidates=0)
    return onnx.load(path)


def _tensor_names(model: Path) -> list[str]:
    proto = onnx.load(model)
    return [o for n in proto.graph.node for o in n.output if o]


def _plant(qdq: onnx.ModelProto, tensor: str, kind: str, channel: int = 0) -> onnx.ModelProto:
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
    from quantscan.graph.qdq import topological_sort

    return topological_sort(out)


def _dump(qdq: onnx.ModelProto, names: list[str], calib: Path, folder: Path, level: str = "disable") -> Path:
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


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, onnx.ModelProto, list[str]]:
    tmp = tmp_path_factory.mktemp("chain")
    model, calib = write_chain(tmp, samples=16, layers=6)
    return model, calib, _saved_qdq(tmp, model, calib), _tensor_names(model)


def test_npy_roundtrip_is_the_simulation(chain, tmp_path: Path) -> None:
    model, calib, qdq, names = chain
    result = compare_dumps(model, calib, _dump(qdq, names, calib, tmp_path / "dumps"), fmt="npy")
    table = result.table
    assert result.aligned_sites == result.sites == len(table)
    assert (table["aligned_by"] == "name").all()
    assert (table["samples"] == SAMPLES).all()
    assert np.allclose(table["sim_device_cosine"], 1.0, atol=1e-6)
    assert (table["sim_device_sqnr_db"] > 100).all()
    # device = simulation, so FP32 <-> device is FP32 <-> simulation
    assert np.allclose(table["fp32_device_sqnr_db"], table["fp32_sim_sqnr_db"], atol=1e-3)
    assert "departs" not in set(table["verdict"]) and not table["first_departure"].any()


def test_integer_kernels_do_not_depart(chain, tmp_path: Path) -> None:
    """onnxruntime at ORT_ENABLE_ALL (integer kernels where it fuses QDQ) rounds differently from the
    fake-quant simulation: a real "device", which must not be called a departure."""
    model, calib, qdq, names = chain
    result = compare_dumps(model, calib, _dump(qdq, names, calib, tmp_path / "dumps", level="all"))
    assert result.format == "npy"
    assert "departs" not in set(result.table["verdict"])


@pytest.mark.parametrize("kind", ["scale", "offset", "channel"])
def test_fault_planted_in_the_graph_is_located(chain, tmp_path: Path, kind: str) -> None:
    model, calib, qdq, names = chain
    simulation = simulate(model, calib)
    sites = [s.output for s in sorted(simulation.ctx.sites, key=lambda s: simulation.ctx.order[s.node])]
    clean = open_dumps(_dump(qdq, names, calib, tmp_path / "clean"), "npy")
    for k, tensor in enumerate(sites):
        if kind == "channel" and tensor == "y":
            continue  # the head has 10 channels, the mask 16
        energy = sum(np.square(clean.load(i)[tensor]).sum(axis=0) for i in range(SAMPLES))
        planted = _plant(qdq, tensor, kind, int(np.argmax(energy)))  # a live channel: the strongest
        folder = _dump(planted, names, calib, tmp_path / f"{kind}{k}")
        table = compare_with(simulation, open_dumps(folder, "npy")).table
        first = table[table["first_departure"]]
        assert list(first["tensor"]) == [tensor], (kind, k)
        assert "departs" not in set(table[table["order"] < first["order"].iloc[0]]["verdict"])
