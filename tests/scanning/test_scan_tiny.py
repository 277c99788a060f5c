"""The scan on tiny hand-written models, checked against independent oracles.

Oracles: onnx's ReferenceEvaluator running the saved QDQ model (not onnxruntime), and numpy
re-implementations of one site's fake quantization written out here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx.version_converter
import pytest
from onnx.reference import ReferenceEvaluator

import quantscan
from quantscan import quant
from quantscan.runner import Runner
from quantscan.scanning.prepare import prepare_scan


def _save(tmp_path: Path, text: str, inits: dict[str, np.ndarray], name: str = "m.onnx") -> Path:
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in inits.items())
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _reference(path: Path) -> ReferenceEvaluator:
    """onnx's reference evaluator implements QuantizeLinear/DequantizeLinear from opset 19 only."""
    return ReferenceEvaluator(onnx.version_converter.convert_version(onnx.load(path), 21))


def _calib(tmp_path: Path, name: str, arrays: list[np.ndarray]) -> Path:
    folder = tmp_path / "calib"
    folder.mkdir()
    for i, a in enumerate(arrays):
        np.savez(folder / f"{i:03d}.npz", **{name: a})
    return folder


CONV_BN_RELU = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y) {
  c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
  n = BatchNormalization (c, gamma, beta, mean, var)
  y = Relu (n)
}
"""


def _conv_bn_relu(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, Path]:
    inits = {
        "w": rng.normal(size=(4, 3, 3, 3)).astype(np.float32),
        "b": rng.normal(size=4).astype(np.float32),
        "gamma": rng.uniform(0.5, 2, 4).astype(np.float32),
        "beta": rng.normal(size=4).astype(np.float32),
        "mean": rng.normal(size=4).astype(np.float32),
        "var": rng.uniform(0.5, 2, 4).astype(np.float32),
    }
    model = _save(tmp_path, CONV_BN_RELU, inits)
    calib = _calib(tmp_path, "x", [rng.normal(size=(1, 3, 8, 8)).astype(np.float32) for _ in range(6)])
    return model, calib


def test_conv_bn_relu_is_one_site_with_bn_folded(tmp_path: Path) -> None:
    model, calib = _conv_bn_relu(tmp_path, np.random.default_rng(0))
    result = quantscan.scan(model, calib)
    assert [s.node for s in result.sites if s.is_input] == ["x"]  # the model input is a site of its own
    kernels = [s for s in result.sites if not s.is_input]
    assert len(kernels) == 1
    site = kernels[0]
    assert site.kernel == "Conv+BatchNormalization+Relu"
    assert site.output == "y"
    ops = [n.op_type for n in result.qdq_model.graph.node]
    # no QDQ between Conv and BN or Conv and Relu: BN is gone, Relu reads Conv directly
    assert "BatchNormalization" not in ops
    conv = next(n for n in result.qdq_model.graph.node if n.op_type == "Conv")
    relu = next(n for n in result.qdq_model.graph.node if n.op_type == "Relu")
    assert relu.input[0] == conv.output[0]
    assert ops.count("QuantizeLinear") == 2  # input x and output y


def test_reported_output_metric_matches_reference_evaluator_on_saved_qdq(tmp_path: Path) -> None:
    """The headline cosine/SQNR equals what onnx's reference evaluator computes on --save-qdq."""
    rng = np.random.default_rng(1)
    model, calib = _conv_bn_relu(tmp_path, rng)
    qdq_path = tmp_path / "qdq.onnx"
    result = quantscan.scan(model, calib, save_qdq=qdq_path)
    fp32 = _reference(model)  # opset 21: the evaluator's opset-9..14 BN kernel mishandles inference mode
    fq = _reference(qdq_path)
    xs, ys = [], []
    for f in sorted(calib.glob("*.npz")):
        feed = dict(np.load(f))
        xs.append(fp32.run(None, feed)[0].astype(np.float64))
        ys.append(fq.run(None, feed)[0].astype(np.float64))
    x, y = np.concatenate(xs), np.concatenate(ys)
    cosine = float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))
    sqnr = float(10 * np.log10((x * x).sum() / ((x - y) ** 2).sum()))
    head = result.output_metrics["y"]
    assert head.cosine == pytest.approx(cosine, abs=1e-5)
    assert head.sqnr_db == pytest.approx(sqnr, abs=0.05)


