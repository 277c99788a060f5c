"""GELU as jax2tf lowers `jax.nn.gelu(x, approximate=True)` and tf2onnx writes it: one site, not Tanh/Add/Mul.

jax's definition (jax/_src/nn/functions.py): `cdf = 0.5 * (1.0 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`,
`return x * cdf`. jaxpr: integer_pow[y=3], mul 0.044715, add x, mul sqrt(2/pi), tanh, add 1.0, mul 0.5,
mul x; constants first in each multiplication, as the source writes them. jax2tf's integer_pow is
repeated multiplication (acc = x; x2 = x*x; acc = acc*x2: Mul(x, Mul(x, x))), and the constants reach the
ONNX graph as Constant nodes or initializers, scalars or rank-promoted [1, 1]. TF's grappler may fold the
constant into the first factor: magika's byte classifier (zoo entry magika_v3_3) writes 0.044715·x³ as
Mul(x, Mul(x, Mul(0.044715, x))). Each spelling here is one
GELU site; the oracle for the arithmetic is the formula written out, run by onnx's ReferenceEvaluator.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import quantscan

CONSTS = {"c_cubic": 0.044715, "c_sqrt": math.sqrt(2 / math.pi), "c_one": 1.0, "c_half": 0.5}


def _gelu_nodes(x: str, k: int, cube_order: str) -> list[onnx.NodeProto]:
    """jax2tf's node order for one GELU of `x` (names suffixed k)."""
    if cube_order == "x*(x*(c*x))":  # magika's export: grappler folded the constant into the first factor
        cubic = [helper.make_node("Mul", ["c_cubic", x], [f"sq{k}"]),
                 helper.make_node("Mul", [x, f"sq{k}"], [f"cube{k}"]),
                 helper.make_node("Mul", [x, f"cube{k}"], [f"kc{k}"])]
    else:
        cubic = [helper.make_node("Mul", [x, x], [f"sq{k}"]),
                 helper.make_node("Mul", [x, f"sq{k}"] if cube_order == "x*(x*x)" else [f"sq{k}", x], [f"cube{k}"]),
                 helper.make_node("Mul", ["c_cubic", f"cube{k}"], [f"kc{k}"])]
    return [
        *cubic,
        helper.make_node("Add", [x, f"kc{k}"], [f"u{k}"]),
        helper.make_node("Mul", ["c_sqrt", f"u{k}"], [f"s{k}"]),
        helper.make_node("Tanh", [f"s{k}"], [f"t{k}"]),
        helper.make_node("Add", ["c_one", f"t{k}"], [f"a{k}"]),
        helper.make_node("Mul", ["c_half", f"a{k}"], [f"cdf{k}"]),
        helper.make_node("Mul", [x, f"cdf{k}"], [f"g{k}"]),
    ]


def mlp(constants: str, cube_order: str, rank: int) -> onnx.ModelProto:
    """Two Dense+GELU blocks and a Dense head, as a jax2tf MLP exports."""
    rng = np.random.default_rng(0)
    shape = [1] * rank
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (16, 32)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, 32).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (32, 32)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 0.1, 32).astype(np.float32), "b2"),
             numpy_helper.from_array(rng.normal(0, 0.3, (32, 10)).astype(np.float32), "w3")]
    nodes: list[onnx.NodeProto] = []
    for name, value in CONSTS.items():
        array = np.full(shape, value, np.float32)
        if constants == "Constant":
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name)))
        else:
            inits.append(numpy_helper.from_array(array, name))
    nodes += [helper.make_node("MatMul", ["x", "w1"], ["d1"]), helper.make_node("Add", ["d1", "b1"], ["h1"]),
              *_gelu_nodes("h1", 1, cube_order),
              helper.make_node("MatMul", ["g1", "w2"], ["d2"]), helper.make_node("Add", ["d2", "b2"], ["h2"]),
              *_gelu_nodes("h2", 2, cube_order),
              helper.make_node("MatMul", ["g2", "w3"], ["logits"])]
    graph = helper.make_graph(nodes, "jax2tf_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("cube_order", ["x*(x*x)", "x*(x*(c*x))"])
def test_the_graph_computes_jax_gelu(cube_order: str) -> None:
    """The hand-written jax2tf spelling is the tanh GELU (so the site test below is about the real thing)."""
    model = mlp("Constant", cube_order, 0)
    x = np.random.default_rng(1).normal(size=(4, 16)).astype(np.float32)
    h1, g1 = ReferenceEvaluator(model).run(["h1", "g1"], {"x": x})
    h = h1.astype(np.float64)
    want = h * 0.5 * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    np.testing.assert_allclose(g1, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("constants", ["Constant", "initializer"])
@pytest.mark.parametrize("cube_order", ["x*(x*x)", "(x*x)*x", "x*(x*(c*x))"])
@pytest.mark.parametrize("rank", [0, 2])
def test_jax2tf_gelu_is_one_site(tmp_path: Path, constants: str, cube_order: str, rank: int) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(constants, cube_order, rank), path)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(2).normal(size=(8, 16)).astype(np.float32))
    result = quantscan.scan(path, calib, gain_candidates=0, no_report=True, quiet=True)
    kernels = [s.kernel for s in result.sites]
    assert sum(k.startswith("GELU[") for k in kernels) == 2, kernels
    assert not any(k.startswith(("Tanh", "Add", "Mul")) for k in kernels), kernels
    inner = {f"{t}{k}" for t in ("sq", "cube", "kc", "u", "s", "t", "a", "cdf") for k in (1, 2)}
    quantized = {n.input[0] for n in result.qdq_model.graph.node if n.op_type == "QuantizeLinear"}
    assert not {q.removesuffix("__f32") for q in quantized} & inner  # no QDQ pair inside a GELU


def test_a_near_miss_stays_separate_sites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: with 0.04 for 0.044715 the arithmetic is not GELU, and the Tanh is a site."""
    monkeypatch.setitem(CONSTS, "c_cubic", 0.04)
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp("Constant", "x*(x*x)", 0), path)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(2).normal(size=(8, 16)).astype(np.float32))
    kernels = [s.kernel for s in quantscan.scan(path, calib, gain_candidates=0, no_report=True, quiet=True).sites]
    assert not any(k.startswith("GELU[") for k in kernels) and "Tanh" in kernels
