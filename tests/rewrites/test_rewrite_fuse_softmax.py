"""fuse-softmax: an attention block's written-out softmax (YOLOv12's AAttn: q·k, ReduceMax, Sub, Exp,
ReduceSum, Div, then ·v) becomes one Softmax node; refusals; and check's loop: ethos-u names the
rewrite for every part (it runs Softmax, none of the parts), horizon-x3 (Softmax on its CPU) does not.

Oracles: onnx's ReferenceEvaluator on the original and the rewritten graph (builders.assert_same_outputs),
and the softmax written out in numpy on the attention scores.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from builders import assert_same_outputs, build, op_types, rng_array
from quantscan.compat.check import check
from quantscan.rewrites.fuse_softmax import fuse_softmax

WEIGHTS = {"wq": rng_array((8, 8), 1), "wk": rng_array((8, 8), 2)}
X = {"x": rng_array((4, 6, 8), 3, -2, 2)}


def attention(opset: int, axes: str = "<axes = [-1]>", extra_out: str = "", extra: str = "") -> onnx.ModelProto:
    """[areas, tokens, dim] scores q·kᵀ, softmax written out as the fork exports it (max-shifted)."""
    reduce_sum = ("s = ReduceSum <keepdims = 1> (e, ax)" if opset >= 13 else
                  f"s = ReduceSum <keepdims = 1, {axes[1:-1]}> (e)")
    return build(
        f"""<ir_version: 8, opset_import: ["" : {opset}]>
        g (float[4,6,8] x) => (float[4,6,6] y{extra_out}) {{
            q = MatMul (x, wq)
            k = MatMul (x, wk)
            kt = Transpose <perm = [0, 2, 1]> (k)
            a = MatMul (q, kt)
            ax = Constant <value = int64[1] {{-1}}> ()
            m = ReduceMax <keepdims = 1, {axes[1:-1]}> (a)
            d = Sub (a, m)
            e = Exp (d)
            {reduce_sum}
            y = Div (e, s)
            {extra}
        }}""",
        WEIGHTS,
    )


def test_written_out_softmax_becomes_one_softmax() -> None:
    model = attention(17)
    res = fuse_softmax(model)
    assert op_types(res.model) == ["MatMul", "MatMul", "Transpose", "MatMul", "Softmax"] and len(res.changes) == 1
    assert "ReduceMax/Sub/Exp/ReduceSum/Div" in res.changes[0].detail
    onnx.checker.check_model(res.model, full_check=True)
    assert_same_outputs(model, res.model, X, rel=1e-6)
    x = X["x"].astype(np.float64)
    scores = (x @ WEIGHTS["wq"]) @ (x @ WEIGHTS["wk"]).transpose(0, 2, 1)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    (got,) = ReferenceEvaluator(res.model).run(None, X)
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_refusals_leave_the_graph_as_it_was() -> None:
    shared = fuse_softmax(attention(17, extra_out=", float[4,6,6] ey", extra="ey = Identity (e)"))
    assert not shared.changes and "another consumer" in shared.refusals[0].reason
    # opset 11: Softmax(axis=1) would normalise axes 1 and 2 together, not axis 1 alone
    old = fuse_softmax(attention(11, axes="<axes = [1]>"))
    assert not old.changes and "last-axis" in old.refusals[0].reason
    last = attention(11, axes="<axes = [-1]>")
    fused = fuse_softmax(last)
    assert op_types(fused.model)[-1] == "Softmax"
    assert_same_outputs(last, fused.model, X, rel=1e-6)


def test_check_names_fuse_softmax_where_the_chip_runs_softmax_and_the_loop_closes() -> None:
    model = attention(17)
    parts = {"ReduceMax", "Sub", "Exp", "ReduceSum", "Div"}
    found = check(model, ["ethos-u", "horizon-x3"]).findings
    found = found[found["rule"] == "unsupported-op"]
    ethos = found[(found["profile"] == "ethos-u") & found["op_type"].isin(parts)]
    assert set(ethos["op_type"]) == {"ReduceMax", "Exp", "ReduceSum", "Div"}  # Sub runs on Ethos-U
    assert set(ethos["fix"]) == {"fuse-softmax"}
    horizon = found[(found["profile"] == "horizon-x3") & found["op_type"].isin(parts)]
    assert not horizon.empty and "fuse-softmax" not in set(horizon["fix"])
    after = check(fuse_softmax(model).model, ["ethos-u"]).findings
    assert after[after["rule"] == "unsupported-op"]["op_type"].tolist() == ["Transpose"]


def test_check_names_fuse_softmax_only_where_the_rewrite_applies() -> None:
    """exp(x) also read elsewhere: the rewrite refuses, so check names no rewrite for those parts."""
    model = attention(17, extra_out=", float[4,6,6] ey", extra="ey = Identity (e)")
    assert not fuse_softmax(model).changes
    found = check(model, ["ethos-u"]).findings
    parts = found[(found["rule"] == "unsupported-op") & found["op_type"].isin({"ReduceMax", "Exp", "ReduceSum", "Div"})]
    assert not parts.empty and "fuse-softmax" not in set(parts["fix"])
