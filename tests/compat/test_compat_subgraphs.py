"""check walks If/Loop/Scan bodies: findings inside a body are named by path and placed with their owner."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from builders import VAD_HIDDEN, if_wrapped, vad_like
from quantscan.compat.check import check
from quantscan.graph.subgraphs import bodies, body_model, node_bodies, outer_reads, scope_of
from quantscan.rewrites.fix_dim import fix_dim
from quantscan.rewrites.freeze_input import freeze_input
from quantscan.rewrites.pipeline import rewrite

H = 4


def lstm_in_if(cond_from_input: bool = True) -> onnx.ModelProto:
    """If(sr == 16000) with an LSTM over `x` in the then branch and a Relu in the else branch."""
    w = numpy_helper.from_array(np.ones((1, 4 * H, H), np.float32), "W")
    r = numpy_helper.from_array(np.ones((1, 4 * H, H), np.float32), "R")
    then = helper.make_graph(
        [helper.make_node("LSTM", ["x", "W", "R"], ["then_y"], name="LSTM_3", hidden_size=H)],
        "then", [], [helper.make_tensor_value_info("then_y", TensorProto.FLOAT, [5, 1, 1, H])],
    )
    other = helper.make_graph(
        [helper.make_node("Relu", ["x4"], ["else_y"], name="Relu_1")],
        "else", [], [helper.make_tensor_value_info("else_y", TensorProto.FLOAT, [5, 1, 1, H])],
    )
    nodes = [
        helper.make_node("Unsqueeze", ["x", "axis"], ["x4"], name="Unsq"),
        helper.make_node("Equal", ["sr", "rate"], ["c"], name="Equal_0"),
        helper.make_node("If", ["c"], ["y"], name="If_0", then_branch=then, else_branch=other),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 1, H])]
    inits = [w, r, numpy_helper.from_array(np.array([1], np.int64), "axis")]
    if cond_from_input:
        inputs.append(helper.make_tensor_value_info("sr", TensorProto.INT64, []))
        inits.append(numpy_helper.from_array(np.array(16000, np.int64), "rate"))
    else:
        nodes.insert(0, helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0))
        nodes.insert(1, helper.make_node("Cast", ["mx"], ["sr"], to=TensorProto.INT64))
        inits.append(numpy_helper.from_array(np.array(1, np.int64), "rate"))
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 1, 1, H])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_bodies_are_named_by_path_and_read_the_outer_scope() -> None:
    model = lstm_in_if()
    found = {b.path: b for b in bodies(model.graph)}
    assert sorted(found) == ["If_0/else_branch", "If_0/then_branch"]
    assert outer_reads(found["If_0/then_branch"].graph) == ["x", "W", "R"]
    standalone = body_model(model, found["If_0/then_branch"], scope_of(model.graph))
    assert [i.name for i in standalone.graph.input] == ["x"]  # W and R are weights: initializers
    assert sorted(t.name for t in standalone.graph.initializer) == ["R", "W"]
    onnx.checker.check_model(standalone)


def test_an_lstm_inside_an_if_is_checked_under_its_path() -> None:
    result = check(lstm_in_if(), ["horizon-x3", "rk3588"])
    f = result.findings
    inner = f[f["node"] == "If_0/then_branch/LSTM_3"]
    # horizon-x3 lists LSTM as a CPU op: the finding the top-level check used to miss
    x3 = inner[(inner["profile"] == "horizon-x3") & (inner["rule"] == "unsupported-op")]
    assert x3[["op_type", "severity"]].values.tolist() == [["LSTM", "warn"]]
    # the body runs where the If runs, so its rows carry the If's placement and island
    owner = f[(f["node"] == "If_0") & (f["profile"] == "horizon-x3")].iloc[0]
    assert set(x3["placement"]) == {owner["placement"]} and set(x3["partition"]) == {owner["partition"]}
    assert not inner[inner["profile"] == "rk3588"].empty  # rk3588 runs LSTM: precision advice at least
    # model-level rules stay at the top: no opset or graph-input rows inside a body
    assert not f[f["node"].str.contains("/") & f["rule"].isin(["opset", "dynamic-input"])].any().any()


def test_if_on_a_setting_input_names_the_value_its_condition_tests() -> None:
    """`Equal(sr, 16000)`: the flag is `--freeze-input sr=16000`, said to take the then branch (the
    deployed value stays the user's: rewrite_args carry the name only, --all-for-profile asks for it)."""
    f = check(lstm_in_if(), ["rk3588"]).records
    (finding,) = [x for x in f if x.rule == "control-flow"]
    assert finding.rewrite is not None and finding.rewrite.value == "freeze-input"
    assert finding.rewrite_args == ("sr",)
    assert "--freeze-input sr=16000" in finding.fix and "then branch" in finding.fix


def _ifs(graph: onnx.GraphProto) -> int:
    return sum((n.op_type == "If") + sum(_ifs(g) for _, g in node_bodies(n)) for n in graph.node)


def test_if_conditions_on_sizes_name_the_exact_fix_dims_that_fold_them() -> None:
    """silero-vad's wheel pattern (`builders.vad_like`): after the sr If, Ifs test sizes. check traces each
    condition to the inputs and names the flags; applying them folds every If (onnxruntime's proof and
    onnx's reference evaluator agree on the outputs), and each flag is needed (drop one, an If stays)."""
    model = vad_like()
    result = check(model, ["rk3588"])
    assert result.fold_flags == ["--freeze-input sr=16000", "--fix-dim batch=1", "--fix-dim T=V"]
    by_node = {r.node: r for r in result.records if r.rule == "control-flow"}
    assert "--fix-dim batch=1" in by_node["If_0/then_branch/If_state"].fix  # state [2, N, h]: N is the batch
    assert "T=" not in by_node["If_0/then_branch/If_state"].fix
    assert "--fix-dim batch=1 --fix-dim T=V" in by_node["If_0/then_branch/If_squeeze"].fix
    assert "export with the branch condition" not in " ".join(r.fix for r in by_node.values())
    sized = check(model, ["rk3588"], input_shapes={"x": [1, 12], "state": [2, 1, VAD_HIDDEN]})
    assert sized.fold_flags == ["--freeze-input sr=16000", "--fix-dim batch=1", "--fix-dim T=12"]
    dims = [f.split(" ", 1)[1] for f in sized.fold_flags if f.startswith("--fix-dim")]
    report = rewrite(model, [], fix_dim=dims, freeze_input=["sr=16000"], write=False)
    assert report.passed and _ifs(report.model.graph) == 0
    x = np.random.default_rng(3).normal(size=(1, 12)).astype(np.float32)
    state = np.random.default_rng(4).normal(size=(2, 1, VAD_HIDDEN)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x, "state": state, "sr": np.array(16000, np.int64)})[0]
    got = ReferenceEvaluator(report.model).run(None, {"x": x, "state": state})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for left_out in range(len(dims)):
        fewer = [d for k, d in enumerate(dims) if k != left_out]
        partial = freeze_input(fix_dim(model, fewer).model if fewer else model, ["sr=16000"]).model
        assert _ifs(partial.graph) > 0, f"{dims[left_out]} named but not needed"


