"""inherited: a clean site downstream of a bad one names the upstream site by measured gain.

Rule level: hand-built facts (fires / stays silent). Scan level: a Conv chain written in ONNX text
whose first Conv has a weight outlier on an input channel that is always zero (harmless in float,
but its per-channel int8 scale rounds every other weight of that Conv away); the second Conv is
clean on its own (fed FP32 inputs) and inherits the damage. The oracle for "which upstream site":
the gain of keeping each upstream site float, measured by running each variant as a whole model
(gain.Evaluator), not the scan's branches.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from diag_facts import facts

import quantscan
from builders import build
from quantscan.diagnose import Cause, FixKind, inherited
from quantscan.scanning.gain import Evaluator, mixed_builder
from quantscan.scanning.prepare import prepare_scan

FIGURES = {"isolated_sqnr_db": 38.0, "cumulative_sqnr_db": 9.0}


def test_clean_site_with_bad_input_names_the_upstream_site_with_the_largest_gain() -> None:
    f = inherited.check(facts(figures=FIGURES, upstream_gains={"conv_a": 0.002, "conv_b": 0.31, "relu": float("nan")}))
    assert f is not None and f.cause is Cause.INHERITED
    assert f.fix.kind is FixKind.KEEP_FLOAT and f.fix.value == "conv_b" and "conv_b" in f.fix.how
    assert f.evidence == {"isolated_sqnr_db": 38.0, "cumulative_sqnr_db": 9.0, "upstream_gain": 0.31}
    assert "2 measured upstream" in f.reason


def test_silent_when_the_site_is_bad_itself_or_nothing_upstream_helps() -> None:
    gains = {"conv_a": 0.3}
    assert inherited.check(facts(figures={"isolated_sqnr_db": 15.0, "cumulative_sqnr_db": 9.0},
                                 upstream_gains=gains)) is None  # its own error: intrinsic, not inherited
    assert inherited.check(facts(figures={"isolated_sqnr_db": 45.0, "cumulative_sqnr_db": 30.0},
                                 upstream_gains=gains)) is None  # cumulative error is not large
    assert inherited.check(facts(figures=FIGURES)) is None  # no gain measured yet
    assert inherited.check(facts(figures=FIGURES, upstream_gains={"conv_a": 2e-5})) is None  # noise
    own = {**FIGURES, "gain_if_float": 0.5}
    assert inherited.check(facts(figures=own, upstream_gains=gains)) is None  # keeping it float helps more


CHAIN = """
<ir_version: 8, opset_import: ["" : 13]>
chain (float[N,4,8,8] x) => (float[N,8,8,8] y) {
    c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    r1 = Relu (c1)
    c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2, b2)
    r2 = Relu (c2)
    y = Conv <pads = [1, 1, 1, 1]> (r2, w3, b3)
}
"""


def _chain(tmp: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)
    w1[:, 0] = 40.0  # input channel 0 is always 0: no effect in float, a huge per-channel int8 scale
    inits = {"w1": w1, "b1": rng.normal(0, 0.1, 8).astype(np.float32),
             "w2": rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32), "b2": rng.normal(0, 0.1, 8).astype(np.float32),
             "w3": rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32), "b3": rng.normal(0, 0.1, 8).astype(np.float32)}
    model = build(CHAIN, inits)
    for node in model.graph.node:
        node.name = node.output[0]
    path = tmp / "chain.onnx"
    onnx.save(model, path)
    calib = tmp / "calib"
    calib.mkdir()
    x = rng.normal(0, 1, (16, 4, 8, 8)).astype(np.float32)
    x[:, 0] = 0.0
    np.save(calib / "x.npy", x)
    return path, calib


def test_scan_names_the_bad_upstream_conv_as_the_cause(tmp_path: Path) -> None:
    model, calib = _chain(tmp_path)
    result = quantscan.scan(model, calib, threads=1, gain_samples=0)
    rows = result.layers.set_index("node")
    ctx = prepare_scan(model, calib, threads=1)
    builder = mixed_builder(ctx)
    evaluator = Evaluator(ctx, builder, "cosine")
    base = evaluator.evaluate(builder.precisions([])).worst["cosine"]
    oracle = {n: evaluator.evaluate(builder.precisions([n])).worst["cosine"] - base for n in ("c1",)}
    assert oracle["c1"] > 0.01  # keeping the bad Conv float really helps the output
    assert abs(rows.loc["c1", "gain_if_float"] - oracle["c1"]) < 1e-6  # and that is what the rule read
    assert rows.loc["c2", "isolated_sqnr_db"] - rows.loc["c2", "cumulative_sqnr_db"] >= inherited.GAP_DB
    assert rows.loc["c2", "diagnosis_cause"] == Cause.INHERITED.value
    assert rows.loc["c2", "diagnosis_fix"] == "keep-float c1"
    assert "`c1`" in rows.loc["c2", "reason"]
    assert rows.loc["c1", "diagnosis_cause"] != Cause.INHERITED.value  # the culprit's own finding stays
