"""Each compatibility rule on tiny hand-built graphs: one where it must fire, one where it must not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper, parser

from quantscan.compat.check import check

PROFILE = """
[meta]
name = "test-chip"
[opset]
min = 11
max = 17
source = "test"
[ops]
npu = ["Conv", "Relu", "Add", "Mul", "Sigmoid", "LeakyRelu", "BatchNormalization", "ReduceMean", "Sub", "Pow",
       "Sqrt", "Div", "Softmax", "Reshape", "Concat", "Gather", "Unsqueeze", "Slice", "Cast"]
cpu = ["Erf"]
folded = ["Shape", "Constant", "Identity"]
unsupported = "reject"
source = "test"
[fusion]
activations = ["Relu"]
source = "test"
[dtypes]
npu = ["float32", "int8", "uint8"]
source = "test"
[tensor]
max_rank = 4
max_batch = 1
static_shapes = true
source = "test"
[[limit]]
op = "Conv"
attribute = "kernel"
min = 1
max = 7
on_violation = "reject"
source = "test doc"
[[limit]]
op = "Conv"
attribute = "stride"
max = 3
on_violation = "reject"
source = "guess"
unverified = true
"""


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("p") / "test-chip.toml"
    path.write_text(PROFILE)
    return path


def build(text: str, opset: int = 13, **weights: np.ndarray) -> onnx.ModelProto:
    """A model from onnx.parser graph text, plus initializers given as arrays."""
    m = parser.parse_model(f'<ir_version: 8, opset_import: ["" : {opset}]>\n{text}')
    m.graph.initializer.extend(numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items())
    return m


def rows(model: onnx.ModelProto, profile: Path, rule: str, **kw: object):  # type: ignore[no-untyped-def]
    r = check(model, [profile], **kw)  # type: ignore[arg-type]
    return r.findings[r.findings["rule"] == rule]


W3 = np.ones((4, 3, 3, 3))
W9 = np.ones((4, 3, 9, 9))
CONV = "g (float[1,3,16,16] x) => (float[1,4,16,16] y) {{ y = Conv<{attrs}>(x, w) }}"


def test_unsupported_op_fires_for_unknown_cpu_and_custom_ops(profile: Path) -> None:
    m = build("g (float[1,3,4,4] x) => (float[1,3,4,4] z) { y = Neg(x)\n e = Erf(y)\n z = Relu(e) }")
    found = rows(m, profile, "unsupported-op")
    assert dict(zip(found["op_type"], found["severity"], strict=True)) == {"Neg": "error", "Erf": "warn"}
    assert set(found["placement"]) == {"cpu"}
    custom = build("g (float[1,3] x) => (float[1,3] y) { y = foo.Bar(x) }")
    custom.opset_import.append(helper.make_opsetid("foo", 1))
    found = rows(custom, profile, "unsupported-op")
    assert found["attribute"].tolist() == ["domain"] and found["value"].tolist() == ["foo"]


def test_unsupported_op_silent_for_supported_ops(profile: Path) -> None:
    assert rows(build("g (float[1,3] x) => (float[1,3] y) { y = Relu(x) }"), profile, "unsupported-op").empty


def test_opset_outside_range(profile: Path) -> None:
    text = "g (float[1,3] x) => (float[1,3] y) { y = Relu(x) }"
    found = rows(build(text, opset=18), profile, "opset")
    assert found[["value", "limit", "severity"]].values.tolist() == [["18", "[11, 17]", "error"]]
    assert rows(build(text, opset=13), profile, "opset").empty


def test_param_limit_reports_value_and_limit(profile: Path) -> None:
    m = build(CONV.format(attrs="pads=[4,4,4,4]"), w=W9)
    found = rows(m, profile, "param-limit")
    assert found[["node", "attribute", "value", "limit", "severity"]].values.tolist() == [
        ["Conv_0", "kernel", "[9, 9]", "[1, 7]", "error"]
    ]
    assert rows(build(CONV.format(attrs="pads=[1,1,1,1]"), w=W3), profile, "param-limit").empty


def test_unverified_limit_is_capped_at_warn(profile: Path) -> None:
    m = build(CONV.replace("16,16] y", "4,4] y").format(attrs="strides=[4,4], pads=[1,1,1,1]"), w=W3)
    found = rows(m, profile, "param-limit")
    assert found[["attribute", "severity"]].values.tolist() == [["stride", "warn"]]


def test_dtype_int64_on_npu_path(profile: Path) -> None:
    m = build("g (int64[1,3] a, int64[1,3] b) => (int64[1,3] y) { y = Add(a, b) }")
    found = rows(m, profile, "dtype")
    assert found["value"].tolist() == ["int64"]
    assert rows(
        build("g (float[1,3] a, float[1,3] b) => (float[1,3] y) { y = Add(a, b) }"), profile, "dtype"
    ).empty


SHAPE_INPUTS = """g (float[1,4,8,8] x, int64[4] sz, int64[2] shp, int64[1] idx)
    => (float[1,4,16,16] y, float[1,256] z, float[1,4,1,8] g) {
    y = Resize <mode = "linear"> (x, , , sz)
    z = Reshape (x, shp)
    g = Gather <axis = 2> (x, idx)
}"""


def test_dtype_spares_the_int64_the_onnx_schema_requires() -> None:
    """Reshape's shape and Resize's sizes are int64 by the ONNX schema: "Cast to int32" there would make the
    model invalid, so no finding; Gather's indices may be int32 by the same schema, so that finding stays."""
    slot = {(s.name, i.name): {str(t) for c in s.type_constraints if c.type_param_str == i.type_str
                               for t in c.allowed_type_strs} or {i.type_str}
            for s in (onnx.defs.get_schema(op, 13) for op in ("Reshape", "Resize", "Gather")) for i in s.inputs}
    assert slot[("Reshape", "shape")] == slot[("Resize", "sizes")] == {"tensor(int64)"}  # the oracle: the schema
    assert "tensor(int32)" in slot[("Gather", "indices")]
    m = build(SHAPE_INPUTS)
    onnx.checker.check_model(m, full_check=True)
    for chip in ("rk3588", "ethos-u"):
        found = check(m, [chip]).findings
        assert found[found["rule"] == "dtype"]["node"].tolist() == (["Gather_2"] if chip == "rk3588" else []), chip
        flagged = found[(found["node"].isin(["Resize_0", "Reshape_1"])) & (found["severity"] != "info")]
        assert flagged.empty, flagged.to_dict("records")


