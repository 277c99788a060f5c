"""quantscan.calib.tensors: .npy/.npz folders feed inputs by name, split into samples, cast
only losslessly and are checked for NaN/Inf as they are read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from calib_helpers import F32, I64, all_samples, spec

from quantscan.calib import load_calibration
from quantscan.errors import CalibrationError

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
