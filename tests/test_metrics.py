"""metrics.py against plain numpy formulas and against onnx's ReferenceEvaluator on a tiny QDQ model."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx.reference import ReferenceEvaluator

from quantscan.metrics import (
    ChannelErrorAccumulator,
    ErrorAccumulator,
    Top1Accumulator,
    channel_axis,
    jackknife_stderr,
    leave_one_out_cosine,
    looks_like_classifier,
    summarize,
)


def numpy_metrics(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """The contract's definitions written out directly (no zero/edge handling: finite, non-zero inputs)."""
    x = x.astype(np.float64).ravel()
    y = y.astype(np.float64).ravel()
    d = x - y
    return {
        "cosine": float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))),
        "sqnr_db": float(10 * np.log10(np.sum(x**2) / np.sum(d**2))),
        "mse": float(np.mean(d**2)),
        "max_abs": float(np.max(np.abs(d))),
        "rel_l2": float(np.linalg.norm(d) / np.linalg.norm(x)),
    }


def numpy_sample_cosines(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    xs = x.reshape(x.shape[0], -1).astype(np.float64)
    ys = y.reshape(y.shape[0], -1).astype(np.float64)
    return np.array(
        [np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)) for a, b in zip(xs, ys, strict=True)]
    )


@pytest.fixture()
def pair() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 3, 5, 5)).astype(np.float32)
    y = (x + rng.normal(scale=0.05, size=x.shape) * rng.uniform(0.1, 3, size=(6, 1, 1, 1))).astype(np.float32)
    return x, y


def test_matches_numpy_formulas(pair: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = pair
    acc = ErrorAccumulator()
    acc.update(x, y)
    for name, expected in numpy_metrics(x, y).items():
        assert getattr(acc, name) == pytest.approx(expected, rel=1e-12), name
    cos = numpy_sample_cosines(x, y)
    assert acc.worst_sample_cosine == pytest.approx(cos.min(), rel=1e-12)
    assert acc.mean_sample_cosine == pytest.approx(cos.mean(), rel=1e-12)
    per_sqnr = [numpy_metrics(a, b)["sqnr_db"] for a, b in zip(x, y, strict=True)]
    assert acc.worst_sample_sqnr_db == pytest.approx(min(per_sqnr), rel=1e-12)
    assert acc.count == x.size and acc.samples == x.shape[0]


def test_sqnr_equals_onnxruntime_definition(pair: tuple[np.ndarray, np.ndarray]) -> None:
    """ORT spells it 20·log10(‖x‖/‖x−y‖): the same number."""
    x, y = pair
    ort_sqnr = 20 * math.log10(
        np.linalg.norm(x.astype(np.float64)) / np.linalg.norm((x - y).astype(np.float64))
    )
    assert summarize(x, y)["sqnr_db"] == pytest.approx(ort_sqnr, rel=1e-9)


def test_streaming_equals_one_shot(pair: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = pair
    one = ErrorAccumulator()
    one.update(x, y)
    many = ErrorAccumulator()
    for i in range(0, x.shape[0], 2):
        many.update(x[i : i + 2], y[i : i + 2])
    for key, value in one.as_dict().items():
        assert many.as_dict()[key] == pytest.approx(value, rel=1e-9), key


def test_many_small_batches_exact() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 40))
    y = x + rng.normal(scale=1e-3, size=x.shape)
    one, many = ErrorAccumulator(), ErrorAccumulator()
    one.update(x, y)
    for i in range(500):
        many.update(x[i : i + 1], y[i : i + 1])
    for key in ("cosine", "sqnr_db", "mse", "max_abs", "rel_l2", "worst_sample_cosine", "mean_sample_cosine"):
        assert getattr(many, key) == pytest.approx(getattr(one, key), rel=1e-9), key


def test_worst_sample_across_batches() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 10))
    y = x.copy()
    y[1] += 0.01
    acc = ErrorAccumulator()
    acc.update(x[:2], y[:2])
    y3 = y[2:].copy()
    y3[1] = -x[3]  # sample 3 is anti-correlated: worst
    acc.update(x[2:], y3)
    assert acc.worst_sample_cosine == pytest.approx(-1.0)
    assert acc.worst_sample_sqnr_db == pytest.approx(10 * math.log10(1 / 4))
    assert acc.samples == 4


def test_both_all_zero() -> None:
    z = np.zeros((2, 3), dtype=np.float32)
    m = summarize(z, z)
    assert m["cosine"] == 1.0 and m["sqnr_db"] == math.inf
    assert m["mse"] == 0.0 and m["max_abs"] == 0.0 and m["rel_l2"] == 0.0
    assert m["worst_sample_cosine"] == 1.0 and m["worst_sample_sqnr_db"] == math.inf


