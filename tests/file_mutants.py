"""Seeded mutants of the files quantscan reads besides models, and of the paths it writes to.

Shared by tests/test_fuzz_files.py and benchmarks/fuzz.py (`--inputs files`). One base sandbox is
built once with real commands (a tiny Conv model, an .npz and an image calibration folder, a scan run
folder with a bisect session in it, a case library, vendor logs from tests/fixtures); each mutant
copies the one file it damages into a fresh folder, so a run costs one in-process CLI call
(tests/mutants.py's worker) plus the copy. Kinds:

- `session`, `run_json`, `layers_csv`, `case`, `preprocess`: JSON/CSV values retyped, deleted,
  nested 100,000 deep, truncated; a mutated session gets its digest recomputed half the time, so
  wrong types also reach past the integrity check;
- `log`: a vendor log with lines dropped, repeated, cut, numbers replaced, bytes flipped;
- `npz`: an .npz whose .npy header claims another shape (10^6 samples, 10^12 elements), dtype, order,
  or whose data is cut short, or a compressed member of zeros far bigger than its file;
- `dumps`, `vendor`, `plan` (tests/reader_mutants.py, issue 42): a device dump folder (npy, RKNN,
  tpu-mlir) with one file damaged, its map's names leading outside, or a scale of the wrong shape,
  through `dumps`; a vendor driver's result.json / entire_sums.json / sim_outputs.npz damaged (a killed
  toolkit, the wrong interpreter) through `vendor` with a stand-in interpreter; plan.json mutated
  through overlay, case save, report and bundle;
- `out_path`: a writing command (overlay, rewrite, scan --save-qdq, extract, bundle, check/log/compare
  --out) pointed at an input, a user's own file, a file where a folder is expected, a path under a
  file, a read-only location, a symlink loop, the calibration folder.

Every file that existed in the sandbox before a run is hashed; a changed one is an overwrite.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.parser
from onnx import numpy_helper

from reader_mutants import ReaderBase, build_reader_base, damage_dumps, damage_payload, fake_toolkit

KINDS = ("session", "run_json", "layers_csv", "case", "preprocess", "log", "npz", "out_path", "dumps", "vendor", "plan")
ODD_VALUES: tuple[Any, ...] = (None, True, 0, -1, 2**63, 1e308, "nan", "", "x", [], {}, [1, "a"], {"a": 1})

CONV = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 3, 4, 4] x) => (float[N, 2, 4, 4] y) {
  c = Conv (x, w)
  y = Relu (c)
}
"""


@dataclass
class Base:
    """The sandbox every mutant starts from (built once)."""

    root: Path
    model: Path
    calib: Path
    images: Path
    run: Path
    cases: Path
    logs: list[Path]
    readers: ReaderBase | None = None
    record: Path | None = None
    """A rewrite record (`rewrite --opset 14`), for `case save --rewrite`."""


