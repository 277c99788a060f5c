"""Sensitive-op flags from measurement: `sensitive_op` keeps the contract's op-type meaning, but only
measured figures make a site "intrinsic" (and, with a profile, rank it in the tier above the rest).

Issue 10: a Softmax at 64 dB isolated SQNR was labelled "intrinsic, int8-sensitive op" and ranked above
a 27 dB Gemm. Here, a hand-built graph with a Softmax that quantizes well beside a Gemm that quantizes
worse; and a Softmax whose input range is wrecked by an outlier, which measures badly and keeps the label.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pandas as pd
import pytest

import quantscan
from quantscan.api import save_scan
from quantscan.scanning.tables import classify

GRAPH = """<ir_version: 8, opset_import: ["" : 13]>
g (float[N,16] x, float[N,8] s) => (float[N,16] y, float[N,8] p) {
    y = Gemm (x, w, b)
    p = Softmax <axis = -1> (s)
}"""


def write_case(tmp_path: Path, softmax_outlier: float = 0.0) -> tuple[Path, Path]:
    """The two-branch model and 16 one-sample calibration files. x has a rare 100 (the Gemm's input
    scale is set by it); s is a peaked logit vector (+8 on position 0), or, with a `softmax_outlier`, flat
    logits plus that outlier once (which sets the Softmax input's scale)."""
    rng = np.random.default_rng(0)
    model = onnx.parser.parse_model(GRAPH)
    model.graph.initializer.extend([
        onnx.numpy_helper.from_array(rng.normal(0, 0.25, (16, 16)).astype(np.float32), "w"),
        onnx.numpy_helper.from_array(np.zeros(16, np.float32), "b"),
    ])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(16):
        s = rng.normal(0, 1, (1, 8)).astype(np.float32)
        s[0, 0] += 0.0 if softmax_outlier else 8.0
        x = rng.normal(0, 1, (1, 16)).astype(np.float32)
        if i % 4 == 0:
            x[0, i] = 100.0
        if i == 3:
            s[0, 5] = softmax_outlier or s[0, 5]
        np.savez(calib / f"{i:03d}.npz", x=x, s=s)
    return path, calib


def rows(layers: pd.DataFrame) -> tuple[dict[str, object], dict[str, object]]:
    by_op = {r["op_type"]: r for r in layers.to_dict("records")}
    return by_op["Gemm"], by_op["Softmax"]


@pytest.mark.parametrize(("profile", "gain"), [(None, 0), ("ethos-u", 0), (None, 16)],
                         ids=["no profile", "profile tiers", "gain measured"])
def test_a_well_quantized_softmax_is_not_intrinsic_nor_ranked_above_a_worse_gemm(
    tmp_path: Path, profile: str | None, gain: int
) -> None:
    model, calib = write_case(tmp_path)
    result = quantscan.scan(model, calib, profile=profile, gain_candidates=gain)
    gemm, soft = rows(result.layers)
    assert soft["sensitive_op"] and not gemm["sensitive_op"]  # the contract's op-type column is unchanged
    assert float(soft["isolated_sqnr_db"]) > 45 > float(gemm["isolated_sqnr_db"])  # type: ignore[arg-type]
    assert soft["cause"] != "intrinsic" and "sensitive" not in str(soft["reason"])
    assert int(gemm["rank"]) < int(soft["rank"])  # type: ignore[call-overload]
    if profile is not None:
        assert soft["placement"] == "npu"


def test_a_softmax_the_profile_runs_in_float16_is_not_an_int8_site(tmp_path: Path) -> None:
    """rk3588 runs Softmax in float16 (rknn-toolkit2 2.5.0's recorded run): scan keeps it float, so the
    Softmax branch (fed by a graph input, nothing else quantized) matches FP32, where the same scan
    without the profile quantizes its output to 1/255 steps; run.json and summary.md name the node."""
    model, calib = write_case(tmp_path)
    plain = quantscan.scan(model, calib, gain_candidates=0)
    chip = quantscan.scan(model, calib, profile="rk3588", gain_candidates=0)
    assert "Softmax" in set(plain.layers["op_type"]) and "Softmax" not in set(chip.layers["op_type"])
    (softmax,) = plain.layers.loc[plain.layers["op_type"] == "Softmax", "node"]
    assert chip.run_info.options["float16_nodes"] == [softmax]
    after, before = chip.output_metrics["p"].cosine, plain.output_metrics["p"].cosine
    assert after == pytest.approx(1.0, abs=1e-7) and before < after
    out = tmp_path / "run"
    save_scan(chip, out)
    assert f"`{softmax}` kept float, not int8 sites" in (out / "summary.md").read_text(encoding="utf-8")


def test_a_softmax_that_measures_badly_is_intrinsic_and_named_sensitive(tmp_path: Path) -> None:
    model, calib = write_case(tmp_path, softmax_outlier=400.0)
    _, soft = rows(quantscan.scan(model, calib, gain_candidates=0).layers)
    assert float(soft["isolated_sqnr_db"]) < 25  # type: ignore[arg-type]
    assert soft["cause"] == "intrinsic"
    assert "isolated SQNR" in str(soft["reason"]) and "int8-sensitive op" in str(soft["reason"])


def _row(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "op_type": "Softmax", "kernel": "Softmax", "isolated_sqnr_db": 64.0, "act_worst_channel_sqnr_db": 40.0,
        "act_channel_range_spread": 2.0, "weight_worst_channel_sqnr_db": math.nan, "cumulative_sqnr_db": 60.0,
        "cumulative_input_sqnr_db": 60.0, "sensitive_op": True,
    }
    base.update(kw)
    return base


def test_classify_reads_figures_not_op_names() -> None:
    assert classify(_row())[0] == "ok"
    cause, reason = classify(_row(isolated_sqnr_db=18.0))
    assert cause == "intrinsic" and reason.endswith("int8-sensitive op")
    assert classify(_row(sensitive_op=False, isolated_sqnr_db=18.0)) == (
        "intrinsic", "isolated SQNR 18.0 dB: this kernel alone loses precision")


def test_near_zero_probabilities_are_not_starved_channels() -> None:
    """A Softmax's near-zero positions are small by design (its range is [0, 1]); the same per-channel
    figures on a Conv output are an outlier channel starving the others."""
    starved = {"act_worst_channel_sqnr_db": 0.5, "act_channel_range_spread": 40.0}
    assert classify(_row(**starved))[0] == "ok"
    assert classify(_row(kernel="Softmax[Exp+ReduceSum+Div]", op_type="Exp", **starved))[0] == "ok"
    cause, reason = classify(_row(op_type="Conv", kernel="Conv", sensitive_op=False, **starved))
    assert cause == "intrinsic" and "channel ranges span" in reason
