"""quant.py against its oracles: onnxruntime's compute_scale_zp and HistogramCollector/calibrators,
onnx's ReferenceEvaluator for QuantizeLinear/DequantizeLinear, and brute-force numpy for MSE."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from onnxruntime.quantization import quant_utils
from onnxruntime.quantization.calibrate import CalibrationMethod, HistogramCollector, create_calibrator

from quantscan.quant import (
    ChannelRangeObserver,
    QParams,
    activation_qparams,
    dequantize,
    fake_quant,
    make_observer,
    quantize,
    quantize_bias,
    weight_qparams,
    widen_weight_scale_for_bias,
)

# ---------------------------------------------------------------------------------------------- qparams

ORT_RANGES: dict[str, tuple[np.ndarray, np.ndarray, bool]] = {
    "uint8": (np.array(0, dtype=np.uint8), np.array(255, dtype=np.uint8), False),
    "int8": (np.array(-127, dtype=np.int8), np.array(127, dtype=np.int8), True),
    "int16": (np.array(-32767, dtype=np.int16), np.array(32767, dtype=np.int16), True),
    "uint16": (np.array(0, dtype=np.uint16), np.array(65535, dtype=np.uint16), False),
}
RANGES = [
    (-1.0, 1.0),
    (0.0, 6.0),
    (-3.7, 0.25),
    (0.3, 2.0),  # widened to include 0
    (-5.0, -0.5),
    (-1e-3, 7e4),
    (1e-6, 1e-5),
    (0.0, 0.0),
    (-1e-40, 1e-40),  # below float32 tiny after the scale division
    (-0.123456789, 98.7654321),
]


@pytest.mark.parametrize("scheme", ["uint8", "int8", "int16", "uint16"])
@pytest.mark.parametrize(("rmin", "rmax"), RANGES)
def test_activation_qparams_match_onnxruntime(scheme: str, rmin: float, rmax: float) -> None:
    qmin, qmax, symmetric = ORT_RANGES[scheme]
    zp, scale = quant_utils.compute_scale_zp(
        np.array(rmin, dtype=np.float32), np.array(rmax, dtype=np.float32), qmin, qmax, symmetric=symmetric
    )
    qp = activation_qparams(rmin, rmax, scheme)
    assert qp.scale.dtype == np.float32 and qp.scale.shape == ()
    assert qp.zero_point.dtype == qmin.dtype and qp.axis is None
    assert qp.scale == scale, (qp.scale, scale)
    assert qp.zero_point == zp


def test_activation_qparams_formulas() -> None:
    qp = activation_qparams(-1.0, 3.0, "uint8")
    assert float(qp.scale) == pytest.approx(4 / 255) and int(qp.zero_point) == 64
    assert (qp.qmin, qp.qmax) == (0, 255)
    s8 = activation_qparams(-1.0, 3.0, "int8")
    assert float(s8.scale) == pytest.approx(3 / 127) and int(s8.zero_point) == 0
    assert (s8.qmin, s8.qmax) == (-128, 127)
    s16 = activation_qparams(-1.0, 3.0, "int16")
    assert float(s16.scale) == pytest.approx(3 / 32767) and s16.zero_point.dtype == np.int16
    zero = activation_qparams(0.0, 0.0)
    assert float(zero.scale) == 1.0 and int(zero.zero_point) == 0


def test_activation_qparams_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="scheme"):
        activation_qparams(0.0, 1.0, "uint4")
    with pytest.raises(ValueError, match="finite"):
        activation_qparams(0.0, float("inf"))
    with pytest.raises(ValueError, match="inverted"):
        activation_qparams(1.0, 0.0)


def test_weight_qparams_per_channel() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)
    w[2] = 0.0
    qp = weight_qparams(w, axis=0)
    assert qp.axis == 0 and qp.scale.shape == (4,) and qp.zero_point.dtype == np.int8
    expected = np.abs(w).reshape(4, -1).max(axis=1) / 127
    np.testing.assert_allclose(qp.scale[[0, 1, 3]], expected[[0, 1, 3]], rtol=1e-7)
    assert qp.scale[2] == 1.0  # all-zero channel
    assert np.all(qp.zero_point == 0)
    # Same scales as onnxruntime's symmetric per-channel weight quantization.
    for c in (0, 1, 3):
        _, ort_scale = quant_utils.compute_scale_zp(
            w[c].min(),
            w[c].max(),
            np.array(-127, dtype=np.int8),
            np.array(127, dtype=np.int8),
            symmetric=True,
        )
        assert qp.scale[c] == ort_scale
    q = quantize(w, qp)
    assert q.min() >= -127 and q.max() <= 127 and np.all(q[2] == 0)


def test_weight_qparams_axis_and_int16() -> None:
    rng = np.random.default_rng(1)
    w = rng.normal(size=(2, 5, 3, 3)).astype(np.float32)  # ConvTranspose: output channels on axis 1
    qp = weight_qparams(w, axis=1, bits=16)
    assert qp.scale.shape == (5,) and qp.zero_point.dtype == np.int16 and qp.axis == 1
    expected = np.abs(w).max(axis=(0, 2, 3)) / 32767
    np.testing.assert_allclose(qp.scale, expected, rtol=1e-7)
    assert np.abs(fake_quant(w, qp) - w).max() <= qp.scale.max() / 2 + 1e-9
    with pytest.raises(ValueError):
        weight_qparams(w, axis=0, bits=2)  # 4, 8 and 16 are the weight widths
    with pytest.raises(ValueError):
        weight_qparams(np.array([np.nan, 1.0]), axis=0)


# -------------------------------------------------------------------------- QuantizeLinear oracle (onnx)

QDQ_TEXT = """
<ir_version: 10, opset_import: ["" : 21]>
qdq ({xtype}[{shape}] x, float[{sshape}] s, {qtype}[{sshape}] z) => ({qtype}[{shape}] q, float[{shape}] y)
{{
    q = QuantizeLinear <axis = {axis}> (x, s, z)
    y = DequantizeLinear <axis = {axis}> (q, s, z)
}}
"""


def _reference_qdq(x: np.ndarray, qp: QParams) -> tuple[np.ndarray, np.ndarray]:
    qtype = {np.dtype(np.uint8): "uint8", np.dtype(np.int8): "int8", np.dtype(np.int16): "int16"}[qp.dtype]
    sshape = "" if qp.axis is None else str(qp.scale.size)
    text = QDQ_TEXT.format(
        xtype="float",
        shape=", ".join(map(str, x.shape)),
        sshape=sshape,
        qtype=qtype,
        axis=1 if qp.axis is None else qp.axis,
    )
    model = onnx.parser.parse_model(text)
    for graph_input in model.graph.input:  # the parser leaves `float[]` shapeless; make it rank 0
        graph_input.type.tensor_type.shape.SetInParent()
    onnx.checker.check_model(model, full_check=True)
    q, y = ReferenceEvaluator(model).run(None, {"x": x, "s": qp.scale, "z": qp.zero_point})
    return np.asarray(q), np.asarray(y)


def _ties_and_extremes(shape: tuple[int, ...], scale: float, rng: np.random.Generator) -> np.ndarray:
    """Values on exact .5 steps (round-half-to-even matters), far outside the range, and random ones."""
    x = rng.normal(scale=100 * scale, size=shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[: flat.size // 3] = (np.arange(flat.size // 3) - flat.size // 6 + 0.5).astype(
        np.float32
    ) * np.float32(scale)
    flat[-2:] = [1e5 * scale, -1e5 * scale]  # saturate every type, yet fit the reference's int32 cast
    return x


@pytest.mark.parametrize("scheme", ["uint8", "int8", "int16"])
def test_quantize_per_tensor_matches_reference_evaluator(scheme: str) -> None:
    rng = np.random.default_rng(2)
    qp = activation_qparams(-1.3, 2.9, scheme)
    x = _ties_and_extremes((3, 4, 5, 6), float(qp.scale), rng)
    q_ref, y_ref = _reference_qdq(x, qp)
    q = quantize(x, qp)
    assert q.dtype == q_ref.dtype
    np.testing.assert_array_equal(q, q_ref)
    np.testing.assert_array_equal(dequantize(q, qp), y_ref)
    np.testing.assert_array_equal(fake_quant(x, qp), y_ref)
    assert fake_quant(x, qp).dtype == np.float32


@pytest.mark.parametrize("axis", [0, 1])
def test_quantize_per_channel_matches_reference_evaluator(axis: int) -> None:
    rng = np.random.default_rng(3)
    w = rng.normal(size=(4, 6, 3, 3)).astype(np.float32)
    qp = weight_qparams(w, axis=axis)
    x = w * np.float32(1.3)  # some values saturate
    q_ref, y_ref = _reference_qdq(x, qp)
    np.testing.assert_array_equal(quantize(x, qp), q_ref)
    np.testing.assert_array_equal(fake_quant(x, qp), y_ref)


def test_quantize_per_channel_uint8() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    params = [activation_qparams(float(x[:, c].min()), float(x[:, c].max())) for c in range(3)]
    qp = QParams(
        np.array([p.scale for p in params], dtype=np.float32),
        np.array([p.zero_point for p in params], dtype=np.uint8),
        axis=1,
    )
    q_ref, y_ref = _reference_qdq(x, qp)
    np.testing.assert_array_equal(quantize(x, qp), q_ref)
    np.testing.assert_array_equal(fake_quant(x, qp), y_ref)


def test_round_half_to_even_and_nan() -> None:
    qp = activation_qparams(-1.0, 1.0, "int8")  # scale 1/127
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5], dtype=np.float32) * qp.scale
    np.testing.assert_array_equal(quantize(x, qp), [0, 2, 2, 0, -2])
    nan_q = quantize(np.array([np.nan, np.inf, -np.inf], dtype=np.float32), activation_qparams(-1.0, 3.0))
    np.testing.assert_array_equal(nan_q, [64, 255, 0])


# -------------------------------------------------------------------------------------------------- bias


def test_quantize_bias() -> None:
    b = np.array([0.5, -0.25, 0.0], dtype=np.float32)
    ws = np.array([0.01, 0.02, 1.0], dtype=np.float32)
    q, scale, overflowed = quantize_bias(b, 0.1, ws)
    assert q.dtype == np.int32 and scale.dtype == np.float32 and not overflowed
    np.testing.assert_allclose(scale, np.float32(0.1) * ws)
    np.testing.assert_array_equal(q, np.rint(b.astype(np.float64) / (np.float32(0.1) * ws)).astype(np.int32))
    np.testing.assert_allclose(q * scale, b, atol=float(scale.max()) / 2)


def test_quantize_bias_overflow_clamps_and_flags() -> None:
    b = np.array([1e3, -1e3, 1e-6], dtype=np.float32)
    q, scale, overflowed = quantize_bias(b, 1e-5, np.array([1e-5, 1e-5, 1e-5], dtype=np.float32))
    assert overflowed
    assert q[0] == np.iinfo(np.int32).max and q[1] == np.iinfo(np.int32).min
    assert q[2] == np.rint(np.float64(b[2]) / np.float64(scale[2])) and 9_000 < q[2] < 11_000


def test_quantize_bias_zero_scale() -> None:
    q, _, overflowed = quantize_bias(np.array([0.0, 1.0]), 0.0, np.array([1.0, 1.0]))
    assert q[0] == 0 and q[1] == np.iinfo(np.int32).max and overflowed


# ------------------------------------------------------------------------------------------- observers


def _batches(seed: int = 0) -> list[np.ndarray]:
    """Heavy-tailed batches whose range grows, so histogram merging is exercised."""
    rng = np.random.default_rng(seed)
    scales = (1.0, 0.5, 3.0, 2.0, 1.0)
    return [(rng.standard_t(4, size=(2, 8, 6, 6)) * s + 0.3).astype(np.float32) for s in scales]


def _ort_collector_range(
    batches: list[np.ndarray], method: str, symmetric: bool, num_bins: int, percentile: float = 99.9
) -> tuple[float, float]:
    collector = HistogramCollector(
        method=method,
        symmetric=symmetric,
        num_bins=num_bins,
        num_quantized_bins=128,
        percentile=percentile,
        scenario="same",
    )
    with contextlib.redirect_stdout(io.StringIO()):  # ORT prints progress
        for batch in batches:
            collector.collect({"t": batch})
        result = collector.compute_collection_result()["t"]
    return float(result[0]), float(result[1])


def _observer_range(batches: list[np.ndarray], method: str, **kwargs: object) -> tuple[float, float]:
    observer = make_observer(method, **kwargs)  # type: ignore[arg-type]
    for batch in batches:
        observer.update(batch)
    return observer.range()


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("percentile", [99.0, 99.9, 99.999])
def test_percentile_matches_onnxruntime(symmetric: bool, percentile: float) -> None:
    batches = _batches()
    expected = _ort_collector_range(batches, "percentile", symmetric, 2048, percentile)
    got = _observer_range(batches, "percentile", symmetric=symmetric, percentile=percentile)
    assert got == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("symmetric", [False, True])
def test_percentile_after_a_near_zero_first_batch_rebins(symmetric: bool) -> None:
    """A text detector's probability map of a photo is ~0 (max 1e-7) and the next sample's reaches 0.9.
    onnxruntime's HistogramCollector grows its histogram by first-batch-width bins: 145 million signed bins (which
    np.histogram refuses over float32 bounds) or 18 billion absolute ones (68.7 GiB), so quantize_static fails
    there (not called here: it may take the machine's memory). quantscan re-bins past MAX_HISTOGRAM_BINS.
    Oracle: numpy's percentile of every value (of |x| when symmetric), to two of the final bins."""
    rng = np.random.default_rng(5)
    batches = [(rng.random((1, 1, 40, 40)) * 1e-7).astype(np.float32),
               np.clip(rng.normal(0.3, 0.3, (1, 1, 40, 40)), 0, 0.9).astype(np.float32)]
    low, high = _observer_range(batches, "percentile", symmetric=symmetric, percentile=99.9)
    values = np.abs(np.concatenate([b.ravel() for b in batches]))
    bin_width = (1 if symmetric else 2) * float(values.max()) / 2048
    want = float(np.percentile(values, 99.9 if symmetric else 100 - (100 - 99.9) / 2))
    assert high == pytest.approx(want, abs=2 * bin_width) and -2 * bin_width <= low <= 2 * bin_width


@pytest.mark.parametrize("symmetric", [False, True])
def test_entropy_matches_onnxruntime(symmetric: bool) -> None:
    batches = _batches(1)[:3]
    expected = _ort_collector_range(batches, "entropy", symmetric, 256)
    got = _observer_range(batches, "entropy", symmetric=symmetric, num_bins=256)
    assert got == pytest.approx(expected, rel=1e-6)
    absmax = max(float(np.abs(b).max()) for b in batches)
    assert max(abs(got[0]), abs(got[1])) < absmax  # KL clips the t-distribution's tail


IDENTITY_MODEL = """
<ir_version: 9, opset_import: ["" : 17]>
ident (float[N, 8, 6, 6] x) => (float[N, 8, 6, 6] y)
{
    r = Relu (x)
    y = Identity (r)
}
"""


class _Reader:
    def __init__(self, batches: list[np.ndarray]) -> None:
        self._it = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._it, None)
        return None if batch is None else {"x": batch}