def test_one_side_all_zero() -> None:
    z = np.zeros((2, 3), dtype=np.float32)
    o = np.ones((2, 3), dtype=np.float32)
    ref_zero = summarize(z, o)
    assert ref_zero["cosine"] == 0.0
    assert ref_zero["sqnr_db"] == -math.inf
    assert ref_zero["rel_l2"] == math.inf
    test_zero = summarize(o, z)
    assert test_zero["cosine"] == 0.0
    assert test_zero["sqnr_db"] == pytest.approx(0.0)
    assert test_zero["rel_l2"] == pytest.approx(1.0)


def test_identical_and_constant() -> None:
    c = np.full((3, 4), 2.5, dtype=np.float32)
    m = summarize(c, c)
    assert m["cosine"] == 1.0 and m["sqnr_db"] == math.inf and m["max_abs"] == 0.0
    m2 = summarize(c, c * 2)
    assert m2["cosine"] == pytest.approx(1.0)
    assert m2["sqnr_db"] == pytest.approx(0.0)
    assert m2["max_abs"] == pytest.approx(2.5)


def test_single_element_and_scalar() -> None:
    m = summarize(np.array([3.0]), np.array([2.0]))
    assert m["cosine"] == pytest.approx(1.0)
    assert m["mse"] == pytest.approx(1.0)
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(9.0))
    s = summarize(np.array(3.0), np.array(-3.0))
    assert s["cosine"] == pytest.approx(-1.0) and s["count"] == 1


def test_nonfinite_excluded_and_counted() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 8)).astype(np.float32)
    y = x + np.float32(0.1)
    x_bad, y_bad = x.copy(), y.copy()
    x_bad[0, 1] = np.nan
    y_bad[1, 2] = np.inf
    y_bad[2, 3] = -np.inf
    x_bad[2, 3] = np.nan  # both sides bad on the same element
    acc = ErrorAccumulator()
    acc.update(x_bad, y_bad)
    assert acc.nonfinite_ref == 2 and acc.nonfinite_test == 2
    assert acc.count == x.size - 3
    keep = np.ones(x.shape, dtype=bool)
    keep[0, 1] = keep[1, 2] = keep[2, 3] = False
    expected = numpy_metrics(x[keep], y[keep])
    for name, value in expected.items():
        assert getattr(acc, name) == pytest.approx(value, rel=1e-9), name
    assert all(math.isfinite(v) for v in acc.as_dict().values())


def test_sample_all_nonfinite_is_skipped() -> None:
    x = np.array([[np.nan, np.nan], [1.0, 2.0]])
    y = np.array([[1.0, 1.0], [1.0, 2.0]])
    acc = ErrorAccumulator()
    acc.update(x, y)
    assert acc.samples == 1 and acc.worst_sample_cosine == pytest.approx(1.0)


def test_empty_accumulator_is_nan() -> None:
    acc = ErrorAccumulator()
    assert all(
        math.isnan(v)
        for k, v in acc.as_dict().items()
        if k not in {"count", "nonfinite_ref", "nonfinite_test"}
    )


def test_int64_tensors_in_float64() -> None:
    big = np.array([[2**53 + 2, 5], [7, -(2**40)]], dtype=np.int64)
    other = big.copy()
    other[0, 1] = 6
    m = summarize(big, other)
    assert m["max_abs"] == 1.0 and m["mse"] == pytest.approx(0.25)
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(np.sum(big.astype(np.float64) ** 2)))


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="shape"):
        ErrorAccumulator().update(np.zeros((2, 3)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="shape"):
        ChannelErrorAccumulator(1).update(np.zeros((2, 3)), np.zeros((2, 4)))


def test_channel_sqnr_matches_numpy() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(size=(4, 3, 5, 5))
    noise = rng.normal(size=x.shape) * np.array([0.01, 0.1, 1.0]).reshape(1, 3, 1, 1)
    y = x + noise
    acc = ChannelErrorAccumulator(axis=1)
    acc.update(x[:2], y[:2])
    acc.update(x[2:], y[2:])
    expected = [10 * np.log10(np.sum(x[:, c] ** 2) / np.sum(noise[:, c] ** 2)) for c in range(3)]
    np.testing.assert_allclose(acc.per_channel_sqnr_db(), expected, rtol=1e-9)
    assert acc.worst_channel_sqnr_db == pytest.approx(min(expected), rel=1e-9)
    assert acc.channels == 3


def test_channel_last_axis_and_dead_channel() -> None:
    x = np.ones((2, 7, 3))
    x[..., 2] = 0.0
    y = x + 0.1
    acc = ChannelErrorAccumulator(axis=-1)
    acc.update(x, y)
    sq = acc.per_channel_sqnr_db()
    assert sq[2] == -math.inf
    assert acc.worst_channel_sqnr_db == pytest.approx(20.0)  # channel 2 (Σx²=0) is left out


def test_channel_count_change_raises() -> None:
    acc = ChannelErrorAccumulator(axis=1)
    acc.update(np.ones((1, 3)), np.ones((1, 3)))
    with pytest.raises(ValueError, match="channel count"):
        acc.update(np.ones((1, 4)), np.ones((1, 4)))


def test_top1() -> None:
    ref = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5], [0.4, 0.5, 0.1]])
    test = np.array([[0.2, 0.7, 0.1], [0.1, 0.8, 0.1], [0.2, 0.3, 0.5], [0.5, 0.4, 0.1]])
    acc = Top1Accumulator()
    acc.update(ref[:2, :, None, None], test[:2, :, None, None], labels=[1, None])
    assert acc.accuracy == 1.0 and acc.ref_accuracy == 1.0
    acc.update(ref[2:], test[2:], labels=[2, 1])
    assert acc.agreement == pytest.approx(0.5)
    assert acc.labelled == 3
    assert acc.accuracy == pytest.approx(2 / 3) and acc.ref_accuracy == pytest.approx(1.0)
    no_labels = Top1Accumulator()
    no_labels.update(ref, test)
    assert no_labels.accuracy is None and no_labels.agreement == pytest.approx(0.5)


