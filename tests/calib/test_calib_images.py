"""quantscan.calib.images: image preprocessing against an independent numpy oracle, file order
and keys, and bad image files named at load or when decoded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from calib_helpers import BASE_PRE, IMG_SPEC, all_samples, image_folder, oracle, rgb, spec, write_json, write_png
from PIL import Image

from quantscan.calib import load_calibration
from quantscan.errors import CalibrationError, UsageError

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


# --- images: bad files -------------------------------------------------------------------------------


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