def test_if_on_data_keeps_the_plain_advice() -> None:
    f = check(lstm_in_if(cond_from_input=False), ["rk3588"]).records
    (finding,) = [x for x in f if x.rule == "control-flow"]
    assert finding.rewrite is None and "freeze-input" not in finding.fix


def test_if_outputs_are_data_not_a_shape_chain() -> None:
    """An If whose condition comes from a Shape still outputs data its body computed: the nodes after it
    are kernels, not a shape computation (they used to vanish from the check as a 'shape chain')."""
    model = lstm_in_if()
    g = model.graph
    g.node[1].CopyFrom(helper.make_node("Shape", ["x"], ["shp"], name="Shape_0"))
    g.node.insert(2, helper.make_node("ReduceSum", ["shp"], ["c_num"], keepdims=0, name="Sum_0"))
    g.node.insert(3, helper.make_node("Equal", ["c_num", "rate"], ["c"], name="Equal_0"))
    del g.input[1]
    g.node.append(helper.make_node("Sigmoid", ["y"], ["z"], name="Sigmoid_9"))
    g.output[0].name = "z"
    f = check(model, ["horizon-x3"]).findings
    assert not f[(f["rule"] == "shape-chain") & f["value"].str.contains("Sigmoid")].any().any()


@pytest.mark.real
def test_silero_behind_an_if_reports_the_inner_lstm(assets: Path) -> None:
    """silero-vad as its wheel ships it (If on `sr`, the network inside the branches), rebuilt from the
    asset's 16 kHz graph: the LSTM inside the branch is checked against both chips."""
    model = if_wrapped(onnx.load(assets / "models" / "silero_vad_openvino_16k.onnx"))
    f = check(model, ["rk3588", "horizon-x3"]).findings
    lstm = f[(f["op_type"] == "LSTM") & f["node"].str.startswith("If_0/then_branch/")]
    assert set(lstm["profile"]) == {"rk3588", "horizon-x3"}
    assert "unsupported-op" in set(lstm[lstm["profile"] == "horizon-x3"]["rule"])
    assert set(f[f["node"].str.startswith("If_0/")]["op_type"]) >= {"LSTM", "Conv"}


@pytest.mark.real
def test_silero_behind_an_if_names_the_flag_that_closes_the_loop(assets: Path) -> None:
    """The asset is silero-vad's OpenVINO 16 kHz graph (static shapes, no If); wrapped in the wheel's
    If on sr, check names `--freeze-input sr=16000` alone, and that rewrite leaves no If to check."""
    model = if_wrapped(onnx.load(assets / "models" / "silero_vad_openvino_16k.onnx"))
    assert check(model, ["rk3588"]).fold_flags == ["--freeze-input sr=16000"]
    report = rewrite(model, [], freeze_input=["sr=16000"], write=False)
    assert report.passed and _ifs(report.model.graph) == 0
    after = check(report.model, ["rk3588"])
    assert not after.fold_flags and "control-flow" not in set(after.findings["rule"])


@pytest.mark.real
def test_loop_body_nodes_are_named_under_the_loop(assets: Path) -> None:
    f = check(assets / "ops" / "loop11" / "model.onnx", ["horizon-x3"]).findings
    inner = f[f["node"].str.startswith("Loop_0/body/")]
    assert not inner.empty and {"Slice", "Unsqueeze"} & set(inner["op_type"])
