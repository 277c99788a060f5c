"""Every cause rule on a hand-built graph run through `quantscan.scan`: it fires on the right site with
its fix, and stays silent on a near-identical graph (one constant, the data, or one option changed).

The rule tests beside this file feed hand-written SiteFacts; these check the whole path a user relies
on: the scan measures the facts, the rule reads them, and layers.csv names the cause and the fix at the
site that has the problem. Gain measurement is off (`gain_candidates=0`): it only changes the rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.parser
import pandas as pd
import pytest

import quantscan
from builders import FLOAT_MIN, attention_model

RNG = np.random.default_rng(0)
X = RNG.normal(0, 1, (32, 16)).astype(np.float32)
W = RNG.normal(0, 0.25, (16, 16)).astype(np.float32)
HEAVY_TAILS = np.random.default_rng(3).laplace(0, 1, (64, 16)).astype(np.float32)
"""Laplace data in every channel: an entropy (KL) range cuts the tails of all of them."""


def graph(body: str, **inits: np.ndarray) -> onnx.ModelProto:
    """x[N,16] -> `body` -> y[N,16], opset 13, nodes named `<op>_<position>` (MatMul_0 is the first)."""
    model = onnx.parser.parse_model(
        f"""<ir_version: 8, opset_import: ["" : 13]>
        g (float[N,16] x) => (float[N,16] y) {{ {body} }}"""
    )
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in inits.items())
    for i, node in enumerate(model.graph.node):
        node.name = f"{node.op_type}_{i}"
    return model


def masked_attention(value: float) -> onnx.ModelProto:
    """builders.attention_model with its masked key positions set to `value` (float-min as exported)."""
    model = attention_model()
    init = next(t for t in model.graph.initializer if t.name == "mask")
    mask = onnx.numpy_helper.to_array(init).copy()
    mask[mask < 0] = value
    init.CopyFrom(onnx.numpy_helper.from_array(mask, "mask"))
    return model


def with_column(w: np.ndarray, scale: float) -> np.ndarray:
    out = w.copy()
    out[:, 0] *= scale
    return out


def biased(first_half: float) -> np.ndarray:
    b = np.zeros(16, np.float32)
    b[:8] = first_half
    return b


def offset(channel0: float) -> np.ndarray:
    c = np.zeros(16, np.float32)
    c[0] = channel0
    return c


@dataclass(frozen=True)
class Case:
    """One rule's pair of scans: `model(firing)` with `data`; `node` is where it must fire."""

    model: Callable[[bool], onnx.ModelProto]
    node: str
    fix: str
    data: Callable[[], dict[str, np.ndarray]] = field(default=lambda: {"x": X})
    options: Callable[[bool], dict[str, Any]] = field(default=lambda firing: {})


ATTENTION_X = np.random.default_rng(1).normal(size=(8, 8, 16)).astype(np.float32)
MATMUL_RELU = "h = MatMul (x, w)\n y = Relu (h)"

