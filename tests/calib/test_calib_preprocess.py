"""quantscan.calib.preprocess: a missing, unreadable or malformed preprocessing contract is one
error line naming the file's key or the flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from calib_helpers import BASE_PRE, IMG_SPEC, image_folder, spec

from quantscan.calib import load_calibration
from quantscan.errors import CalibrationError, UsageError

# --- preprocessing: bad input ----------------------------------------------------------------------------


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
        ({"std": [1, 0, 1]}, r"'std': expected positive"),
        ({"std": [1, -0.5, 1]}, r"'std': expected positive"),
        ({"shape": [1, 3, 0, 0]}, r"'shape': expected positive dims"),
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


FREE_SPEC = spec("x", ("batch", 3, "h", "w"))


def test_resize_is_bounded_by_the_documented_limit(tmp_path: Path) -> None:
    """A 100000² resize would allocate ~120 GB: refused before any image is decoded."""
    from quantscan.calib.preprocess import MAX_IMAGE_SIDE

    folder = image_folder(tmp_path, n=1, pre=BASE_PRE | {"shape": [1, 3, 100000, 100000]})
    with pytest.raises(CalibrationError, match=f"at most {MAX_IMAGE_SIDE} pixels"):
        load_calibration(folder, [FREE_SPEC])


@pytest.mark.parametrize("entry", ["../outside.png", "/etc/passwd", "sub/../../x.png", ".."])
def test_files_entries_stay_in_the_folder(tmp_path: Path, entry: str) -> None:
    folder = image_folder(tmp_path, n=1, pre=BASE_PRE | {"files": [entry]})
    with pytest.raises(CalibrationError, match="may not leave the folder"):
        load_calibration(folder, [IMG_SPEC])