@pytest.mark.parametrize(
    ("method", "calibration", "extra"),
    [
        ("percentile", CalibrationMethod.Percentile, {"num_bins": 2048, "percentile": 99.9}),
        ("entropy", CalibrationMethod.Entropy, {"num_bins": 256, "num_quantized_bins": 128}),
    ],
)
@pytest.mark.parametrize("symmetric", [False, True])
def test_matches_onnxruntime_calibrator_end_to_end(
    tmp_path: Path, method: str, calibration: CalibrationMethod, extra: dict[str, float], symmetric: bool
) -> None:
    """Through ORT's public create_calibrator on a Relu model, one collect_data call per batch."""
    model_path = tmp_path / "relu.onnx"
    onnx.save(onnx.parser.parse_model(IDENTITY_MODEL), model_path)
    batches = _batches(2)[:3]
    calibrator = create_calibrator(
        model_path,
        op_types_to_calibrate=["Relu"],
        augmented_model_path=str(tmp_path / "aug.onnx"),
        calibrate_method=calibration,
        extra_options={**extra, "symmetric": symmetric},  # ORT's percentile default is symmetric
    )
    with contextlib.redirect_stdout(io.StringIO()):
        for batch in batches:
            calibrator.collect_data(_Reader([batch]))
        ort_range = calibrator.compute_data()["r"].range_value
    relu = [np.maximum(b, 0) for b in batches]
    bins = {k: int(v) for k, v in extra.items() if "bins" in k}
    got = _observer_range(relu, method, symmetric=symmetric, percentile=99.9, **bins)
    assert got == pytest.approx((float(ort_range[0]), float(ort_range[1])), rel=1e-6)