def test_isolated_error_matches_numpy_fake_quant_of_one_site(tmp_path: Path) -> None:
    """Conv(+bias)+Relu with a DequantizeLinear input: the figure a numpy oracle computes.

    Guards against onnxruntime transformers that re-quantize float weights behind our back.
    """
    rng = np.random.default_rng(2)
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 6, 5] x) => (float[1, 8, 5] y) {
      a = Relu (x)
      c = Conv <pads = [1, 1]> (a, w, b)
      y = Relu (c)
    }
    """
    w = rng.normal(size=(8, 6, 3)).astype(np.float32)
    b = rng.normal(size=8).astype(np.float32)
    model = _save(tmp_path, text, {"w": w, "b": b})
    data = [rng.normal(size=(1, 6, 5)).astype(np.float32) for _ in range(5)]
    calib = _calib(tmp_path, "x", data)
    ctx = prepare_scan(model, calib)
    result = quantscan.scan(model, calib)
    conv_site = next(s for s in result.sites if s.op_type == "Conv")
    qp_in, qp_out = ctx.quant.plan.activations[conv_site.inputs[0]], ctx.quant.plan.activations["y"]
    wq = quant.weight_qparams(w, 0)
    bias_q, bias_scale, _ = quant.quantize_bias(b, float(qp_in.scale), wq.scale)
    conv = ReferenceEvaluator(onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 6, 5] a, float[8, 6, 3] w, float[8] b) => (float[1, 8, 5] c) {
      c = Conv <pads = [1, 1]> (a, w, b)
    }
    """))
    sxx = sdd = 0.0
    for x in data:
        a = np.maximum(x, 0)
        ref = np.maximum(conv.run(None, {"a": a, "w": w, "b": b})[0], 0)
        got = conv.run(None, {"a": quant.fake_quant(a, qp_in), "w": quant.fake_quant(w, wq),
                              "b": (bias_q.astype(np.float32) * bias_scale)})[0]
        got = quant.fake_quant(np.maximum(got, 0), qp_out)
        sxx += float((ref.astype(np.float64) ** 2).sum())
        sdd += float(((ref - got).astype(np.float64) ** 2).sum())
    oracle = 10 * np.log10(sxx / sdd)
    row = result.layers.set_index("node").loc[conv_site.node]
    assert row["isolated_sqnr_db"] == pytest.approx(oracle, abs=0.05)


def test_session_and_run_counts_do_not_grow_with_sites(tmp_path: Path) -> None:
    """All isolated errors come from a constant number of passes: 3 vs 13 sites, same counts."""
    rng = np.random.default_rng(3)

    def chain(n: int) -> Path:
        body = "\n".join(f"  h{i + 1} = Relu (c{i})\n  c{i + 1} = Conv (h{i + 1}, w{i})" for i in range(n))
        text = f"""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[1, 4, 6, 6] c0) => (float[1, 4, 6, 6] c{n}) {{
        {body}
        }}
        """
        inits = {f"w{i}": rng.normal(size=(4, 4, 1, 1)).astype(np.float32) for i in range(n)}
        return _save(tmp_path, text, inits, name=f"chain{n}.onnx")

    data = [rng.normal(size=(1, 4, 6, 6)).astype(np.float32) for _ in range(4)]
    folder = tmp_path / "calib"
    folder.mkdir()
    for i, a in enumerate(data):
        np.savez(folder / f"{i}.npz", c0=a)
    counts = []
    for n in (2, 12):
        runner = Runner()
        result = quantscan.scan(chain(n), folder, runner=runner, batch_size=1)
        assert len(result.sites) == n + 2  # input c0, the first Relu, then Conv+Relu kernels, the last Conv alone
        counts.append((runner.stats.sessions_created, runner.stats.runs))
    assert counts[0] == counts[1]


def test_zero_weight_channel_and_dead_activation_are_warnings_not_crashes(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    w = rng.normal(size=(4, 3, 1, 1)).astype(np.float32)
    w[2] = 0.0
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 3, 4, 4] x) => (float[1, 4, 4, 4] y) {
      y = Conv (x, w)
    }
    """
    model = _save(tmp_path, text, {"w": w})
    calib = _calib(tmp_path, "x", [rng.normal(size=(1, 3, 4, 4)).astype(np.float32) for _ in range(3)])
    result = quantscan.scan(model, calib)
    row = result.layers.iloc[0]
    assert row["act_dead_channels"] == 1
    assert np.isfinite(row["weight_sqnr_db"])


def test_bias_overflow_is_clamped_with_a_warning(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 2, 4, 4] x) => (float[1, 2, 4, 4] y) {
      y = Conv (x, w, b)
    }
    """
    w = np.full((2, 2, 1, 1), 1e-6, np.float32)
    b = np.array([1e6, 0.5], np.float32)
    model = _save(tmp_path, text, {"w": w, "b": b})
    calib = _calib(tmp_path, "x", [rng.uniform(-1, 1, (1, 2, 4, 4)).astype(np.float32) for _ in range(2)])
    result = quantscan.scan(model, calib)
    assert any("bias overflows int32" in w for w in result.warnings)


