"""Shared builders of the bisect tests: the MatMul chain model, and a synthetic metric driver.

Not a test module (no `test_` prefix): test files import from here, never from each other.
The chain is a MatMul+Add+Relu chain with one outlier channel (a per-tensor scale then crushes
the others), so sites differ clearly in how much keeping them float helps.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscan.bisect import Bisector, Step

SITES = [f"s{i}" for i in range(16)]


def run(machine: Bisector, value: Callable[[frozenset[str]], float]) -> list[Step]:
    """Drive the machine to the end with a synthetic metric of the float set."""
    steps = []
    while (cand := machine.next()) is not None:
        steps.append(machine.record(value(frozenset(cand.sites))))
    return steps


def additive(weights: dict[str, float], base: float = 0.9) -> Callable[[frozenset[str]], float]:
    return lambda s: base + sum(weights.get(n, 0.0) for n in s)


WIDTH = 16


def chain_model(layers: int = 10, seed: int = 0, outlier: int = 2) -> onnx.ModelProto:
    """x[N,16] -> (MatMul, Add bias, Relu) x layers -> MatMul -> y[N,10] (scores)."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev = "x"
    for i in range(layers):
        w = rng.normal(0, 1.5 / np.sqrt(WIDTH), (WIDTH, WIDTH)).astype(np.float32)
        b = rng.normal(0, 0.1, WIDTH).astype(np.float32)
        if i == outlier:
            b[0] = 30.0  # one channel far from the others: per-tensor int8 loses the small ones
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"], name=f"mm{i}"),
            helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"add{i}"], name=f"add{i}"),
            helper.make_node("Relu", [f"add{i}"], [f"h{i}"], name=f"relu{i}"),
        ]
        prev = f"h{i}"
    head = rng.normal(0, 1 / np.sqrt(WIDTH), (WIDTH, 10)).astype(np.float32)
    inits.append(numpy_helper.from_array(head, "whead"))
    nodes.append(helper.make_node("MatMul", [prev, "whead"], ["y"], name="head"))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def write_chain(tmp: Path, samples: int = 32, **kwargs: int) -> tuple[Path, Path]:
    """The chain model file and a calibration folder of `samples` rows for input x."""
    model_path = tmp / "chain.onnx"
    onnx.save(chain_model(**kwargs), model_path)
    calib = tmp / "calib"
    calib.mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    np.save(calib / "x.npy", rng.normal(0, 1, (samples, WIDTH)).astype(np.float32))
    return model_path, calib
