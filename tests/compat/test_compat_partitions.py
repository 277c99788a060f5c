"""Partitions and the CheckResult API on a tiny graph whose crossing bytes are computed by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import numpy_helper, parser

from quantscan.compat import COLUMNS, stable_node_names
from quantscan.compat.check import check
from quantscan.errors import UsageError

PROFILE = """
[meta]
name = "two-op"
[ops]
npu = ["Conv", "Relu"]
cpu = ["Erf"]
source = "test"
"""


@pytest.fixture()
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "two-op.toml"
    path.write_text(PROFILE)
    return path


def model():  # type: ignore[no-untyped-def]
    m = parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 13]>\n'
        "g (float[1,3,8,8] x) => (float[1,4,8,8] z) {\n"
        "  c = Conv<pads=[1,1,1,1]>(x, w)\n  e = Erf(c)\n  z = Relu(e)\n}"
    )
    m.graph.initializer.append(numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w"))
    return m


def test_partition_bytes_match_hand_computation(profile: Path) -> None:
    r = check(model(), [profile])
    parts = r.partitions
    # Conv output c: 1*4*8*8 float32 = 1024 bytes NPU->CPU; Erf output e: 1024 bytes CPU->NPU.
    assert parts[["partition", "placement", "n_nodes", "bytes_in", "bytes_out"]].values.tolist() == [
        [0, "npu", 1, 0, 1024],
        [1, "cpu", 1, 1024, 1024],
        [2, "npu", 1, 1024, 0],
    ]
    assert r.summary()["two-op"]["bytes_crossing"] == 2048
    assert r.summary()["two-op"]["islands"] == 3
    assert r.node_placement == {"two-op": {"Conv_0": "npu", "Erf_1": "cpu", "Relu_2": "npu"}}


def test_findings_have_contract_columns_and_details(profile: Path) -> None:
    r = check(model(), [profile, "generic-npu"])
    assert tuple(r.findings.columns) == COLUMNS
    assert len(r.details) == len(r.findings) and r.details["reason"].str.len().gt(0).all()
    erf = r.findings[(r.findings["node"] == "Erf_1") & (r.findings["rule"] == "unsupported-op")]
    assert erf[["profile", "placement", "partition"]].values.tolist() == [
        ["two-op", "cpu", 1],
        ["generic-npu", "cpu", 1],
    ]
    assert set(r.summary().columns) == {"two-op", "generic-npu"}


def test_worst_severity_and_fails(profile: Path) -> None:
    r = check(model(), [profile])
    assert r.worst_severity("two-op") == "warn"
    assert r.fails("warn") and not r.fails("error")
    with pytest.raises(UsageError):
        r.fails("fatal")


def test_unnamed_nodes_get_stable_names() -> None:
    m = model()
    m.graph.node[2].name = "Conv_0"  # a real name that collides with a generated one
    assert stable_node_names(m.graph.node) == ["Conv_0_1", "Erf_1", "Conv_0"]


def test_bad_input_shapes_are_usage_errors(profile: Path) -> None:
    with pytest.raises(UsageError, match="'y'"):
        check(model(), [profile], input_shapes={"y": [1]})
    with pytest.raises(UsageError, match="4 dims"):
        check(model(), [profile], input_shapes={"x": [1, 3]})
