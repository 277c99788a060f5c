"""fix-ceil-mode: ceil_mode=1 pools become ceil_mode=0 with explicit end pads and the same numbers (vs
onnx.reference on the original and a numpy max-pool written out), refusals with the reason, the proof
through the runner, the rk3568 finding naming the rewrite, and the MTCNN pools of a real model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from builders import assert_same_outputs, build, run
from conftest import asset_model
from quantscan.compat.check import check
from quantscan.graph.edit import get_attr
from quantscan.records import RewriteId
from quantscan.rewrites.fix_ceil_mode import fix_ceil_mode, pool_out_size
from quantscan.rewrites.pipeline import rewrite


def pool_model(op: str, size: int, k: int, s: int, extra: str = "", dims: str = "") -> onnx.ModelProto:
    dims = dims or f"1,2,{size},{size}"
    return build(
        f"""<ir_version: 8, opset_import: ["" : 13]>
        g (float[{dims}] x) => (float[n,c,oh,ow] y) {{
            y = {op} <kernel_shape = [{k}, {k}], strides = [{s}, {s}], ceil_mode = 1{extra}> (x)
        }}"""
    )


def numpy_maxpool_ceil(x: np.ndarray, k: int, s: int) -> np.ndarray:
    """The oracle written out: ceil-mode windows, the last one clipped to the input."""
    n = x.shape[-1]
    out = pool_out_size(n, k, s, 1, 0, 0, ceil=True)
    y = np.empty(x.shape[:2] + (out, out), x.dtype)
    for i in range(out):
        for j in range(out):
            y[..., i, j] = x[..., i * s : i * s + k, j * s : j * s + k].max(axis=(-1, -2))
    return y


@pytest.mark.parametrize("size, k, s", [(48, 3, 2), (23, 3, 2), (12, 2, 2), (11, 2, 2), (10, 3, 3)])
def test_maxpool_same_output(size: int, k: int, s: int) -> None:
    m = pool_model("MaxPool", size, k, s)
    res = fix_ceil_mode(m)
    (node,) = res.model.graph.node
    assert get_attr(node, "ceil_mode") == 0 and res.changes[0].rewrite == "fix-ceil-mode"
    onnx.checker.check_model(res.model, full_check=True)
    x = np.random.default_rng(size).standard_normal((1, 2, size, size)).astype(np.float32)
    (y,) = run(res.model, {"x": x})
    np.testing.assert_array_equal(y, numpy_maxpool_ceil(x, k, s))
    assert_same_outputs(m, res.model, {"x": x})


def test_extra_pad_goes_to_the_end_only() -> None:
    res = fix_ceil_mode(pool_model("MaxPool", 48, 3, 2))  # floor 23, ceil 24: one more cell at the end
    assert get_attr(res.model.graph.node[0], "pads") == [0, 0, 1, 1]


def test_average_pool_without_counted_pads() -> None:
    m = pool_model("AveragePool", 11, 2, 2, ", count_include_pad = 0")
    res = fix_ceil_mode(m)
    assert res.changes
    x = np.random.default_rng(1).standard_normal((1, 2, 11, 11)).astype(np.float32)
    assert_same_outputs(m, res.model, {"x": x})
    rep = rewrite(m, ["fix-ceil-mode"], write=False)
    assert rep.passed


@pytest.mark.parametrize(
    "op, extra, dims, reason",
    [
        ("AveragePool", ", count_include_pad = 1", "", "count_include_pad=1"),
        ("MaxPool", "", "1,2,h,w", "input spatial dim(s) h, w not fixed"),
    ],
)
def test_refusals_name_the_reason(op: str, extra: str, dims: str, reason: str) -> None:
    res = fix_ceil_mode(pool_model(op, 11, 2, 2, extra, dims))
    assert not res.changes and reason in res.refusals[0].reason


def test_proof_and_rk3568_finding_names_the_rewrite() -> None:
    m = pool_model("MaxPool", 23, 3, 2)
    found = [f for f in check(m, ["rk3568"]).records if f.attribute == "ceil_mode"]
    assert found and all(f.rewrite is RewriteId.FIX_CEIL_MODE for f in found)
    rep = rewrite(m, ["fix-ceil-mode"], write=False)
    assert rep.passed
    assert not [f for f in check(rep.model, ["rk3568"]).records if f.attribute == "ceil_mode"]


@pytest.mark.real
@pytest.mark.parametrize("name, count", [("mtcnn_onet", 3), ("mtcnn_rnet", 2)])
def test_mtcnn_pools(assets, name: str, count: int) -> None:  # type: ignore[no-untyped-def]
    """PyTorch's MTCNN pools with ceil_mode=1; with the batch fixed the rewrite is proven on random data."""
    rep = rewrite(asset_model(assets, name), ["fix-ceil-mode"], fix_dim=["batch=1"], write=False)
    assert rep.passed and len(rep.steps[-1].changes) == count
