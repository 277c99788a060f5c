"""quantscan.readers against independent oracles: numpy's own loader for valid arrays, a recursive depth
count for JSON nesting, json.loads for valid JSON; and every damaged input refused as one FileError."""

from __future__ import annotations

import io
import json
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantscan.errors import FileError
from quantscan.readers.arrays import read_npy, read_npz
from quantscan.readers.jsonfile import json_depth, parse_json, read_json
from quantscan.readers.text import inside, read_text


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 6 or roll < 0.3:
        return rng.choice([1, -2.5, "a[b]{c}", 'q"[', "\\", '\\"]', "\\\\[", 'x\\\\"{', "\n]", None, True, ""])
    if roll < 0.65:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}[": _random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def _depth_oracle(value: Any) -> int:
    """Nesting written out recursively: an array or object is one level above its deepest member."""
    if isinstance(value, list):
        return 1 + max((_depth_oracle(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth_oracle(v) for v in value.values()), default=0)
    return 0


def test_json_depth_matches_a_recursive_count_with_brackets_inside_strings() -> None:
    rng = random.Random(3)
    for _ in range(300):
        value = _random_value(rng)
        assert json_depth(json.dumps(value)) == _depth_oracle(value)
        assert parse_json(json.dumps(value)) == json.loads(json.dumps(value))


@pytest.mark.parametrize("text", ["1" * 5000, "[" * 101 + "]" * 101, "[" * 100_000, '{"a": 1', "", b"\xff\xfe{}",
                                  '{"a": "\\ud800"} x'])
def test_every_json_failure_is_a_decode_error(text: str | bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        parse_json(text)


def test_json_at_the_depth_limit_parses() -> None:
    assert parse_json("[" * 100 + "]" * 100) == json.loads("[" * 100 + "]" * 100)


@pytest.mark.parametrize("content", [b"1" * 5000, b"[" * 600 + b"]" * 600, b'{"a": 1', b"\xff"])
def test_read_json_refuses_with_one_line_naming_the_file(content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(FileError) as info:
        read_json(path, "thing")
    assert str(info.value).startswith("thing: expected") and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


@pytest.mark.parametrize("compressed", [False, True])
def test_read_npz_equals_numpy(compressed: bool, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {"a": rng.normal(size=(3, 4)).astype(np.float32), "b": np.asfortranarray(rng.integers(0, 9, (2, 5))),
              "c": np.array(3.5), "d": np.zeros((0, 2), np.int8), "e": rng.normal(size=4) > 0}
    path = tmp_path / "x.npz"
    (np.savez_compressed if compressed else np.savez)(path, **arrays)  # type: ignore[operator]
    got = read_npz(path, "x")
    with np.load(path) as expected:
        assert sorted(got) == sorted(expected.files)
        for key in expected.files:
            assert got[key].dtype == expected[key].dtype and np.array_equal(got[key], expected[key])


def test_read_npy_equals_numpy(tmp_path: Path) -> None:
    a = np.asfortranarray(np.arange(24, dtype=np.float64).reshape(2, 3, 4))
    np.save(tmp_path / "a.npy", a)
    assert np.array_equal(read_npy(tmp_path / "a.npy", "a"), np.load(tmp_path / "a.npy"))


def _claiming_npz(shape: tuple[int, ...], data: bytes) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("x.npy", buf.getvalue() + data)
    return out.getvalue()


def test_a_header_claiming_more_than_the_file_holds_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "x.npz"
    path.write_bytes(_claiming_npz((10**10,), bytes(64)))
    with pytest.raises(FileError, match="40000000000 bytes"):
        read_npz(path, "x", budget=1 << 20)


def test_an_honest_archive_over_the_budget_is_refused(tmp_path: Path) -> None:
    path = _npz(tmp_path / "x.npz", a=np.zeros(1000, np.float32))
    with pytest.raises(FileError, match="budget"):
        read_npz(path, "x", budget=3999)
    assert read_npz(path, "x", budget=4000)["a"].shape == (1000,)


def test_pickled_objects_are_refused(tmp_path: Path) -> None:
    path = _npz(tmp_path / "x.npz", a=np.array([{"k": 1}], dtype=object))
    with pytest.raises(FileError, match="object"):
        read_npz(path, "x")
    np.save(tmp_path / "o.npy", np.array([None], dtype=object))
    with pytest.raises(FileError, match="object"):
        read_npy(tmp_path / "o.npy", "x")


def test_a_truncated_npy_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros(100, np.float32))
    (tmp_path / "a.npy").write_bytes((tmp_path / "a.npy").read_bytes()[:-10])
    with pytest.raises(FileError, match="truncated"):
        read_npy(tmp_path / "a.npy", "x")


def test_devices_and_folders_are_not_files(tmp_path: Path) -> None:
    (tmp_path / "z.npz").symlink_to("/dev/zero")
    for path in (tmp_path / "z.npz", tmp_path):
        with pytest.raises(FileError, match="regular file"):
            read_npz(path, "x")
    with pytest.raises(FileError, match="regular file"):
        read_text(tmp_path / "z.npz", "x")


def test_text_in_another_encoding_is_refused_naming_the_byte(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_bytes("Größe".encode("latin-1"))
    with pytest.raises(FileError, match="0xf6 at offset 2"):
        read_text(tmp_path / "t.txt", "x")
    (tmp_path / "u.txt").write_bytes("\ufeffGröße".encode())
    assert read_text(tmp_path / "u.txt", "x") == "Größe"


def test_names_inside_files_stay_inside_their_folder(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    (folder / "sub").mkdir(parents=True)
    (folder / "out").symlink_to(tmp_path)
    (folder / "in").symlink_to(folder / "sub")
    assert inside(folder, "sub/a.npy", "x") == folder / "sub" / "a.npy"
    assert inside(folder, "in/a.npy", "x") == folder / "in" / "a.npy"
    for name in ("../a.npy", "sub/../../a.npy", "/etc/passwd", "C:\\x.npy", "..\\a.npy", "out/a.npy", "", "a\0b",
                 "a" * 300 + ".npy"):
        with pytest.raises(FileError):
            inside(folder, name, "x")