def test_minmax_observer_and_nonfinite() -> None:
    obs = make_observer("minmax")
    obs.update(np.array([1.0, -2.0, np.nan], dtype=np.float32))
    obs.update(np.array([[np.inf, 5.0]], dtype=np.float32))
    assert obs.range() == (-2.0, 5.0) and obs.nonfinite == 2
    sym = make_observer("minmax", symmetric=True)
    sym.update(np.array([1.0, -2.0]))
    assert sym.range() == (-2.0, 2.0)
    assert make_observer("minmax").range() == (0.0, 0.0)


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
def test_observers_skip_and_count_nonfinite(method: str) -> None:
    """NaN/Inf inside a batch change nothing but the count: same range as the batch without them."""
    batches = _batches(3)[:2]
    clean, dirty = make_observer(method), make_observer(method)
    for batch in batches:
        bad = batch.copy()
        bad.flat[[0, 5, 9]] = [np.nan, np.inf, -np.inf]
        dirty.update(bad)
        clean.update(np.delete(batch.ravel(), [0, 5, 9]))
    dirty.update(np.full((2, 2), np.nan, dtype=np.float32))  # a batch with nothing finite
    assert dirty.range() == clean.range()
    assert dirty.nonfinite == 10 and clean.nonfinite == 0


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
def test_all_zero_tensor_gives_zero_range(method: str) -> None:
    obs = make_observer(method)
    obs.update(np.zeros((2, 3), dtype=np.float32))
    lo, hi = obs.range()
    assert lo == pytest.approx(0.0) and hi == pytest.approx(0.0)
    assert float(activation_qparams(lo, hi).scale) == 1.0


