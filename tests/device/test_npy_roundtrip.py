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
import pytest
from qdq_dumps import SAMPLES, dump, plant, saved_qdq, tensor_names

from builders import write_chain
from quantscan.device import compare_dumps, compare_with, simulate
from quantscan.device.dumps import open_dumps


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, onnx.ModelProto, list[str]]:
    tmp = tmp_path_factory.mktemp("chain")
    model, calib = write_chain(tmp, samples=16, layers=6)
    return model, calib, saved_qdq(tmp, model, calib), tensor_names(model)


def test_npy_roundtrip_is_the_simulation(chain, tmp_path: Path) -> None:
    model, calib, qdq, names = chain
    result = compare_dumps(model, calib, dump(qdq, names, calib, tmp_path / "dumps"), fmt="npy")
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
    result = compare_dumps(model, calib, dump(qdq, names, calib, tmp_path / "dumps", level="all"))
    assert result.format == "npy"
    assert "departs" not in set(result.table["verdict"])


@pytest.mark.parametrize("kind", ["scale", "offset", "channel"])
def test_fault_planted_in_the_graph_is_located(chain, tmp_path: Path, kind: str) -> None:
    model, calib, qdq, names = chain
    simulation = simulate(model, calib)
    kernels = [s for s in simulation.ctx.graph.sites if not s.is_input]  # device.csv: what the kernels wrote
    sites = [s.output for s in sorted(kernels, key=lambda s: simulation.ctx.graph.order[s.node])]
    clean = open_dumps(dump(qdq, names, calib, tmp_path / "clean"), "npy")
    for k, tensor in enumerate(sites):
        if kind == "channel" and tensor == "y":
            continue  # the head has 10 channels, the mask 16
        energy = sum(np.square(clean.load(i)[tensor]).sum(axis=0) for i in range(SAMPLES))
        planted = plant(qdq, tensor, kind, int(np.argmax(energy)))  # a live channel: the strongest
        folder = dump(planted, names, calib, tmp_path / f"{kind}{k}")
        table = compare_with(simulation, open_dumps(folder, "npy")).table
        first = table[table["first_departure"]]
        assert list(first["tensor"]) == [tensor], (kind, k)
        assert "departs" not in set(table[table["order"] < first["order"].iloc[0]]["verdict"])