def test_top1_rejects_non_classifier_shape() -> None:
    with pytest.raises(ValueError, match="classes"):
        Top1Accumulator().update(np.zeros((2, 3, 4)), np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="labels"):
        Top1Accumulator().update(np.zeros((2, 3)), np.zeros((2, 3)), labels=[1])


def test_looks_like_classifier() -> None:
    assert looks_like_classifier([1, 1000])
    assert looks_like_classifier(["N", 10, 1, 1])
    assert not looks_like_classifier([1, 1])
    assert not looks_like_classifier([1, 3, 224, 224])
    assert not looks_like_classifier(["N", "C"])


def test_channel_axis_contract() -> None:
    assert channel_axis(4, conv_like=True) == 1
    assert channel_axis(3, conv_like=True) == 1
    assert channel_axis(3, conv_like=False) == 2
    assert channel_axis(2, conv_like=True) == 1
    assert channel_axis(4, conv_like=False) == 3
    with pytest.raises(ValueError):
        channel_axis(0, conv_like=False)


QDQ_MODEL = """
<ir_version: 9, opset_import: ["" : 19]>
net (float[2, 2, 5, 5] x) => (float[2, 3, 5, 5] ref, float[2, 3, 5, 5] fq)
<float[3, 2, 3, 3] w = {W}, float[3] b = {B}, float xs = {{{XS}}}, uint8 xz = {{{XZ}}},
 float[3] ws = {WS}, int8[3] wz = {{0, 0, 0}}>
{{
    conv = Conv <pads = [1, 1, 1, 1]> (x, w, b)
    ref = Relu (conv)
    xq = QuantizeLinear (x, xs, xz)
    xdq = DequantizeLinear (xq, xs, xz)
    wq = QuantizeLinear <axis = 0> (w, ws, wz)
    wdq = DequantizeLinear <axis = 0> (wq, ws, wz)
    qconv = Conv <pads = [1, 1, 1, 1]> (xdq, wdq, b)
    fq = Relu (qconv)
}}
"""


def _floats(a: np.ndarray) -> str:
    return "{" + ", ".join(repr(float(v)) for v in a.ravel()) + "}"


def test_against_reference_evaluator_qdq_conv() -> None:
    """Cross-check the accumulator on tensors produced by onnx's reference Conv→Relu with and without QDQ."""
    rng = np.random.default_rng(5)
    w = rng.normal(size=(3, 2, 3, 3)).astype(np.float32)
    b = rng.normal(size=3).astype(np.float32)
    x = rng.normal(size=(2, 2, 5, 5)).astype(np.float32)
    ws = (np.abs(w).reshape(3, -1).max(axis=1) / 127).astype(np.float32)
    lo, hi = float(min(x.min(), 0)), float(max(x.max(), 0))
    xs = np.float32((hi - lo) / 255)
    xz = int(round(-lo / xs))
    text = QDQ_MODEL.format(W=_floats(w), B=_floats(b), XS=repr(float(xs)), XZ=xz, WS=_floats(ws))
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    results = ReferenceEvaluator(model).run(None, {"x": x}, intermediate=True)
    assert isinstance(results, dict)
    ref, fq = results["ref"], results["fq"]
    assert not np.array_equal(ref, fq)
    acc = ErrorAccumulator()
    for i in range(2):
        acc.update(ref[i : i + 1], fq[i : i + 1])
    for name, value in numpy_metrics(ref, fq).items():
        assert getattr(acc, name) == pytest.approx(value, rel=1e-9), name
    assert 0.99 < acc.cosine < 1.0 and 20 < acc.sqnr_db < 60
    # The pre-activation error feeds the per-channel view too.
    ch = ChannelErrorAccumulator(axis=channel_axis(4, conv_like=True))
    ch.update(results["conv"], results["qconv"])
    assert (
        ch.channels == 3
        and ch.worst_channel_sqnr_db <= float(summarize(results["conv"], results["qconv"])["sqnr_db"]) + 1e-9
    )