def test_unknown_method() -> None:
    with pytest.raises(ValueError, match="calibration method"):
        make_observer("kl")


def _brute_force_mse(
    x: np.ndarray, candidates: list[tuple[float, float]], scheme: str
) -> tuple[np.ndarray, int]:
    x64 = x.astype(np.float64)
    mses = np.array(
        [np.mean((fake_quant(x, activation_qparams(lo, hi, scheme)) - x64) ** 2) for lo, hi in candidates]
    )
    return mses, int(np.argmin(mses))


@pytest.mark.parametrize("symmetric", [False, True])
def test_mse_observer_against_brute_force(symmetric: bool) -> None:
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.laplace(size=4000), rng.normal(scale=8, size=20)]).astype(np.float32)
    rng.shuffle(x)
    obs = make_observer("mse", symmetric=symmetric)
    for chunk in np.array_split(x, 4):
        obs.update(chunk)
    candidates = obs.candidate_ranges()  # type: ignore[attr-defined]
    mses, best = _brute_force_mse(x, candidates, "int8" if symmetric else "uint8")
    chosen = candidates.index(obs.range())
    assert mses[chosen] <= mses[best] * 1.02  # histogram estimate within 2% of the exact optimum
    assert abs(chosen - best) <= 8
    lo, hi = obs.range()
    assert max(-lo, hi) < float(np.abs(x).max())
    # The candidates shrink the observed range; the widest one is minmax.
    mm = make_observer("minmax", symmetric=symmetric)
    mm.update(x)
    assert candidates[-1] == pytest.approx(mm.range(), rel=1e-6)


