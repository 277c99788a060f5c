"""A profile without per-channel weight scales (`per_channel_weights = false`: neutron, tda4-tidl, hailo8) is
scanned with one weight scale per tensor: a Conv whose output channels span very different ranges
loses its small channel there, as the chip does (issue 44: NXP Neutron's NeutronQuantizer is
per-tensor). The oracle is the per-tensor and per-channel symmetric int8 formulas written in numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

import quantscan
from quantscan import quant
from quantscan.api import save_scan

GRAPH = """<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 4, 6, 6] x) => (float[N, 2, 6, 6] y) {
    y = Conv <kernel_shape = [1, 1]> (x, w, b)
}"""


def spread_weights() -> np.ndarray:
    """Output channel 0 ~ N(0, 1), channel 1 ~ N(0, 0.002): a 500x range spread between channels."""
    rng = np.random.default_rng(1)
    w = rng.normal(0, 1, (2, 4, 1, 1)).astype(np.float32)
    w[1] *= 0.002
    return w


def numpy_fake_quant(w: np.ndarray, per_channel: bool) -> np.ndarray:
    """Symmetric int8: scale = absmax / 127 (over each output channel, or the whole tensor)."""
    absmax = np.abs(w).reshape(w.shape[0], -1).max(axis=1)
    if not per_channel:
        absmax = np.full_like(absmax, np.abs(w).max())
    scale = (absmax / 127.0).astype(np.float32).reshape(-1, 1, 1, 1)
    return (np.clip(np.rint(w / scale), -127, 127) * scale).astype(np.float32)


def sqnr_db(ref: np.ndarray, test: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - test).astype(np.float64) ** 2)))


@pytest.mark.parametrize("per_channel", [True, False])
def test_weight_qparams_matches_the_numpy_formula(per_channel: bool) -> None:
    w = spread_weights()
    qp = quant.weight_qparams(w, 0, per_channel=per_channel)
    np.testing.assert_array_equal(quant.fake_quant(w, qp), numpy_fake_quant(w, per_channel))
    assert qp.axis == 0 and (len(set(qp.scale.tolist())) == 1) is (not per_channel)


def write_case(tmp_path: Path) -> tuple[Path, Path]:
    model = onnx.parser.parse_model(GRAPH)
    model.graph.initializer.extend([onnx.numpy_helper.from_array(spread_weights(), "w"),
                                    onnx.numpy_helper.from_array(np.zeros(2, np.float32), "b")])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        np.savez(calib / f"{i:03d}.npz", x=rng.normal(0, 1, (1, 4, 6, 6)).astype(np.float32))
    return path, calib


def test_neutron_scans_per_tensor_weights_and_ax650_per_channel(tmp_path: Path) -> None:
    """Both chips quantize activations as uint8; only the weight scales differ. The small channel's
    weight SQNR in layers.csv is the numpy per-tensor figure under neutron, the per-channel one under
    ax650, and run.json's chip says which."""
    model, calib = write_case(tmp_path)
    w = spread_weights()
    for profile, per_channel in (("neutron", False), ("ax650", True)):
        result = quantscan.scan(model, calib, profile=profile, gain_candidates=0)
        (row,) = result.layers[result.layers["op_type"] == "Conv"].to_dict("records")
        expected = sqnr_db(w[1], numpy_fake_quant(w, per_channel)[1])
        assert row["weight_worst_channel_sqnr_db"] == pytest.approx(expected, abs=1e-3), profile
        assert result.run_info.chip["per_channel_weights"] is per_channel
        save_scan(result, tmp_path / profile)
        summary = (tmp_path / profile / "summary.md").read_text(encoding="utf-8")
        said = "weights int8 per output channel" if per_channel else "weights int8 per tensor (profile neutron"
        assert said in summary, profile
    assert sqnr_db(w[1], numpy_fake_quant(w, False)[1]) < 20 < sqnr_db(w[1], numpy_fake_quant(w, True)[1])


@pytest.mark.real
def test_real_model_per_tensor_weights_on_neutron(assets: Path) -> None:
    """MTCNN RNet: under neutron every Conv/Gemm weight has one scale (channels.csv weight_absmax equal
    across its channels) and no site's worst weight channel is better than under ax650's per-channel
    scales; some are much worse (the spread per-tensor scales pay for)."""
    model = assets / "models" / "mtcnn_rnet.onnx"
    calib = assets / "calib" / "mtcnn_rnet"
    neutron = quantscan.scan(model, calib, profile="neutron", limit=4, gain_candidates=0)
    ax650 = quantscan.scan(model, calib, profile="ax650", limit=4, gain_candidates=0)
    absmax = neutron.channels.dropna(subset=["weight_absmax"]).groupby("node")["weight_absmax"]
    assert len(absmax) >= 4 and (absmax.nunique() == 1).all()
    key = ["node", "weight_worst_channel_sqnr_db"]
    both = neutron.layers[key].merge(ax650.layers[key], on="node", suffixes=("_tensor", "_channel")).dropna()
    assert len(both) >= 4
    worse = both["weight_worst_channel_sqnr_db_channel"] - both["weight_worst_channel_sqnr_db_tensor"]
    assert (worse >= -1e-6).all() and worse.max() > 3.0