def test_rank_and_batch_limits(profile: Path) -> None:
    found = rows(
        build("g (float[1,2,3,4,5] x) => (float[1,2,3,4,5] y) { y = Relu(x) }"), profile, "rank-size"
    )
    assert found[["attribute", "value"]].values.tolist() == [["rank", "5"]]
    found = rows(build("g (float[2,3,4,5] x) => (float[2,3,4,5] y) { y = Relu(x) }"), profile, "rank-size")
    assert found[["attribute", "value"]].values.tolist() == [["batch", "2"]]
    assert rows(
        build("g (float[1,3,4,5] x) => (float[1,3,4,5] y) { y = Relu(x) }"), profile, "rank-size"
    ).empty


def test_dynamic_input_dims(profile: Path) -> None:
    m = build("g (float[N,3] x) => (float[N,3] y) { y = Relu(x) }")
    found = rows(m, profile, "dynamic-input")
    assert found[["node", "op_type", "severity", "fix"]].values.tolist() == [
        ["x", "graph-input", "error", "fix-dim batch=1"]
    ]
    fixed = rows(m, profile, "dynamic-input", input_shapes={"x": [1, 3]})
    assert fixed["severity"].tolist() == ["info"]
    assert rows(build("g (float[1,3] x) => (float[1,3] y) { y = Relu(x) }"), profile, "dynamic-input").empty


SHAPE_CHAIN = """g (float[N,3,4] x) => (float[N,12] y) {
  s = Shape(x)
  n = Slice(s, st, en)
  t = Concat<axis=0>(n, rest)
  y = Reshape(x, t)
}"""


def test_shape_chain_that_folds_once_dims_are_fixed(profile: Path) -> None:
    m = build(SHAPE_CHAIN)
    m.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(v, np.int64), k)
            for k, v in {"st": [0], "en": [1], "rest": [12]}.items()
        ]
    )
    found = rows(m, profile, "shape-chain")
    assert found[["node", "value", "severity"]].values.tolist() == [
        ["Shape_0", "Shape→Slice→Concat→Reshape", "info"]
    ]
    assert "fix-dim" in found["fix"].iloc[0]


def test_shape_chain_that_survives_folding(profile: Path) -> None:
    m = build("g (float[4] x) => (float[M] y) { i = NonZero(x)\n s = Shape(i)\n y = Reshape(x, s) }")
    found = rows(m, profile, "shape-chain")
    assert found["severity"].tolist() == ["error"] and found["placement"].tolist() == ["cpu"]
    m = build("g (float[2,6] x) => (float[3,4] y) { y = Reshape(x, s) }")
    m.graph.initializer.append(numpy_helper.from_array(np.array([3, 4], np.int64), "s"))
    assert rows(m, profile, "shape-chain").empty


def test_fusion_breakers(profile: Path) -> None:
    conv = "g (float[1,3,8,8] x) => (float[1,4,8,8] z) {{ y = Conv<pads=[1,1,1,1]>(x, w)\n {body} }}"
    unfused = rows(build(conv.format(body="z = LeakyRelu(y)"), w=W3), profile, "fusion")
    assert unfused[["attribute", "value", "severity"]].values.tolist() == [
        ["fused_activation", "LeakyRelu", "warn"]
    ]
    blocked = rows(build(conv.format(body="r = Relu(y)\n z = Add(r, y)"), w=W3), profile, "fusion")
    assert blocked[["node", "attribute", "value"]].values.tolist() == [
        ["Relu_1", "fusion_blocked_by", "Add_2"]
    ]
    bn = conv.format(body="b = BatchNormalization(y, s, o, m, v)\n z = Add(b, y)")
    ones = np.ones(4)
    found = rows(build(bn, w=W3, s=ones, o=ones, m=ones, v=ones), profile, "fusion")
    assert found[["attribute", "value"]].values.tolist() == [["fold_into", "Conv_0"]]
    assert rows(build(conv.format(body="z = Relu(y)"), w=W3), profile, "fusion").empty