def test_mse_clips_heavy_tail_where_minmax_does_not() -> None:
    rng = np.random.default_rng(6)
    x = rng.laplace(size=200_000).astype(np.float32)  # 8-bit MSE-optimal clip ~ 9.9 scale, max ~ 12
    mse, minmax = make_observer("mse"), make_observer("minmax")
    for chunk in np.array_split(x, 3):
        mse.update(chunk)
        minmax.update(chunk)
    assert minmax.range() == (float(x.min()), float(x.max()))
    lo, hi = mse.range()
    assert -lo < 0.9 * -float(x.min()) and hi < 0.9 * float(x.max())
    qp_mse, qp_mm = activation_qparams(lo, hi), activation_qparams(*minmax.range())
    x64 = x.astype(np.float64)
    assert np.mean((fake_quant(x, qp_mse) - x64) ** 2) < np.mean((fake_quant(x, qp_mm) - x64) ** 2)


def test_mse_keeps_uniform_range() -> None:
    """Nothing to clip in uniform data: the widest candidate (ties go wide) or very close to it."""
    x = np.linspace(0, 1, 10_001, dtype=np.float32)
    obs = make_observer("mse")
    obs.update(x)
    lo, hi = obs.range()
    assert lo == 0.0 and hi >= 0.97


# ------------------------------------------------------------------------------------- channel ranges


