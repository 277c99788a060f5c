"""Every shipped profile's facts hold together: op names are real ONNX ops, no op is in two lists, fused
activations run on the NPU, and an op a profile lists is never reported as missing from it."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from quantscan.compat import list_profiles, load_profile
from quantscan.compat.check import check

PROFILES = [p.name for p in list_profiles()]


def _is_onnx_op(op: str) -> bool:
    return onnx.defs.has(op) or onnx.defs.has(op, "ai.onnx.ml")


@pytest.mark.parametrize("name", PROFILES)
def test_listed_ops_are_onnx_ops_in_one_list(name: str) -> None:
    p = load_profile(name)
    lists = {"npu": p.npu_ops, "cpu": p.cpu_ops, "folded": p.folded_ops}
    unknown = sorted(op for ops in lists.values() for op in ops if not _is_onnx_op(op))
    assert not unknown, f"{name}: not ONNX ops: {unknown}"
    for a in lists:
        for b in lists:
            if a < b:
                assert not lists[a] & lists[b], f"{name}: in both {a} and {b}: {sorted(lists[a] & lists[b])}"


@pytest.mark.parametrize("name", PROFILES)
def test_fused_activations_run_on_the_npu(name: str) -> None:
    p = load_profile(name)
    unknown = sorted(op for op in p.fused_activations if not _is_onnx_op(op))
    assert not unknown, f"{name}: fused activations that are not ONNX ops: {unknown}"
    assert p.fused_activations <= p.npu_ops, sorted(p.fused_activations - p.npu_ops)


@pytest.mark.parametrize("name", PROFILES)
def test_a_listed_op_is_never_reported_as_unlisted(name: str) -> None:
    """One Relu -> OP -> Relu graph per listed single-input op: the unsupported-op rule may say the op
    runs on the CPU (cpu list), never that the profile does not list it."""
    p = load_profile(name)
    unary = [op for op in sorted(p.npu_ops | p.cpu_ops | p.folded_ops) if _unary(op)]
    nodes = []
    previous = "x"
    for k, op in enumerate(unary):
        nodes.append(helper.make_node(op, [previous], [f"t{k}"], name=f"n{k}_{op}"))
        previous = f"t{k}"
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info(previous, onnx.TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert len(unary) >= 3
    unlisted = [f.op_type for f in check(model, [name]).records if "supported op list" in f.reason]
    assert not unlisted, unlisted


UNARY = frozenset({"Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor",
                   "Ceil", "Erf", "Softplus", "Softsign", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu",
                   "Selu", "Identity", "Softmax", "LogSoftmax", "Sin", "Cos", "Not", "Sign", "Round",
                   "Mish", "Gelu", "ThresholdedRelu", "Celu", "Flatten", "Dropout"})


def _unary(op: str) -> bool:
    return op in UNARY and op != "Not"


def test_a_reshape_the_profile_folds_is_not_a_cpu_finding() -> None:
    """horizon-x3 lists Reshape as folded: to a constant shape it is removed (no finding, on the NPU
    island); to a shape computed from data at run time it is still reported."""
    const = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 13]>
    g (float[1,4,8,8] x) => (float[1,256] y) {
        shape = Constant <value = int64[2] {1, 256}> ()
        r = Relu (x)
        y = Reshape (r, shape)
    }""")
    result = check(const, ["horizon-x3"])
    assert not [f for f in result.records if f.op_type == "Reshape"]
    assert result.node_placement["horizon-x3"]["Reshape_2"] == "npu"
    dynamic = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 13]>
    g (float[1,4,8,8] x, int64[2] shape) => (float[1,256] y) {
        r = Relu (x)
        y = Reshape (r, shape)
    }""")
    assert [f.rule for f in check(dynamic, ["horizon-x3"]).records if f.op_type == "Reshape"] == ["unsupported-op"]
