"""smooth: every producer kind, the alpha choice and its refusal, the runner's calibration path, real models.

Oracles: ReferenceEvaluator on the original model (outputs equal within float32 rounding), the
SmoothQuant factor s_j = max|X_j|^α / max|W_j|^(1−α) written out in numpy from statistics the test
computes itself, and the smoothed tensor's channel ranges (max|X_j| / s_j) read back by running it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from builders import assert_same_outputs, build, rng_array, run
from conftest import asset_calib, asset_model
from quantscan.calib import load_calibration
from quantscan.model import load_model
from quantscan.rewrites.calibstats import ChannelStats, channel_stats
from quantscan.rewrites.pipeline import rewrite
from quantscan.rewrites.smooth import smooth, smooth_sites

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'


def stats_of(x: np.ndarray, axis: int = -1) -> ChannelStats:
    rows = np.moveaxis(x.astype(np.float64), axis, -1).reshape(-1, x.shape[axis])
    return ChannelStats(rows.min(0), rows.max(0), rows.mean(0), (rows**2).mean(0), rows.shape[0])


def outlier_x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    x = rng_array(shape, seed)
    x[..., 1] *= 30.0  # one outlier channel
    return x


def ln_model() -> onnx.ModelProto:
    c = 6
    gamma = np.ones(c, np.float32)
    gamma[1] = 30.0
    return build(
        HEADER
        + """
        g (float[4,6] x) => (float[4,5] y) {
            n = LayerNormalization <axis=-1> (x, gamma, beta)
            y = MatMul (n, W)
        }""",
        {"gamma": gamma, "beta": rng_array((c,), 1), "W": rng_array((c, 5), 2)},
    )


def test_layernorm_factors_match_the_formula() -> None:
    m = ln_model()
    x = rng_array((4, 6), 3)
    n = build(HEADER + """
        g (float[4,6] x) => (float[4,6] n) { n = LayerNormalization <axis=-1> (x, gamma, beta) }""",
              {t.name: numpy_helper.to_array(t) for t in m.graph.initializer if t.name != "W"})
    st = stats_of(run(n, {"x": x})[0])
    assert smooth_sites(m) == {"n": "last"}
    res = smooth(m, {"n": st}, alpha=0.5)
    assert len(res.changes) == 1 and res.exact
    w0 = numpy_helper.to_array(m.graph.initializer[2]).astype(np.float64)
    s = np.sqrt(st.absmax) / np.sqrt(np.abs(w0).max(axis=1))
    new = {t.name: numpy_helper.to_array(t) for t in res.model.graph.initializer}
    np.testing.assert_allclose(new["W"], w0 * s[:, None], rtol=1e-5)
    np.testing.assert_allclose(new["gamma"], numpy_helper.to_array(m.graph.initializer[0]) / s, rtol=1e-5)
    assert_same_outputs(m, res.model, {"x": x}, rel=1e-5)
    # the smoothed tensor's channel ranges are max|X_j| / s_j: the outlier is gone
    smoothed = build(HEADER + """
        g (float[4,6] x) => (float[4,6] n) { n = LayerNormalization <axis=-1> (x, gamma, beta) }""",
                     {k: v for k, v in new.items() if k != "W"})
    got = stats_of(run(smoothed, {"x": x})[0]).absmax
    np.testing.assert_allclose(got, st.absmax / s, rtol=1e-4)


def test_decomposed_layernorm_tail_into_two_readers() -> None:
    m = build(
        HEADER
        + """
        g (float[4,6] x) => (float[4,5] y, float[4,3] z) {
            t = Mul (x, gamma)
            n = Add (t, beta)
            y = Gemm <transB=1> (n, W1, C1)
            z = MatMul (n, W2)
        }""",
        {"gamma": rng_array((6,), 1), "beta": rng_array((6,), 2), "W1": rng_array((5, 6), 3),
         "C1": rng_array((5,), 4), "W2": rng_array((6, 3), 5)},
    )
    x = outlier_x((4, 6))
    gamma = numpy_helper.to_array(m.graph.initializer[0])
    beta = numpy_helper.to_array(m.graph.initializer[1])
    res = smooth(m, {"n": stats_of(x * gamma + beta)}, alpha=0.7)
    assert len(res.changes) == 1 and "into Gemm:y, MatMul:z" in res.changes[0].detail
    assert_same_outputs(m, res.model, {"x": x}, rel=1e-5)


def test_conv_into_conv_and_unfolded_batchnorm() -> None:
    m = build(
        HEADER
        + """
        g (float[1,3,6,6] x, float[1,4,6,6] r) => (float[1,5,6,6] y, float[1,2,6,6] z) {
            a = Conv <pads=[1,1,1,1]> (x, W1, B1)
            y = Conv (a, W2)
            a2 = Conv (x, W3)
            s = Add (a2, r)
            b = BatchNormalization (s, g, be, mu, var)
            z = Conv (b, W4)
        }""",
        {"W1": rng_array((4, 3, 3, 3), 1), "B1": rng_array((4,), 2), "W2": rng_array((5, 4, 1, 1), 3),
         "W3": rng_array((4, 3, 1, 1), 4), "g": rng_array((4,), 5, 0.5, 2), "be": rng_array((4,), 6),
         "mu": rng_array((4,), 7), "var": rng_array((4,), 8, 0.5, 2), "W4": rng_array((2, 4, 1, 1), 9)},
    )
    r = rng_array((1, 4, 6, 6), 11)
    r[:, 2] *= 30
    feeds = {"x": rng_array((1, 3, 6, 6), 10), "r": r}
    assert smooth_sites(m) == {"a": "conv", "b": "conv"}
    a = np.ones((1, 4, 6, 6), np.float32)
    a[:, 2] = 20
    st = {"a": stats_of(a, 1), "b": stats_of(a * 2, 1)}
    res = smooth(m, st, alpha=0.5)
    assert len([c for c in res.changes if c.rewrite == "smooth"]) == 2
    assert_same_outputs(m, res.model, feeds, rel=1e-5)


def test_alpha_chosen_and_refused_when_nothing_helps() -> None:
    m = ln_model()
    x = outlier_x((4, 6))
    chosen = smooth(m, {"n": stats_of(x)})
    assert "(chosen)" in chosen.changes[0].detail
    flat = ChannelStats(np.full(6, -1.0), np.full(6, 1.0), np.zeros(6), np.full(6, 0.3), 10)
    uniform = build(HEADER + """
        g (float[4,6] x) => (float[4,5] y) {
            n = LayerNormalization <axis=-1> (x, gamma, beta)
            y = MatMul (n, W)
        }""", {"gamma": np.ones(6, np.float32), "beta": np.zeros(6, np.float32),
               "W": np.ones((6, 5), np.float32)})
    res = smooth(uniform, {"n": flat})
    assert not res.changes and "lowers the estimated int8 noise" in res.refusals[0].reason


def test_reader_that_is_not_a_weight_layer_is_no_site() -> None:
    m = build(HEADER + """
        g (float[4,6] x) => (float[4,5] y, float[4,6] s) {
            n = LayerNormalization <axis=-1> (x, gamma, beta)
            y = MatMul (n, W)
            s = Sigmoid (n)
        }""", {"gamma": rng_array((6,), 1), "beta": rng_array((6,), 2), "W": rng_array((6, 5), 3)})
    assert smooth_sites(m) == {}


def test_runner_needs_calib() -> None:
    from quantscan.errors import UsageError

    with pytest.raises(UsageError, match="expected --calib"):
        rewrite(ln_model(), ["smooth"], write=False)


@pytest.mark.real
@pytest.mark.parametrize("name", ["ppocrv4_rec", "ppocr_mobile_v2_cls"])
def test_asset_models_exact(assets, name: str) -> None:  # type: ignore[no-untyped-def]
    loaded = load_model(asset_model(assets, name))
    calib = load_calibration(asset_calib(assets, name), loaded.inputs, limit=4)
    stats = channel_stats(loaded.proto, smooth_sites(loaded.proto), calib)
    res = smooth(loaded.proto, stats)
    assert any(c.rewrite == "smooth" for c in res.changes)
    onnx.checker.check_model(res.model, full_check=True)
    # the runner's own path (statistics, pass, proof) holds the goal's 1e-5 of the output range
    report = rewrite(asset_model(assets, name), ["smooth"], calib=calib, tolerance=1e-5, write=False)
    assert report.passed, [(o.output, o.max_rel) for o in report.proof.outputs]
    assert all(o.max_rel <= 1e-5 for o in report.proof.outputs)
