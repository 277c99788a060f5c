"""Seeded mutants of the files issue 42 put behind quantscan.readers: device dump folders (npy, RKNN,
tpu-mlir), vendor driver results (what a killed toolkit or the wrong interpreter leaves), and plan.json.

Used by tests/file_mutants.py (kinds `dumps`, `vendor`, `plan`). The base folders are made once by
`build_reader_base`; each mutant copies one, damages one file in it (or the map's names, or a scale's
shape) and names the command that reads it. The damage is made with numpy's format writer, zipfile and
plain bytes, never with quantscan's readers.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import stat
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TOOL_TARGETS = {"rknn": "rk3588", "tpu-mlir": "bm1684x"}
IMPORT_MODULES = {"rknn": "rknn.api", "tpu-mlir": "tpu_mlir"}
IMPORTED = "quantscan-imported"  # what quantscan.toolchains.interpreter's probe looks for


ERROR_ANALYSIS = """layer_name                     simulator_error
                            entire              single
                         cos      euc        cos      euc
----------------------------------------------------------------
[Input] x              1.00000 | 0.00000   1.00000 | 0.00000
[Conv] c               0.99000 | 2.07375   0.99000 | 2.07375
[Relu] y               0.98000 | 9.55582   0.99000 | 9.55582
"""
"""RKNN-Toolkit2 2.5.0's error_analysis.txt layout (tests/fixtures/vendor), for the two layers of the model."""


@dataclass
class ReaderBase:
    """Valid dump folders per format and valid driver payloads per tool."""

    dumps: dict[str, Path]
    payloads: dict[str, Path]


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def build_reader_base(root: Path) -> ReaderBase:
    """Dumps of the base Conv model (tensors c, y; 4 samples) in the three formats, and result folders."""
    rng = np.random.default_rng(0)
    t = {k: rng.normal(size=(1, 2, 4, 4)).astype(np.float32) for k in ("c", "y")}
    npy = root / "dumps_npy"
    npy.mkdir(parents=True)
    for i in range(4):
        (npy / f"{i:03d}.npz").write_bytes(_npz_bytes(**t))
    tpu = root / "dumps_tpu"
    tpu.mkdir()
    for i in range(2):
        (tpu / f"{i:03d}.npz").write_bytes(_npz_bytes(
            c_Conv=np.round(t["c"] * 16).astype(np.int8), c_Conv_scale=np.float32(1 / 16),
            c_Conv_zero_point=np.int32(0), y_Relu_f32=t["y"]))
    rknn = root / "dumps_rknn"
    for i in range(2):
        sample = rknn / f"{i:03d}"
        (sample / "simulator" / "npy").mkdir(parents=True)
        for k, name in enumerate(("c", "y")):
            np.save(sample / "simulator" / "npy" / f"{k}_{name}.npy", t[name])
        (sample / "map_name_to_file.txt").write_text("layer_name file_name\n" + "-" * 20 + "\nc 0_c.txt\ny 1_y.txt\n")
        (sample / "error_analysis.txt").write_text(ERROR_ANALYSIS)
    return ReaderBase({"npy": npy, "tpu-mlir": tpu, "rknn": rknn}, _payloads(root, t))


def _payloads(root: Path, t: dict[str, np.ndarray]) -> dict[str, Path]:
    """What each tool's driver leaves in its work folder when it succeeds."""
    out = {}
    for tool, stages in (("tpu-mlir", ["model_transform", "run_calibration", "model_deploy", "model_runner"]),
                         ("rknn", ["load_onnx", "build", "simulator", "accuracy_analysis"])):
        folder = root / f"payload_{tool}"
        folder.mkdir()
        result = {"stages": stages, "error": None, "times": {"total_s": 1.5}, "version": "9.9.9"}
        if tool == "rknn":
            result["analysis"] = ["error_analysis_0.txt"]
            (folder / "error_analysis_0.txt").write_text(ERROR_ANALYSIS)
            (folder / "map_name_to_file.txt").write_text("c 0_c.txt\ny 1_y.txt\n")
            sums = {"0_c": [1.0, 1.0, 1.0, 0.0, 32], "1_y": [0, 1, 2, 1, 32]}
            (folder / "entire_sums.json").write_text(json.dumps(sums))
        else:
            (folder / "entire_sums.json").write_text(json.dumps({"c_Conv": [1.0, 1.0, 1.0, 0.0, 32]}))
        (folder / "result.json").write_text(json.dumps(result, indent=1))
        (folder / "sim_outputs.npz").write_bytes(_npz_bytes(**{f"{i}:0": t["y"] for i in range(4)}))
        out[tool] = folder
    return out


