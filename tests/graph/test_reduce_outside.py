"""The clip count behind its guard (graph/reduce.Reducer.outside), against numpy's count written out.

What a user relies on: `eval_clip_fraction` counts the evaluation values outside a site's range, the
same whether or not the guard (min/max of the batch) lets the counting chain run; NaN is never counted
and never hides a clipped value beside it.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from quantscan.graph.reduce import Reducer

LO, HI = -1.0, 2.0


def _counts(x: np.ndarray, opset: int) -> tuple[float, float]:
    reducer = Reducer(opset)
    graph = helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))], [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    count, size = reducer.outside("x", LO, HI, x.ndim)
    session = ort.InferenceSession(reducer.attach(model, [count, size]).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = session.run([count, size], {"x": x})
    return float(got[0]), float(got[1])


def _numpy_count(x: np.ndarray) -> float:
    with np.errstate(invalid="ignore"):
        return float(np.sum((x < LO) | (x > HI)))


@pytest.mark.parametrize("opset", [11, 17])  # analysis graphs keep an opset-11 model's opset (onnxruntime recipe)
@pytest.mark.parametrize("case", ["inside", "edges", "outside", "nan_beside_clipped", "inf"])
def test_the_guarded_clip_count_is_numpys(case: str, opset: int) -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(LO, HI, (2, 3, 4, 5)).astype(np.float32)
    if case == "edges":
        x.flat[:2] = [LO, HI]  # the range's own ends are inside
    if case == "outside":
        x.flat[::7] *= 3.0
    if case == "nan_beside_clipped":
        x.flat[0], x.flat[5] = np.nan, HI + 1.0
    if case == "inf":
        x.flat[3], x.flat[4] = np.inf, -np.inf
    count, size = _counts(x, opset)
    assert size == x.size
    assert count == _numpy_count(x)
    assert (count > 0) == (case in ("outside", "nan_beside_clipped", "inf"))