def test_matmul_weight_is_per_column_and_hardsigmoid_alpha_is_honoured(tmp_path: Path) -> None:
    """MatMul [K,N] weights: per output channel on axis 1. HardSigmoid alpha 0.2 (Paddle) fused."""
    rng = np.random.default_rng(6)
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[N, 5] x) => (float[N, 3] y) {
      m = MatMul (x, w)
      y = HardSigmoid <alpha = 0.2, beta = 0.5> (m)
    }
    """
    w = rng.normal(size=(5, 3)).astype(np.float32)
    w[:, 1] *= 50  # one column much larger: per-tensor would crush the others
    model = _save(tmp_path, text, {"w": w})
    calib = _calib(tmp_path, "x", [rng.normal(size=(1, 5)).astype(np.float32) for _ in range(8)])
    qdq_path = tmp_path / "q.onnx"
    result = quantscan.scan(model, calib, save_qdq=qdq_path)
    assert [s.kernel for s in result.sites] == ["input", "MatMul+HardSigmoid"]
    assert result.sites[1].weight_axis == 1
    saved = onnx.load(qdq_path)
    dq = next(n for n in saved.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "w__quantized")
    assert next(a.i for a in dq.attribute if a.name == "axis") == 1
    scale = onnx.numpy_helper.to_array(next(t for t in saved.graph.initializer if t.name == "w__scale"))
    np.testing.assert_allclose(scale, np.abs(w).max(axis=0) / 127, rtol=1e-6)
    fp32 = ReferenceEvaluator(str(model))
    fq = _reference(qdq_path)
    x = dict(np.load(sorted(calib.glob("*.npz"))[0]))
    np.testing.assert_allclose(fq.run(None, x)[0], fp32.run(None, x)[0], atol=0.05)


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
@pytest.mark.parametrize("scheme", ["uint8", "int8"])
def test_every_calibration_method_and_scheme_runs_and_matches_its_saved_model(
    tmp_path: Path, method: str, scheme: str
) -> None:
    """Each calibrator yields a QDQ model whose output the reference evaluator reproduces."""
    rng = np.random.default_rng(7)
    model, calib = _conv_bn_relu(tmp_path, rng)
    qdq_path = tmp_path / "q.onnx"
    result = quantscan.scan(model, calib, calib_method=method, activations=scheme, save_qdq=qdq_path)
    saved = onnx.load(qdq_path)
    zero_points = [t for t in saved.graph.initializer if t.name.endswith("__act__zp")]
    expected = onnx.TensorProto.UINT8 if scheme == "uint8" else onnx.TensorProto.INT8
    assert zero_points and all(t.data_type == expected for t in zero_points)
    fp32, fq = _reference(model), _reference(qdq_path)
    feed = dict(np.load(sorted(calib.glob("*.npz"))[0]))
    x = fp32.run(None, feed)[0].astype(np.float64)
    y = fq.run(None, feed)[0].astype(np.float64)
    assert result.output_metrics["y"].cosine > 0.9
    assert float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum())) > 0.9


def test_eval_folder_is_used_for_the_figures_and_said_in_run_json(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    model, calib = _conv_bn_relu(tmp_path, rng)
    other = tmp_path / "eval"
    other.mkdir()
    for i in range(3):
        np.savez(other / f"{i}.npz", x=(5 * rng.normal(size=(1, 3, 8, 8))).astype(np.float32))
    same = quantscan.scan(model, calib)
    separate = quantscan.scan(model, calib, eval=other)
    assert same.run_info.evaluation.same_as_calibration is True
    assert separate.run_info.evaluation.same_as_calibration is False
    assert separate.run_info.evaluation.samples == 3
    # inputs 5x wider than the calibration range clip: the evaluation set must show it
    assert separate.output_metrics["y"].sqnr_db < same.output_metrics["y"].sqnr_db


def test_output_flag_chooses_the_headline_output(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[N, 3, 4, 4] x) => (float[N, 2, 4, 4] a, float[N, 2, 4, 4] b) {
      a = Conv (x, w)
      b = Relu (a)
    }
    """
    model = _save(tmp_path, text, {"w": rng.normal(size=(2, 3, 1, 1)).astype(np.float32)})
    calib = _calib(tmp_path, "x", [rng.normal(size=(1, 3, 4, 4)).astype(np.float32) for _ in range(3)])
    assert set(quantscan.scan(model, calib).output_metrics) == {"a", "b"}
    chosen = quantscan.scan(model, calib, output=["b"])
    assert chosen.headline.output == "b"
    with pytest.raises(quantscan.errors.UsageError):
        quantscan.scan(model, calib, output=["c"])