# --- damage ----------------------------------------------------------------------------------------------


def npy_damage(rng: random.Random, shape: tuple[int, ...] = (1, 2, 4, 4)) -> tuple[bytes, str]:
    """A .npy stream with a lying or odd header: claims, dtypes, versions, cut data."""
    descr, version, data_len, what = "<f4", (1, 0), None, ""
    roll = rng.random()
    if roll < 0.25:
        shape, data_len, what = (rng.choice((10**10, 2**40, 10**6)), *shape[1:]), 128, "claims many"
    elif roll < 0.45:
        descr, what = rng.choice(["|O", "<U8", "<M8[s]", "V8", "<c8", "|b1", ">f8", "<f2"]), "dtype"
    elif roll < 0.6:
        version, what = rng.choice([(3, 0), (0, 1), (2, 0), (255, 255)]), "version"
    elif roll < 0.8:
        data_len, what = rng.randrange(0, 128), "data cut"
    else:
        shape, what = rng.choice([(), (0,), (2, 3), (1, 2, 4, 4, 1), (-1, 2)]), "shape"
    buf = io.BytesIO()
    header = {"descr": descr, "fortran_order": rng.random() < 0.1, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)  # type: ignore[no-untyped-call]
    raw = bytearray(buf.getvalue())
    raw[6:8] = bytes(version)
    n = int(np.prod([max(d, 0) for d in shape], dtype=np.float64)) if shape else 1
    body = bytes(min(n * np.dtype(descr).itemsize, 1 << 16) if data_len is None else data_len)
    return bytes(raw) + body, f"npy({what})"


def file_damage(data: bytes, rng: random.Random, key: str) -> tuple[bytes | None, str]:
    """Damage to a whole file (None: make it a symlink to /dev/zero)."""
    roll = rng.random()
    if roll < 0.1:
        return b"", "empty"
    if roll < 0.2:
        return None, "symlink to /dev/zero"
    if roll < 0.35:
        return data[: rng.randrange(len(data) or 1)], "truncated"
    if roll < 0.5:
        buf = bytearray(data)
        for _ in range(rng.randrange(1, 30)):
            if buf:
                buf[rng.randrange(len(buf))] = rng.randrange(256)
        return bytes(buf), "bytes flipped"
    if roll < 0.55:
        return b"not a zip at all\n" * rng.randrange(1, 4), "not a zip"
    out = io.BytesIO()
    member, what = npy_damage(rng)
    with zipfile.ZipFile(out, "w", rng.choice((zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED))) as zf:
        zf.writestr(f"{key}.npy", member)
    return out.getvalue(), f"npz member {what}"


def _write(path: Path, data: bytes | None) -> None:
    path.unlink(missing_ok=True)
    if data is None:
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(data)


MAP_LINES = ["c ../../secret.txt", "c /etc/passwd.txt", "c link/0_c.txt", "c 0_c.txt extra", "c .txt", "c ..txt",
             "c " + "a" * 5000 + ".txt", "c \\..\\x.txt", "c\t0_c.txt", "y 0_c.txt"]


def damage_dumps(base: ReaderBase, folder: Path, rng: random.Random) -> tuple[str, str]:
    """(format, what was done) after damaging a copy of one base dump folder at `folder`."""
    fmt = rng.choice(["npy", "tpu-mlir", "rknn"])
    shutil.copytree(base.dumps[fmt], folder, symlinks=True)
    if fmt == "rknn":
        return fmt, _damage_rknn(folder / rng.choice(["000", "001"]), rng)
    target = folder / "000.npz"
    if fmt == "tpu-mlir" and rng.random() < 0.4:
        return fmt, _damage_scale(target, rng)
    data, what = file_damage(target.read_bytes(), rng, rng.choice(["c", "y", "c_Conv", "c_Conv_scale"]))
    _write(target, data)
    return fmt, what