def test_control_flow(profile: Path) -> None:
    out = helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, [1])
    branch = helper.make_graph([helper.make_node("Constant", [], ["o"], value_floats=[1.0])], "b", [], [out])
    node = helper.make_node("If", ["c"], ["o"], then_branch=branch, else_branch=branch)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])], [out]
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    found = rows(m, profile, "control-flow")
    assert found[["node", "value", "severity", "placement"]].values.tolist() == [
        ["If_0", "2", "error", "cpu"]
    ]
    assert rows(build("g (float[1,3] x) => (float[1,3] y) { y = Relu(x) }"), profile, "control-flow").empty


LAYERNORM = """g (float[1,8,16] x) => (float[1,8,16] y) {
  m = ReduceMean<axes=[-1]>(x)
  d = Sub(x, m)
  p = Pow(d, two)
  v = ReduceMean<axes=[-1]>(p)
  e = Add(v, eps)
  s = Sqrt(e)
  y = Div(d, s)
}"""


def test_precision_decomposed_layernorm_is_one_finding(profile: Path) -> None:
    found = rows(build(LAYERNORM, two=np.array(2.0), eps=np.array(1e-5)), profile, "precision")
    assert found[["node", "attribute"]].values.tolist() == [["ReduceMean_0", "pattern"]]
    assert "ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div" in found["value"].iloc[0]


def test_precision_softmax_yes_constant_div_no(profile: Path) -> None:
    found = rows(build("g (float[1,10] x) => (float[1,10] y) { y = Softmax(x) }"), profile, "precision")
    assert found[["op_type", "severity"]].values.tolist() == [["Softmax", "info"]]
    m = build("g (float[1,10] x) => (float[1,10] y) { y = Div(x, six) }", six=np.array(6.0))
    assert rows(m, profile, "precision").empty


def test_channels_limit_reads_the_contract_channel_axis() -> None:
    """An NWC audio tensor [1, T=43844, 64] has 64 channels on its last axis, not 43844 on its time axis;
    a Conv-produced [1, 9000, 2, 2] tensor has 9000 on axis 1. rk3588 caps channels at 8192 for Softmax,
    ReduceMean and Reshape (RKNN op support list), so only the second is a finding."""
    nwc = build("""g (float[1, 43844, 64] x) => (float[1, 43844, 64] y, float[1, 43844, 1] m) {
        y = Softmax <axis = -1> (x)
        m = ReduceMean <axes = [2]> (x)
    }""")
    found = check(nwc, ["rk3588"]).findings
    assert found[found["attribute"] == "channels"].empty, found.to_dict("records")
    nchw = build("""g (float[1, 3, 2, 2] x) => (float[1, 36000] y) {
        c = Conv (x, w)
        y = Reshape (c, shp)
    }""", w=np.ones((9000, 3, 1, 1)))
    nchw.graph.initializer.append(numpy_helper.from_array(np.array([1, 36000], np.int64), "shp"))
    found = check(nchw, ["rk3588"]).findings
    limit = found[found["attribute"] == "channels"]
    assert limit[["node", "value"]].values.tolist() == [["Reshape_1", "9000"]]


def test_attention_softmax_gets_one_consistent_finding() -> None:
    """rk3588 lists Softmax on axis 1 only and runs Softmax in float16. An attention Softmax over the last
    axis of [1, 6, 49, 49] used to get a warning "Transpose ..." and a note "none needed" side by side; it
    now gets the warning alone, which says the float16 fact. A classifier Softmax within the limit keeps
    its float16 note and no warning."""
    attn = build("""g (float[1, 6, 49, 64] q, float[1, 6, 64, 49] k) => (float[1, 6, 49, 49] y) {
        s = MatMul (q, k)
        y = Softmax <axis = -1> (s)
    }""")
    found = check(attn, ["rk3588"]).findings
    mine = found[found["node"] == "Softmax_1"]
    assert mine[["rule", "severity"]].values.tolist() == [["param-limit", "warn"]]
    assert "Transpose" in mine["fix"].iloc[0]
    (record,) = [f for f in check(attn, ["rk3588"]).records if f.node == "Softmax_1"]
    assert "float16" in record.reason
    cls = build("g (float[1, 4] x) => (float[1, 4] y) { y = Softmax <axis = 1> (x) }")
    found = check(cls, ["rk3588"]).findings
    assert found[["rule", "severity"]].values.tolist() == [["float16", "info"]]