def test_large_batch_walked_in_blocks_matches_numpy() -> None:
    """A batch bigger than one internal block (with NaNs in later blocks) gives the plain formulas."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(3, 300_001)).astype(np.float32)
    y = (x + rng.normal(scale=0.01, size=x.shape)).astype(np.float32)
    y[2, 250_000] = np.nan
    x[1, 299_999] = np.inf
    acc = ErrorAccumulator()
    acc.update(x, y)
    keep = np.isfinite(x) & np.isfinite(y)
    for name, value in numpy_metrics(x[keep], y[keep]).items():
        assert getattr(acc, name) == pytest.approx(value, rel=1e-9), name
    assert acc.count == x.size - 2 and acc.nonfinite_ref == 1 and acc.nonfinite_test == 1
    per_sample = [numpy_metrics(x[i][keep[i]], y[i][keep[i]])["cosine"] for i in range(3)]
    assert acc.worst_sample_cosine == pytest.approx(min(per_sample), rel=1e-9)


def test_update_sums_tells_float32_overflow_from_nan() -> None:
    """Finite values whose float32 Σx² overflowed (a float-min mask) are `overflow`, not NaN/Inf data;
    a NaN sum or an infinite max|x-y| still counts as non-finite."""
    from quantscan.metrics import ErrorAccumulator

    inf, nan = float("inf"), float("nan")
    acc = ErrorAccumulator()
    acc.update_sums([inf], [inf], [inf], [1.0], [0.5], elements_per_sample=4)  # all finite values, sums overflow
    assert (acc.overflow, acc.nonfinite_ref, acc.nonfinite_test) == (4, 0, 0)
    acc.update_sums([nan], [nan], [1.0], [nan], [0.5], elements_per_sample=4)  # a NaN in x
    acc.update_sums([inf], [1.0], [inf], [inf], [inf], elements_per_sample=4)  # an Inf on the test side
    assert (acc.overflow, acc.nonfinite_ref, acc.nonfinite_test) == (4, 4, 4)


def _pooled_cosine(x: np.ndarray, y: np.ndarray) -> float:
    """The contract's cosine written out on raw arrays: Σxy / √(Σx²·Σy²) over every element."""
    return float(np.sum(x * y) / math.sqrt(float(np.sum(x * x)) * float(np.sum(y * y))))


def test_leave_one_out_cosine_equals_recomputing_without_each_sample() -> None:
    """The replicates come from per-sample sums; the oracle drops sample i from the raw data and
    recomputes the pooled cosine, so a wrong sign or a per-sample (not pooled) formula fails."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 40))
    y = x + rng.normal(scale=[[0.1], [0.5], [0.05], [1.0], [0.2], [0.3]], size=(6, 40))
    loo = leave_one_out_cosine(np.sum(x * y, 1), np.sum(x * x, 1), np.sum(y * y, 1))
    expected = [_pooled_cosine(np.delete(x, i, 0), np.delete(y, i, 0)) for i in range(6)]
    np.testing.assert_allclose(loo, expected, rtol=1e-12)
    assert np.isnan(leave_one_out_cosine(np.array([1.0, np.inf]), np.ones(2), np.ones(2))).all()


def test_jackknife_stderr_of_a_mean_is_the_textbook_standard_error() -> None:
    """For the mean, the jackknife SE is exactly s/√n (s the sample standard deviation, ddof=1): an
    independent formula to hold the implementation to."""
    v = np.array([0.3, -1.2, 2.5, 0.7, 0.1, -0.4, 1.9])
    replicates = np.array([np.delete(v, i).mean() for i in range(v.size)])
    assert jackknife_stderr(replicates) == pytest.approx(v.std(ddof=1) / math.sqrt(v.size), rel=1e-12)
    assert math.isnan(jackknife_stderr(np.array([0.5])))
    assert jackknife_stderr(np.full(5, 0.25)) == 0.0