def _damage_scale(target: Path, rng: random.Random) -> str:
    arrays = {"c_Conv": np.zeros((1, 2, 4, 4), np.int8)}
    scale_shape = rng.choice([(5,), (2,), (1, 2, 1, 1), (2, 1, 1), (), (1, 2, 4, 4, 1), (4,), (0,)])
    for name in rng.sample(["c_Conv_scale", "c_Conv_zero_point"], rng.randrange(1, 3)):
        kind = rng.choice(["f", "i", "U"])
        arrays[name] = (np.full(scale_shape, "s") if kind == "U" else np.ones(scale_shape, np.float32 if kind == "f"
                                                                               else np.int32))
    target.write_bytes(_npz_bytes(**arrays))
    return f"tpu-mlir quant params {sorted(arrays)} shape {list(scale_shape)}"


def _damage_rknn(sample: Path, rng: random.Random) -> str:
    roll = rng.random()
    tensors = sample / "simulator" / "npy"
    if roll < 0.35:
        lines = ["layer_name file_name", *rng.sample(MAP_LINES, rng.randrange(1, 4))]
        (tensors / "link").symlink_to(sample.parent.parent)
        (sample / "map_name_to_file.txt").write_text("\n".join(lines) + "\n")
        return f"rknn map lines {lines[1:]}"[:200]
    if roll < 0.5:
        (sample / "map_name_to_file.txt").write_bytes(rng.choice([b"c 0_c.txt\n\xff\xfe\n", "c Größe.txt\n".encode(
            "latin-1"), b"\x00" * 64, b""]))
        return "rknn map bytes"
    if roll < 0.6:
        (sample / "error_analysis.txt").write_bytes(rng.choice([b"\xff" * 20, b"[Conv] c nan x\n", b"[Relu]\n" * 9]))
        return "rknn error_analysis"
    target = tensors / "0_c.npy"
    if rng.random() < 0.5:
        data, what = npy_damage(rng)
        _write(target, data)
        return f"rknn {what}"
    data2, what = file_damage(target.read_bytes(), rng, "c")
    _write(target, data2)
    return f"rknn npy {what}"


def fake_toolkit(folder: Path, tool: str, payload: Path) -> Path:
    """A `python` that passes the toolkit import probe and, run as the driver, copies `payload` (a damaged
    driver output) into its working folder, as if the toolkit had written it."""
    script = folder / f"python-{tool}"
    script.write_text("#!/bin/sh\n"
                      f'if [ "$1" = "-c" ]; then echo "{IMPORTED}-{IMPORT_MODULES[tool]}"; exit 0; fi\n'
                      f'cp -R "{payload}/." .\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def damage_payload(base: ReaderBase, folder: Path, rng: random.Random,
                   mutate_json: Callable[[str, random.Random], tuple[str, str]]) -> tuple[str, str]:
    """(tool, what was done) after damaging a copy of one tool's driver output at `folder`."""
    tool = rng.choice(["tpu-mlir", "rknn"])
    shutil.copytree(base.payloads[tool], folder)
    name = rng.choice(["result.json"] * 3 + ["entire_sums.json", "sim_outputs.npz"]
                      + (["error_analysis_0.txt", "map_name_to_file.txt"] if tool == "rknn" else []))
    target = folder / name
    if name.endswith(".json"):
        text, what = mutate_json(target.read_text(), rng)
        if rng.random() < 0.2:
            text, what = text[: rng.randrange(len(text) or 1)], "killed mid-write"
        target.write_text(text)
    elif name.endswith(".npz"):
        data, what = file_damage(target.read_bytes(), rng, "0:0")
        _write(target, data)
    else:
        target.write_bytes(rng.choice([b"\xff\xfe" * 10, b"", b"c ../../x.txt\n", b"[Conv] c 1e999 nan\n" * 3]))
        what = "text"
    return tool, f"{tool} {name} {what}"
