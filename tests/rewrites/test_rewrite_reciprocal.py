"""reciprocal: Reciprocal(x) -> Div(1, x) (bit-identical to onnx.reference on the original), refusals, the
proof, and the finding on a chip that runs Div but not Reciprocal (rk3588) naming the rewrite."""

from __future__ import annotations

import numpy as np
import onnx

from builders import build, op_types, run
from quantscan.compat.check import check
from quantscan.compat.rewrite_plan import plan_for_profile
from quantscan.records import RewriteId
from quantscan.rewrites.pipeline import rewrite
from quantscan.rewrites.reciprocal_to_div import reciprocal_to_div

RSQRT = """<ir_version: 8, opset_import: ["" : 13]>
g (float[4,16] x) => (float[4,16] y) {
    eps = Constant <value = float {1e-5}> ()
    two = Constant <value = float {2.0}> ()
    k = Constant <value = float {4.0}> ()
    sq = Mul (x, x)
    v = Add (sq, eps)
    s = Sqrt (v)
    r = Reciprocal (s)
    kr = Reciprocal (k)
    t = Mul (x, r)
    y = Mul (t, kr)
}"""
X = np.random.default_rng(0).normal(size=(4, 16)).astype(np.float32)


def test_reciprocal_becomes_a_bit_exact_div() -> None:
    m = build(RSQRT)
    res = reciprocal_to_div(m)
    onnx.checker.check_model(res.model, full_check=True)
    assert op_types(res.model).count("Reciprocal") == 1 and op_types(res.model).count("Div") == 1
    assert [c.node for c in res.changes] == ["Reciprocal:r"]
    assert [(r.node, "constant" in r.reason) for r in res.refusals] == [("Reciprocal:kr", True)]
    np.testing.assert_array_equal(run(res.model, {"x": X})[0], run(m, {"x": X})[0])
    # numpy oracle written out: x / sqrt(x^2 + eps) / 4
    np.testing.assert_allclose(run(res.model, {"x": X})[0], X / np.sqrt(X * X + 1e-5) / 4, rtol=1e-6)
    assert "Reciprocal" in op_types(m) and op_types(m).count("Reciprocal") == 2  # input untouched


def test_rk3588_finding_names_the_rewrite_and_the_plan_applies_it() -> None:
    m = build(RSQRT)
    (finding,) = [f for f in check(m, ["rk3588"]).records if f.op_type == "Reciprocal" and f.rule == "unsupported-op"]
    assert finding.rewrite is RewriteId.RECIPROCAL and finding.fix == "reciprocal"
    assert RewriteId.RECIPROCAL in plan_for_profile(m, "rk3588").rewrites
    horizon = [f for f in check(m, ["horizon-x3"]).records if f.op_type == "Reciprocal"]
    assert all(f.rewrite is not RewriteId.RECIPROCAL for f in horizon)  # X3 runs Div on the CPU too
    report = rewrite(m, ["reciprocal"], write=False)
    assert report.passed and all(o.max_rel < 1e-6 for o in report.proof.outputs)  # one rounding at most
    after = check(report.model, ["rk3588"]).records
    assert not [f for f in after if f.op_type == "Reciprocal" and f.severity == "error"]
