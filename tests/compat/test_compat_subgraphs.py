"""check walks If/Loop/Scan bodies: findings inside a body are named by path and placed with their owner."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from builders import if_wrapped
from quantscan.compat.check import check
from quantscan.graph.subgraphs import bodies, body_model, outer_reads, scope_of

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


def test_if_on_a_setting_input_suggests_freeze_input_without_a_number() -> None:
    f = check(lstm_in_if(), ["rk3588"]).records
    (finding,) = [x for x in f if x.rule == "control-flow"]
    assert finding.rewrite is not None and finding.rewrite.value == "freeze-input"
    assert finding.rewrite_args == ("sr",)
    assert "--freeze-input sr=VALUE" in finding.fix and "16000" not in finding.fix


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
def test_loop_body_nodes_are_named_under_the_loop(assets: Path) -> None:
    f = check(assets / "ops" / "loop11" / "model.onnx", ["horizon-x3"]).findings
    inner = f[f["node"].str.startswith("Loop_0/body/")]
    assert not inner.empty and {"Slice", "Unsqueeze"} & set(inner["op_type"])