def test_channel_range_observer() -> None:
    x = np.zeros((2, 4, 3, 3), dtype=np.float32)
    x[:, 0] = np.linspace(-1, 1, 18).reshape(2, 3, 3)  # width 2
    x[:, 1] = np.linspace(0, 0.02, 18).reshape(2, 3, 3)  # width 0.02
    x[:, 2] = 0.0  # dead
    x[:, 3] = 5.0  # constant: zero range as well
    obs = ChannelRangeObserver(axis=1)
    obs.update(x[:1])
    obs.update(x[1:])
    lo, hi = obs.ranges()
    np.testing.assert_allclose(lo, [-1, 0, 0, 5])
    np.testing.assert_allclose(hi, [1, 0.02, 0, 5], rtol=1e-6)
    assert obs.spread() == pytest.approx(100.0, rel=1e-5)
    assert obs.dead() == 2


def test_channel_range_observer_last_axis_nonfinite_and_spread_default() -> None:
    obs = ChannelRangeObserver(axis=-1)
    x = np.array([[[1.0, np.nan], [3.0, np.inf]]])
    obs.update(x)
    lo, hi = obs.ranges()
    assert lo[0] == 1.0 and hi[0] == 3.0
    assert np.isnan(lo[1]) and obs.nonfinite == 2
    assert obs.spread() == 1.0 and obs.dead() == 1
    with pytest.raises(ValueError, match="channel count"):
        obs.update(np.zeros((1, 2, 3)))


@pytest.mark.parametrize("per_channel", [True, False])
def test_widen_weight_scale_for_bias_matches_quantize_static(per_channel: bool) -> None:
    """Oracle: quantize_static's own adjustment (QDQQuantizer._adjust_weight_scale_for_int32_bias uses
    no state of the quantizer). 16-bit input and weight scales overflow an int32 bias; 8-bit ones don't."""
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    rng = np.random.default_rng(3)
    bias = rng.normal(0, 2, 8).astype(np.float32)
    for input_scale, weight_scale in [(2e-5, rng.uniform(1e-6, 1e-4, 8)), (0.02, rng.uniform(1e-3, 1e-2, 8))]:
        w_scale = np.asarray(weight_scale if per_channel else weight_scale[:1], np.float32)
        ours = widen_weight_scale_for_bias(w_scale, input_scale, bias)
        _, theirs = QDQQuantizer._adjust_weight_scale_for_int32_bias(
            None,  # type: ignore[arg-type]
            np.asarray(input_scale, np.float32), w_scale.copy(), "w", numpy_helper.from_array(bias, "b"), per_channel,
        )
        assert theirs is not None and ours.dtype == np.float32
        np.testing.assert_array_equal(ours, theirs)
    assert (widen_weight_scale_for_bias(np.full(8, 1e-6, np.float32), 2e-5, bias) > 1e-6).any()