CASES: dict[str, Case] = {
    # a float-min mask before a Softmax: 3.4e38 sets the scale (-30 is an ordinary mask value)
    "absurd-scale": Case(lambda firing: masked_attention(FLOAT_MIN if firing else -30.0), "mask_add",
                         "rewrite clamp-mask", data=lambda: {"x": ATTENTION_X}),
    # values near 1e20 (finite, no outlier: every value is that large) overflow float32 error sums; 1e10 not
    "nonfinite-figures": Case(lambda firing: graph("h = MatMul (x, w)\n y = Mul (h, k)", w=W, k=np.array(
        1e20 if firing else 1e10, np.float32)), "MatMul_0", "keep-float MatMul_0"),
    # one output channel 100x the others (its weight column scaled) vs none
    "outlier-channels": Case(lambda firing: graph("y = MatMul (x, w)", w=with_column(W, 100.0 if firing else 1.0)),
                             "MatMul_0", "int16"),
    # an Add joining a branch 40x wider than the other vs 4x
    "range-mismatch": Case(lambda firing: graph("a = MatMul (x, w)\n b = MatMul (x, w2)\n y = Add (a, b)", w=W,
                                                w2=W[::-1] * (40.0 if firing else 4.0)), "Add_2", "int16"),
    # heavy-tailed data: an entropy range clips every channel's peaks, minmax does not
    "saturated-channels": Case(lambda firing: graph("y = MatMul (x, w)", w=np.eye(16, dtype=np.float32)), "MatMul_0",
                               "calibration minmax", data=lambda: {"x": HEAVY_TAILS},
                               options=lambda firing: {"calib_method": "entropy" if firing else "minmax"}),
    # ReLU output (one-sided) in symmetric int8 wastes half the codes; uint8 does not
    "code-waste": Case(lambda firing: graph(MATMUL_RELU, w=W), "MatMul_0", "scheme asymmetric",
                       options=lambda firing: {"activations": "int8" if firing else "uint8"}),
    # half the channels biased to -100 before the ReLU never fire vs bias 0
    "dead-channels": Case(lambda firing: graph("h = MatMul (x, w)\n hb = Add (h, b)\n y = Relu (hb)", w=W,
                                               b=biased(-100.0 if firing else 0.0)), "MatMul_0", "calibration data"),
}

CASES["outlier-channels, smoothable"] = Case(
    # the same outlier read only by a MatMul: `smooth` can move it into that MatMul's weights
    lambda firing: graph("h = MatMul (x, w)\n y = MatMul (h, w2)", w=with_column(W, 100.0 if firing else 1.0), w2=W),
    "MatMul_0", "rewrite smooth",
)
CASES["outlier-channels, equalizable"] = Case(
    # through a Relu (not an affine smoothing folds into), a MatMul pair `equalize` rescales
    lambda firing: graph("h = MatMul (x, w)\n r = Relu (h)\n y = MatMul (r, w2)",
                         w=with_column(W, 100.0 if firing else 1.0), w2=W),
    "MatMul_0", "rewrite equalize",
)
CASES["absurd-scale, outlier constant"] = Case(
    # a constant channel at 1e6 beside data of magnitude ~2: not a sentinel, so the fix is a calibration
    # that ignores the tail (1e2 is a large but sane offset)
    lambda firing: graph("h = MatMul (x, w)\n y = Add (h, c)", w=W, c=offset(1e6 if firing else 1e2)),
    "MatMul_0", "calibration percentile",
)


def scan(tmp_path: Path, case: Case, firing: bool) -> pd.DataFrame:
    folder = tmp_path / ("fires" if firing else "silent")
    calib = folder / "calib"
    calib.mkdir(parents=True)
    model = case.model(firing)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, folder / "m.onnx")
    data = case.data()
    for i in range(len(next(iter(data.values())))):
        np.savez(calib / f"{i:03d}.npz", **{k: v[i : i + 1] for k, v in data.items()})
    result = quantscan.scan(folder / "m.onnx", calib, gain_candidates=0, **case.options(firing))
    return result.layers


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_fires_on_its_site_with_its_fix_and_is_silent_on_the_near_miss(tmp_path: Path, name: str) -> None:
    case, cause = CASES[name], name.split(",")[0]
    fired = scan(tmp_path, case, firing=True).set_index("node")
    row = fired.loc[case.node]
    assert row["diagnosis_cause"] == cause, row["diagnosis"]
    assert row["diagnosis_fix"] == case.fix, row["diagnosis"]
    others = fired.drop(index=case.node)["diagnosis"].fillna("")
    assert not others.str.contains(cause).any(), "fired on a site that does not have the problem"

    silent = scan(tmp_path, case, firing=False)
    assert not silent["diagnosis"].fillna("").str.contains(cause).any(), silent["diagnosis"].tolist()
