"""Dump names a vendor derived from ONNX names, on the tiny chain (sites: MatMul+Add+Relu -> h<i>)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from qdq_dumps import SAMPLES, dump, saved_qdq, tensor_names

from builders import write_chain
from quantscan.device import Simulation, compare_with, simulate
from quantscan.device.dumps import DumpSet, open_dumps


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Simulation, DumpSet]:
    tmp = tmp_path_factory.mktemp("renamed")
    model, calib = write_chain(tmp, samples=16, layers=3)
    dumps = open_dumps(dump(saved_qdq(tmp, model, calib), tensor_names(model), calib, tmp / "dumps"), "npy")
    return simulate(model, calib), dumps


def _only(dumps: DumpSet, names: dict[str, str], transform=lambda a: a) -> DumpSet:  # noqa: ANN001
    def load(i: int) -> dict[str, np.ndarray]:
        values = dumps.load(i)
        return {new: transform(values[old]) for old, new in names.items()}

    return DumpSet("test", Path("."), dumps.keys, load)


def test_a_fused_kernel_named_after_its_inner_tensor_is_the_kernel_output(chain) -> None:
    """`mm1_mm_tp`: RKNN's name for the MatMul+Add+Relu kernel, transposed; it holds h1, not mm1."""
    simulation, dumps = chain
    renamed = _only(dumps, {"h0": "h0", "h1": "mm1_mm_tp", "h2": "h2"}, lambda a: a.T.copy())
    table = compare_with(simulation, renamed).table.set_index("tensor")
    assert table.loc["h1", "dump"] == "mm1_mm_tp"
    assert table.loc["h1", "aligned_by"] == "name; RKNN transpose suffix"
    assert table.loc["h1", "sim_device_sqnr_db"] > 100


def test_a_renamed_layer_with_other_values_is_not_taken_by_its_name(chain) -> None:
    """`h1_sw` holding h2's values (an op RKNN moved above a Reshape): matched by value to h2, not to h1."""
    simulation, dumps = chain
    result = compare_with(simulation, _only(dumps, {"h0": "h0", "h2": "h1_sw"}))
    table = result.table.set_index("tensor")
    assert table.loc["h1", "dump"] == ""
    assert table.loc["h2", "dump"] == "h1_sw" and table.loc["h2", "aligned_by"].startswith("value")
    assert SAMPLES == int(table.loc["h2", "samples"])