def test_channel_axis_is_1_for_elementwise_ops_on_conv_outputs(tmp_path: Path) -> None:
    """An SE-style Mul after a Conv keeps NCHW: its per-channel stats run over axis 1, not width."""
    rng = np.random.default_rng(10)
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 3, 4, 5] x) => (float[1, 6, 4, 5] y) {
      c = Conv (x, w)
      s = Sigmoid (c)
      m = Relu (c)
      y = Mul (m, s)
    }
    """
    model = _save(tmp_path, text, {"w": rng.normal(size=(6, 3, 1, 1)).astype(np.float32)})
    calib = _calib(tmp_path, "x", [rng.normal(size=(1, 3, 4, 5)).astype(np.float32) for _ in range(3)])
    result = quantscan.scan(model, calib, fused_activations=frozenset({"Relu"}))
    mul = next(s for s in result.sites if s.op_type == "Mul")
    assert mul.conv_like
    rows = result.channels[(result.channels["node"] == mul.node) & result.channels["act_range"].notna()]
    assert len(rows) == 6  # channels, not the width of 5


def test_channel_axis_stays_1_through_a_reshape_that_keeps_n_and_c(tmp_path: Path) -> None:
    """A YOLOv8 head's scores: Conv [1,C,H,W] -> Reshape [1,C,-1] -> Sigmoid. Its channels are the C
    classes on axis 1, not the H*W anchors on the last axis (the helmet detector showed "1924 outlier
    channels" on a 2-class score tensor). Oracle: each channel's min/max of the reference evaluator's
    Sigmoid output over axis 1. A Reshape that splits the channels (heads) ends the layout."""
    rng = np.random.default_rng(11)
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 3, 4, 5] x) => (float[1, 3, 20] y, float[1, 2, 3, 20] z) {
      c = Conv (x, w)
      shape = Constant <value = int64[3] {1, 3, -1}> ()
      r = Reshape (c, shape)
      y = Sigmoid (r)
      heads = Constant <value = int64[4] {1, 2, 3, -1}> ()
      c2 = Conv (x, w2)
      h = Reshape (c2, heads)
      z = Sigmoid (h)
    }
    """
    inits = {"w": rng.normal(size=(3, 3, 1, 1)).astype(np.float32) * [[[[1.0]]], [[[4.0]]], [[[0.2]]]],
             "w2": rng.normal(size=(6, 3, 1, 1)).astype(np.float32)}
    model = _save(tmp_path, text, {k: np.asarray(v, np.float32) for k, v in inits.items()})
    samples = [rng.normal(size=(1, 3, 4, 5)).astype(np.float32) for _ in range(3)]
    result = quantscan.scan(model, _calib(tmp_path, "x", samples), fused_activations=frozenset())
    sites = {s.op_type + s.output: s for s in result.sites}
    assert sites["Sigmoidy"].conv_like and not sites["Sigmoidz"].conv_like
    ref = ReferenceEvaluator(onnx.load(model))
    y = np.concatenate([ref.run(None, {"x": x})[0] for x in samples])
    rows = result.channels[(result.channels["node"] == sites["Sigmoidy"].node) & result.channels["act_range"].notna()]
    assert len(rows) == 3  # the 3 channels, not the 20 positions
    np.testing.assert_allclose(rows.sort_values("channel")["act_min"], y.min(axis=(0, 2)), rtol=1e-5)
    np.testing.assert_allclose(rows.sort_values("channel")["act_max"], y.max(axis=(0, 2)), rtol=1e-5)