def _cli(src: Path, *argv: str | Path) -> None:
    done = subprocess.run([sys.executable, "-m", "quantscan", *map(str, argv)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    if done.returncode not in (0, 1):
        raise RuntimeError(f"building the fuzz sandbox: quantscan {' '.join(map(str, argv))}: {done.stderr}")


def build_base(root: Path, src: Path, repo: Path) -> Base:
    """Model, data, a scan + bisect run folder, a case library and vendor logs, made by real commands."""
    root.mkdir(parents=True, exist_ok=True)
    model = onnx.parser.parse_model(CONV)
    weight = np.random.default_rng(0).normal(size=(2, 3, 1, 1)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(weight, "w"))
    model.graph.node[0].name = "conv"
    path = root / "m.onnx"
    onnx.save(model, str(path))
    calib = root / "calib"
    calib.mkdir()
    np.savez(calib / "data.npz", x=np.random.default_rng(1).normal(size=(4, 3, 4, 4)).astype(np.float32))
    images = root / "images"
    images.mkdir()
    from PIL import Image

    for k in range(2):
        pixels = np.random.default_rng(k).integers(0, 255, size=(6, 6, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images / f"{k}.png")
    (images / "preprocess.json").write_text(json.dumps(
        {"input": "x", "shape": [1, 3, 4, 4], "layout": "NCHW", "channel_order": "RGB", "resize": "stretch",
         "scale": 0.00392156862745098,
         "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}))
    run = root / "run"
    _cli(src, "scan", path, "--calib", calib, "--out", run, "--quiet", "--profile", "generic-npu")
    _cli(src, "bisect", path, "--calib", calib, "--target-cosine", "0.99999", "--out", run, "--quiet")
    cases = root / "cases"
    case = {"format": 1, "id": "m-abc123", "note": "a note", "created": "2026-01-01T00:00:00Z",
            "profile": "generic-npu", "recipe": ["div-to-mul"], "opset": None,
            "pattern": [{"profile": "generic-npu", "op_type": "Conv", "rule": "x", "attribute": ""}],
            "rewrites": [{"file": "proofs/r.json", "steps": ["div-to-mul"], "proof": "ok"}],
            "model": {}, "metrics_after": {}}
    (cases / "m-abc123").mkdir(parents=True)
    (cases / "m-abc123" / "case.json").write_text(json.dumps(case, indent=1))
    logs = sorted(p for p in (repo / "tests" / "fixtures" / "vendorlog").rglob("*.log") if p.stat().st_size < 400_000)
    _cli(src, "rewrite", path, "--opset", "14", "-o", root / "r.onnx")
    return Base(root, path, calib, images, run, cases, logs[:8], build_reader_base(root / "readers"),
                root / "r.onnx.rewrite.json")


# --- mutators ------------------------------------------------------------------------------------------------


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for k, v in enumerate(value[:20]):
            yield from _paths(v, (*prefix, k))


def mutate_json(text: str, rng: random.Random) -> tuple[str, str]:
    """(new text, what was done): a value retyped or deleted, deep nesting, or the text cut."""
    roll = rng.random()
    if roll < 0.08:
        return text[: rng.randrange(len(text) or 1)], "json(truncate)"
    if roll < 0.16:
        depth = rng.choice((600, 1000, 100_000))
        return "[" * depth + "]" * depth, f"json(deep {depth})"
    data = json.loads(text)
    if roll < 0.22:  # json.dumps cannot write it (Python's int digit limit): splice it into the text
        where = rng.choice(list(_paths(data)))
        if where:
            parent = data
            for k in where[:-1]:
                parent = parent[k]
            parent[where[-1]] = "__BIG__"
            return json.dumps(data).replace('"__BIG__"', "7" * 5000, 1), f"json(5000-digit int at {where[-1]})"
    where = rng.choice(list(_paths(data)))
    if not where:
        return json.dumps(rng.choice(ODD_VALUES)), "json(root)"
    parent = data
    for k in where[:-1]:
        parent = parent[k]
    if rng.random() < 0.25 and isinstance(parent, dict):
        del parent[where[-1]]
        return json.dumps(data), f"json(del {where[-1]})"
    if rng.random() < 0.1:  # json.dumps would recurse: splice the nesting into the text
        depth = rng.choice((100, 100_000))
        parent[where[-1]] = "__DEEP__"
        text = json.dumps(data).replace('"__DEEP__"', "[" * depth + "]" * depth, 1)
        return text, f"json(deep {depth} at {where[-1]})"
    parent[where[-1]] = rng.choice(ODD_VALUES)
    return json.dumps(data), f"json(retype {where[-1]})"


def mutate_csv(text: str, rng: random.Random) -> tuple[str, str]:
    lines = text.splitlines()
    roll = rng.random()
    if roll < 0.15 or len(lines) < 2:
        return text[: rng.randrange(len(text) or 1)], "csv(truncate)"
    if roll < 0.3:
        cols = lines[0].split(",")
        drop = rng.randrange(len(cols))
        kept = (",".join(c for j, c in enumerate(r.split(",")) if j != drop) for r in lines)
        return "\n".join(kept), "csv(drop column)"
    if roll < 0.45:
        return "\n".join([*lines, ",".join(["=1+1"] * rng.randrange(1, 4))]), "csv(ragged row)"
    row = rng.randrange(1, len(lines))
    cells = lines[row].split(",")
    cells[rng.randrange(len(cells))] = rng.choice(["", "nan", "inf", "x", "-1e999", "=cmd|' /C calc'!A0", "\"", "NA"])
    lines[row] = ",".join(cells)
    return "\n".join(lines) + "\n", "csv(cell)"


def mutate_log(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    lines = data.splitlines(keepends=True)
    roll = rng.random()
    if roll < 0.2 and lines:
        k = rng.randrange(len(lines))
        return b"".join(lines[:k] + lines[k + rng.randrange(1, 50):]), "log(drop lines)"
    if roll < 0.35 and lines:
        k = rng.randrange(len(lines))
        return b"".join(lines[:k] + [lines[k]] * rng.randrange(2, 200) + lines[k:]), "log(repeat line)"
    if roll < 0.5:
        return data[: rng.randrange(len(data) or 1)], "log(truncate)"
    if roll < 0.75 and lines:
        k = rng.randrange(len(lines))
        import re

        lines[k] = re.sub(rb"\d+(\.\d+)?", lambda _m: rng.choice([b"nan", b"-1", b"1e999", b"", b"x"]), lines[k])
        return b"".join(lines), "log(numbers)"
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 20)):
        if buf:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
    return bytes(buf), "log(flip bytes)"


def npz_mutant(rng: random.Random) -> tuple[bytes, str]:
    """An .npz whose one member `x` has a crafted header and data."""
    shape: tuple[int, ...] = (4, 3, 4, 4)
    descr, fortran = "<f4", False
    roll = rng.random()
    data_len: int | None = None
    compress = False
    what = ""
    if roll < 0.2:
        shape, what = (rng.choice((10**6, 10**9, 2**40)), 3, 4, 4), "npz(claims many samples)"
        data_len = 4 * 3 * 4 * 4 * 4
    elif roll < 0.3:
        shape, what = (1, 3, 4, 10**12), "npz(huge dim)"
        data_len = 100
    elif roll < 0.45:
        descr, what = rng.choice(["<U10", "|O", "<f2", "<c8", "|b1", ">f8", "<M8[s]", "V16"]), "npz(dtype)"
    elif roll < 0.55:
        fortran, what = True, "npz(fortran)"
    elif roll < 0.7:
        data_len, what = rng.randrange(0, 767), "npz(data cut)"
    elif roll < 0.85:
        n = rng.choice((2, 64, 4096))
        shape, what, compress = (n, 3, 4, 4), f"npz(deflated zeros, {n} samples)", True
    else:
        shape, what = rng.choice([(), (0, 3, 4, 4), (4, 3, 4), (4, 3, 4, 4, 1), (-1, 3, 4, 4)]), "npz(shape)"
    buf = io.BytesIO()
    header = {"descr": descr, "fortran_order": fortran, "shape": shape}
    try:
        np.lib.format.write_array_header_1_0(buf, header)  # type: ignore[no-untyped-call]
    except ValueError:
        np.lib.format.write_array_header_2_0(buf, header)  # type: ignore[no-untyped-call]
    itemsize = 4 if descr in ("<f4", "<U10") else 8
    full = itemsize * int(np.prod([max(d, 0) for d in shape], dtype=np.float64)) if shape else itemsize
    body = bytes(min(full, 1 << 16) if data_len is None else data_len)
    if compress:
        body = bytes(full)
    buf.write(body)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
        zf.writestr("x.npy", buf.getvalue())
    return out.getvalue(), what


# --- one mutant ----------------------------------------------------------------------------------------------


@dataclass
class Case:
    """A mutant: the command to run, in a folder whose pre-existing files must not change."""

    kind: str
    seed: int
    what: str
    argv: list[str]
    folder: Path
    damaged: Path | None = None
    """The file the mutant damaged: a run that refuses it (exit 2) must leave it as it was."""
    allowed: tuple[Path, ...] = ()
    """Folders the command writes into as its own (a run folder it updates, its --out)."""

    def overwrites(self, gone: list[Path], code: int | None) -> list[Path]:
        """Changed files that were not quantscan's to change."""
        return [p for p in gone if not any(a in p.parents for a in self.allowed) or (p == self.damaged and code == 2)]


def _copytree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _session_digest(text: str) -> str:
    """The session with its digest recomputed (so a retyped value passes the integrity check)."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return text
    if not isinstance(raw, dict):
        return text
    from quantscan.bisect.session import content_digest

    try:
        raw["digest"] = content_digest(raw)
    except (TypeError, ValueError, RecursionError):
        return text
    return json.dumps(raw)


def make_case(base: Base, kind: str, seed: int, work: Path) -> Case:
    """The mutant of `kind` from `seed`, built in a fresh folder under `work`."""
    rng = random.Random(seed)
    folder = work / f"{kind}_{seed}"
    folder.mkdir()
    out = folder / "out"
    build: dict[str, Callable[[], tuple[str, list[str]]]] = {
        "session": lambda: _session_case(base, folder, rng),
        "run_json": lambda: _run_case(base, folder, rng, "run.json"),
        "layers_csv": lambda: _run_case(base, folder, rng, "layers.csv"),
        "case": lambda: _case_case(base, folder, rng),
        "preprocess": lambda: _preprocess_case(base, folder, rng, out),
        "log": lambda: _log_case(base, folder, rng, out),
        "npz": lambda: _npz_case(base, folder, rng, out),
        "out_path": lambda: _out_case(base, folder, rng),
        "dumps": lambda: _dumps_case(base, folder, rng, out),
        "vendor": lambda: _vendor_case(base, folder, rng, out),
        "plan": lambda: _plan_case(base, folder, rng),
    }
    what, argv = build[kind]()
    run, damaged = folder / "run", {
        "session": folder / "run" / "session.json", "run_json": folder / "run" / "run.json",
        "layers_csv": folder / "run" / "layers.csv", "case": folder / "cases" / "m-abc123" / "case.json",
        "preprocess": folder / "images" / "preprocess.json", "npz": folder / "calib" / "data.npz",
        "plan": folder / "run" / "plan.json",
    }.get(kind)
    if kind == "log":
        damaged = folder / Path(argv[1]).name
    allowed = ((run,) if kind in ("session", "run_json", "layers_csv") else (out, folder / "o", folder / "lib")
               + ((run,) if kind == "plan" else ()))
    return Case(kind, seed, what, argv, folder, damaged, allowed)


def _session_case(base: Base, folder: Path, rng: random.Random) -> tuple[str, list[str]]:
    run = _copytree(base.run, folder / "run")
    session = run / "session.json"
    text, what = mutate_json(session.read_text(), rng)
    if rng.random() < 0.5:
        text, what = _session_digest(text), what + "+digest"
    session.write_text(text)
    if rng.random() < 0.5:
        return what, ["bisect", "--show", str(session)]
    return what, ["bisect", "--resume", str(session), "--quiet", "--export", "onnxruntime"]


def _run_case(base: Base, folder: Path, rng: random.Random, name: str) -> tuple[str, list[str]]:
    run = _copytree(base.run, folder / "run")
    target = run / name
    mutate = mutate_json if name.endswith(".json") else mutate_csv
    text, what = mutate(target.read_text(), rng)
    target.write_text(text)
    command = rng.choice(["report", "overlay", "bundle", "case"])
    if command == "report":
        return what, ["report", str(run)]
    if command == "overlay":
        return what, ["overlay", str(run), "-o", str(folder / "nodes.json")]
    if command == "bundle":
        return what, ["bundle", str(run), "-o", str(folder / "b.zip")]
    return what, ["case", "save", str(run), "--note", "n", "--cases", str(folder / "lib")]


def _case_case(base: Base, folder: Path, rng: random.Random) -> tuple[str, list[str]]:
    lib = _copytree(base.cases, folder / "cases")
    target = lib / "m-abc123" / "case.json"
    text, what = mutate_json(target.read_text(), rng)
    target.write_text(text)
    command = rng.choice(["check", "list", "show", "rewrite"])
    if command == "check":
        return what, ["check", str(base.model), "--profile", "generic-npu", "--cases", str(lib), "--out",
                      str(folder / "out")]
    if command == "rewrite":
        return what, ["rewrite", str(base.model), "--case", "m-abc123", "--cases", str(lib), "-o",
                      str(folder / "r.onnx")]
    return what, ["case", command, *(["m-abc123"] if command == "show" else []), "--cases", str(lib)]


def _preprocess_case(base: Base, folder: Path, rng: random.Random, out: Path) -> tuple[str, list[str]]:
    images = _copytree(base.images, folder / "images")
    target = images / "preprocess.json"
    text, what = mutate_json(target.read_text(), rng)
    target.write_text(text)
    return what, ["scan", str(base.model), "--calib", str(images), "--limit", "1", "--out", str(out), "--no-report",
                  "--quiet", "--no-gain"]


def _log_case(base: Base, folder: Path, rng: random.Random, out: Path) -> tuple[str, list[str]]:
    src = rng.choice(base.logs)
    data, what = mutate_log(src.read_bytes(), rng)
    target = folder / src.name
    target.write_bytes(data)
    extra = ["--model", str(base.model), "--profile", "rk3588"] if rng.random() < 0.3 else []
    return f"{src.parent.name}/{src.name} {what}", ["log", str(target), "--out", str(out), *extra]


def _npz_case(base: Base, folder: Path, rng: random.Random, out: Path) -> tuple[str, list[str]]:
    calib = folder / "calib"
    calib.mkdir()
    data, what = npz_mutant(rng)
    (calib / "data.npz").write_bytes(data)
    limit = ["--limit", "1"] if rng.random() < 0.6 else []
    return what, ["scan", str(base.model), "--calib", str(calib), *limit, "--out", str(out), "--no-report",
                  "--quiet", "--no-gain"]


def _dumps_case(base: Base, folder: Path, rng: random.Random, out: Path) -> tuple[str, list[str]]:
    assert base.readers is not None
    fmt, what = damage_dumps(base.readers, folder / "dumps", rng)
    return what, ["dumps", str(base.model), "--calib", str(base.calib), "--dumps", str(folder / "dumps"),
                  "--format", fmt, "--out", str(out), "--quiet"]


def _vendor_case(base: Base, folder: Path, rng: random.Random, out: Path) -> tuple[str, list[str]]:
    assert base.readers is not None
    tool, what = damage_payload(base.readers, folder / "payload", rng, mutate_json)
    python = fake_toolkit(folder, tool, folder / "payload")
    target = {"rknn": "rk3588", "tpu-mlir": "bm1684x"}[tool]
    return what, ["vendor", tool, str(base.model), "--calib", str(base.calib), "--target", target, "--python",
                  str(python), "--out", str(out), "--quiet"]


def _plan_case(base: Base, folder: Path, rng: random.Random) -> tuple[str, list[str]]:
    run = _copytree(base.run, folder / "run")
    target = run / "plan.json"
    text, what = mutate_json(target.read_text(), rng)
    target.write_text(text)
    command = rng.choice(["overlay", "case", "report", "bundle"])
    if command == "overlay":
        return what, ["overlay", str(run), "-o", str(folder / "o" / "nodes.json")]
    if command == "report":
        return what, ["report", str(run)]
    if command == "bundle":
        return what, ["bundle", str(run), "-o", str(folder / "o" / "b.zip")]
    return what, ["case", "save", str(run), "--note", "n", "--cases", str(folder / "lib"), "--rewrite",
                  str(base.record), "--profile", "generic-npu"]


def _out_case(base: Base, folder: Path, rng: random.Random) -> tuple[str, list[str]]:
    """A writing command aimed at somewhere it must not write."""
    model = shutil.copy(base.model, folder / "m.onnx")
    calib = _copytree(base.calib, folder / "calib")
    run = _copytree(base.run, folder / "run")
    mine = folder / "mine.txt"
    mine.write_text("the user's own file")
    (folder / "loop_a").symlink_to(folder / "loop_b")
    (folder / "loop_b").symlink_to(folder / "loop_a")
    targets = {
        "input model": str(model), "own file": str(mine), "run table": str(run / "layers.csv"),
        "run.json": str(run / "run.json"), "calib file": str(calib / "data.npz"), "calib folder": str(calib),
        "under a file": str(mine / "x"), "read-only": "/sys/quantscan-fuzz/x", "loop": str(folder / "loop_a"),
        "long name": str(folder / ("n" * 300)), "folder": str(folder), "empty": "",
    }
    label = rng.choice(list(targets))
    target = targets[label]
    command = rng.choice(["overlay", "rewrite", "save-qdq", "extract", "bundle", "check", "log", "compare"])
    argv = {
        "overlay": ["overlay", str(run), "-o", target],
        "rewrite": ["rewrite", str(model), "--opset", "14", "-o", target],
        "save-qdq": ["scan", str(model), "--calib", str(calib), "--limit", "1", "--no-gain", "--no-report", "--quiet",
                     "--out", str(folder / "o"), "--save-qdq", target],
        "extract": ["extract", str(model), "--node", "conv", "-o", target],
        "bundle": ["bundle", str(run), "-o", target],
        "check": ["check", str(model), "--out", target],
        "log": ["log", str(base.logs[0]), "--out", target],
        "compare": ["compare", str(model), str(model), "--calib", str(calib), "--limit", "1", "--out", target],
    }[command]
    return f"{command} -> {label}", argv


# --- the overwrite check -------------------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[Path, str]:
    """sha256 of every regular file under `folder` (symlinks not followed)."""
    out = {}
    for p in folder.rglob("*"):
        if p.is_file() and not p.is_symlink():
            out[p] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def changed(before: dict[Path, str], after: dict[Path, str]) -> list[Path]:
    """Files that existed before and now differ or are gone (new files are outputs, not overwrites)."""
    return [p for p, digest in before.items() if after.get(p) != digest]


def fuzz_files(base: Base, n: int, driver: Any, work: Path, first_seed: int = 0,
               kinds: tuple[str, ...] = KINDS) -> Iterator[tuple[Case, Any]]:
    """`n` mutants round-robin over `kinds`, each run once through `driver` (tests/mutants.py Driver):
    yields (case, Outcome) with `modified` set when a file that existed before the run changed."""
    from mutants import Outcome

    for k in range(n):
        seed = first_seed + k
        case = make_case(base, kinds[k % len(kinds)], seed, work)
        watched = [case.folder, base.root]
        before = {p: d for folder in watched for p, d in snapshot(folder).items()}
        code, stderr, crashed, timed_out = driver.run(case.argv)
        after = {p: d for folder in watched for p, d in snapshot(folder).items()}
        outcome = Outcome(case.kind, seed, [case.what, " ".join(case.argv[:1])], code, stderr, crashed, timed_out,
                          modified=bool(case.overwrites(changed(before, after), code)))
        yield case, outcome
        shutil.rmtree(case.folder, ignore_errors=True)
