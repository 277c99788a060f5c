"""Issue 42, models and runtimes: what a model says is checked before onnx's C++, onnxruntime or our own
graph relies on it, and a Ray address is checked before Ray is asked.

Each test is a CLI call as a user makes it, held to the contract: exit 0 where the input is valid
(a quantscan bug otherwise), else exit 2 with one `quantscan: error:` line and no traceback. Where
the process itself is the subject (an abort inside onnx's C++), the command runs in a child process.
"""

from __future__ import annotations

import ast
import http.server
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import REPO
from test_robust import assert_one_line, main, save

ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}


def run_cli(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process: an abort in native code shows as a negative return code, not a dead pytest."""
    return subprocess.run([sys.executable, "-m", "quantscan", *map(str, argv)], capture_output=True, text=True,
                          env=ENV, check=False, timeout=600)


# --- 1. a negative declared dim never reaches onnx's C++ ------------------------------------------------------


def focus_model(height: int, opset: int = 11) -> onnx.ModelProto:
    """A YOLOX Focus-style strided Slice on the height axis, then a Conv: onnx's data propagation clamps
    the Slice's end with the declared height, and a height of -1 fails `std::clamp`'s assertion."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("starts", [0]), ("ends", [2**62]), ("axes", [2]), ("steps", [2]))]
    inits.append(numpy_helper.from_array(rng.normal(size=(4, 3, 1, 1)).astype(np.float32), "w"))
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"], name="focus"),
             helper.make_node("Conv", ["s", "w"], ["y"], name="conv")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, height, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, height, 8])
    graph = helper.make_graph(nodes, "focus", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


def converter_aborts(path: Path, target: int = 13) -> bool:
    """Whether onnx.version_converter itself kills the process on this model (the test's premise)."""
    probe = "import onnx, sys; onnx.version_converter.convert_version(onnx.load(sys.argv[1]), int(sys.argv[2]))"
    raw = subprocess.run([sys.executable, "-c", probe, str(path), str(target)], capture_output=True, check=False)
    return raw.returncode < 0


NEGATIVE_DIM_COMMANDS = {
    "check": ["--profile", "generic-npu", "--out", "{out}"],
    "scan": ["--calib", "{calib}", "--limit", "2", "--out", "{out}", "--no-report", "--quiet"],
    "bisect": ["--calib", "{calib}", "--limit", "2", "--target-cosine", "0.9999", "--out", "{out}", "--quiet"],
    "rewrite": ["--fold-bn", "--opset", "13", "--calib", "{calib}", "-o", "{out}.onnx"],
    "extract": ["--node", "conv", "--calib", "{calib}", "-o", "{out}.onnx"],
    "calib-advice": ["--calib", "{calib}", "--out", "{out}", "--quiet"],
}


@pytest.mark.parametrize("command", sorted(NEGATIVE_DIM_COMMANDS))
def test_a_negative_dim_below_the_analysis_opset_aborts_no_command(command: str, tmp_path: Path) -> None:
    """Height declared -1 at opset 11: raising the opset to 13 ran onnx's version converter, which
    asserted in C++ (SIGABRT, exit 134, no quantscan line) in scan, bisect, rewrite and calib-advice.
    -1 states nothing, so the model runs as if the height were unknown."""
    model = save(focus_model(-1), tmp_path / "neg.onnx")
    assert converter_aborts(model), "onnx no longer aborts here: the test no longer shows the guard works"
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(1).random((4, 3, 16, 8), dtype=np.float32))
    argv = [a.format(out=tmp_path / "out", calib=calib) for a in NEGATIVE_DIM_COMMANDS[command]]
    done = run_cli(command, model, *argv)
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr


def test_compare_of_two_negative_dim_models_aborts_nothing(tmp_path: Path) -> None:
    a = save(focus_model(-1), tmp_path / "a.onnx")
    b = save(focus_model(-5), tmp_path / "b.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(1).random((2, 3, 16, 8), dtype=np.float32))
    done = run_cli("compare", a, b, "--calib", calib, "--out", tmp_path / "cmp")
    assert done.returncode == 0, done.stderr


@pytest.mark.real
def test_a_real_detector_with_a_negative_height_scans(assets: Path, tmp_path: Path) -> None:
    """ddddocr_common_det (YOLOX, opset 11, Focus slices) with its height declared -1: SIGABRT in `scan`."""
    model = onnx.load(str(assets / "models" / "ddddocr_common_det.onnx"))
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = -1
    path = save(model, tmp_path / "det.onnx")
    assert converter_aborts(path)
    done = run_cli("scan", path, "--calib", assets / "calib" / "ddddocr_common_det", "--limit", "1", "--no-gain",
                   "--out", tmp_path / "run", "--no-report", "--quiet")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "layers.csv").is_file()


def test_only_graph_infer_calls_onnx_cpp_entry_points() -> None:
    """The guard holds only if every call goes through graph/infer.py: a new direct call would bring the
    abort back on the path that makes it (calls found in the syntax tree, so docstrings may name them)."""
    entry_points = {"checker.check_model", "checker.check_model_path", "shape_inference.infer_shapes",
                    "shape_inference.infer_shapes_path", "version_converter.convert_version"}
    offenders = []
    for path in sorted((REPO / "src" / "quantscan").rglob("*.py")):
        if path.name == "infer.py" and path.parent.name == "graph":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and any(ast.unparse(node.func).endswith(e) for e in entry_points):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node.func)}")
    assert not offenders, offenders


# --- 2. our own graph is valid for what the model declares ----------------------------------------------------


def ir3_constant_weights() -> onnx.ModelProto:
    """IR version 3, weights and BatchNorm parameters in Constant nodes (a Paddle-style export): valid, since
    no initializer exists that IR 3 would require among the graph inputs."""
    rng = np.random.default_rng(0)
    consts = {"w": rng.normal(size=(4, 3, 3, 3)), "scale": rng.uniform(0.5, 2, 4), "bias": rng.normal(size=4),
              "mean": rng.normal(size=4), "var": rng.uniform(0.5, 2, 4)}
    nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(v.astype(np.float32), k),
                              name=f"const_{k}") for k, v in consts.items()]
    nodes += [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
              helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"], name="bn"),
              helper.make_node("Relu", ["b"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "ir3", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=3)


@pytest.mark.parametrize("command", ["scan", "bisect", "calib-advice"])
def test_an_ir3_model_with_constant_weights_is_measured(command: str, tmp_path: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """The analysis copy moved the Constant weights (and the folded BN) into initializers, which IR 3 wants
    listed as inputs: onnxruntime refused quantscan's own graph (exit 3). The oracle: the model itself,
    whose output onnxruntime computes, is what the scan's float reference must equal."""
    proto = ir3_constant_weights()
    onnx.checker.check_model(proto)
    model = save(proto, tmp_path / "ir3.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(1).random((4, 3, 8, 8), dtype=np.float32))
    extra = {"scan": ["--no-report"], "bisect": ["--target-cosine", "0.9999"], "calib-advice": []}[command]
    code, _, err = main(capfd, command, model, "--calib", calib, "--out", tmp_path / "run", "--quiet", *extra)
    assert code == 0, err
    assert onnx.load(str(model)).ir_version == 3  # the user's file is as it was


@pytest.mark.real
def test_a_real_ir3_classifier_with_constant_weights_scans(assets: Path, tmp_path: Path,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    """ppocr_mobile_v2_cls keeps its weights in Constant nodes; labelled IR 3 it was refused (exit 2 from
    the version converter, exit 3 at opset 13). Its measured figures must be those of the IR 7 original."""
    proto = onnx.load(str(assets / "models" / "ppocr_mobile_v2_cls.onnx"))
    calib = assets / "calib" / "ppocr_mobile_v2_cls"
    runs, original = {}, proto.ir_version
    for ir in (original, 3):
        proto.ir_version = ir
        model = save(proto, tmp_path / f"ir{ir}.onnx")
        code, _, err = main(capfd, "scan", model, "--calib", calib, "--limit", "2", "--no-gain",
                            "--out", tmp_path / f"run{ir}", "--no-report", "--quiet")
        assert code == 0, err
        runs[ir] = (tmp_path / f"run{ir}" / "layers.csv").read_text()
    assert runs[3] == runs[original]


# --- 3. every name and text in the model is UTF-8 -------------------------------------------------------------


def with_text(model: onnx.ModelProto, where: str, marker: str = "QSTEXT") -> bytes:
    """`model` serialised with the text at `where` made of bytes that are not UTF-8."""
    if where == "graph name":
        model.graph.name = marker
    elif where == "doc string":
        model.doc_string = marker
    elif where == "node doc string":
        model.graph.node[0].doc_string = marker
    elif where == "metadata":
        model.metadata_props.add(key="author", value=marker)
    data = model.SerializeToString()
    assert data.count(marker.encode()) == 1
    return data.replace(marker.encode(), b"\xfe\xff" + marker.encode()[2:])


@pytest.mark.parametrize("where", ["graph name", "doc string", "node doc string", "metadata"])
@pytest.mark.parametrize("command", ["check", "scan"])
def test_text_that_is_not_utf8_is_refused_first(where: str, command: str, tmp_path: Path,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    """onnx.checker accepts these; scan then failed writing its report (exit 3). README: names are checked first."""
    model = tmp_path / "m.onnx"
    model.write_bytes(with_text(ir3_constant_weights(), where))
    onnx.checker.check_model(onnx.load(str(model)))  # the premise: onnx finds nothing wrong
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.zeros((2, 3, 8, 8), np.float32))
    extra = ["--profile", "generic-npu"] if command == "check" else ["--calib", calib, "--no-report", "--quiet"]
    code, _, err = main(capfd, command, model, *extra, "--out", tmp_path / "run")
    assert_one_line(code, err, 2, "expected UTF-8", "not valid UTF-8", model.name)


@pytest.mark.real
def test_a_real_model_with_a_graph_name_that_is_not_utf8_is_refused(assets: Path, tmp_path: Path,
                                                                    capfd: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "pnet.onnx"
    model.write_bytes(with_text(onnx.load(str(assets / "models" / "mtcnn_pnet.onnx")), "graph name"))
    code, _, err = main(capfd, "scan", model, "--calib", assets / "calib" / "mtcnn_pnet", "--limit", "1",
                        "--out", tmp_path / "run", "--no-report", "--quiet")
    assert_one_line(code, err, 2, "model.graph.name", "not valid UTF-8")
    assert not (tmp_path / "run" / "run.json").exists()


def sample_rate_model() -> onnx.ModelProto:
    """y = (x @ W) * float(sr): a rank-0 int64 input beside a batched one, as silero-vad's `sr`."""
    w = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    nodes = [helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
             helper.make_node("Mul", ["m", "srf"], ["y"], name="scale")]
    graph = helper.make_graph(nodes, "sr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
                                            helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_rank0_input_fed_per_sample_from_a_file_scans(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """`sr.npy` of shape [8]: one rank-0 value per sample. The sample reached onnxruntime as a numpy scalar
    (exit 2 with onnxruntime's message), and four of them cannot be stacked into one batch."""
    model = save(sample_rate_model(), tmp_path / "vad.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32))
    np.save(calib / "sr.npy", np.full(8, 16000, np.int64))
    code, _, err = main(capfd, "scan", model, "--calib", calib, "--limit", "4", "--out", tmp_path / "run",
                        "--no-report", "--quiet")
    assert code == 0, err
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert sorted(w["index"] for w in run["worst_samples"]) == [0, 1, 2, 3]


@pytest.mark.real
def test_extract_keeps_one_sample_of_rank0_cut_inputs(assets: Path, tmp_path: Path,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    """The Loop fixture's trip count and condition are rank 0: saving several samples concatenated them
    before deciding to keep only the first (exit 3). The saved inputs must be the fixture's own."""
    op = assets / "ops" / "loop11"
    calib = tmp_path / "calib"
    calib.mkdir()
    feeds = {}
    for k, name in enumerate(("trip_count", "cond", "y")):
        tensor = onnx.TensorProto()
        tensor.ParseFromString((op / "test_data_set_0" / f"input_{k}.pb").read_bytes())
        feeds[name] = numpy_helper.to_array(tensor)
    np.savez(calib / "data.npz", **feeds)
    code, _, err = main(capfd, "extract", op / "model.onnx", "--node", "res_y", "--calib", calib,
                        "-o", tmp_path / "cut.onnx", "--out", tmp_path / "run", "--quiet")
    assert code == 0, err
    saved = np.load(tmp_path / "cut.inputs.npz")
    for name in saved.files:
        np.testing.assert_array_equal(saved[name], feeds[name])


def loop_feeds(op: Path) -> dict[str, np.ndarray]:
    """The Loop fixture's own test inputs (trip_count, cond, y)."""
    feeds = {}
    for k, name in enumerate(("trip_count", "cond", "y")):
        tensor = onnx.TensorProto()
        tensor.ParseFromString((op / "test_data_set_0" / f"input_{k}.pb").read_bytes())
        feeds[name] = numpy_helper.to_array(tensor)
    return feeds


@pytest.mark.real
def test_a_loop_input_with_an_extra_trailing_dim_is_refused_naming_it(assets: Path, tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    """The Loop fixture with its input `y` declared [1, 1] (data [1, 1]) while the body's `y_in` says [1]:
    onnxruntime runs it (rank 3 scan output) but ranks the output 2 from the body, and refused the reduction
    quantscan built on it (exit 3). One line names the body input and both ranks."""
    op = assets / "ops" / "loop11"
    proto = onnx.load(str(op / "model.onnx"))
    proto.graph.input[2].type.tensor_type.shape.dim.add().dim_value = 1
    model = save(proto, tmp_path / "loop.onnx")
    feeds = loop_feeds(op)
    feeds["y"] = feeds["y"][:, None]
    import onnxruntime as ort  # the oracle: the runtime itself gives the scan output rank 3

    quiet = ort.SessionOptions()
    quiet.log_severity_level = 3  # its shape-mismatch warnings would be on the stderr the test reads
    ranks = [len(o.shape) for o in ort.InferenceSession(str(model), quiet).run(None, feeds)]
    assert ranks == [2, 3]
    calib = tmp_path / "calib"
    calib.mkdir()
    np.savez(calib / "data.npz", **feeds)
    code, _, err = main(capfd, "scan", model, "--calib", calib, "--out", tmp_path / "run", "--no-report", "--quiet")
    assert_one_line(code, err, 2, "res_scan", "rank 3", "rank 2", "'y_in' declares rank 1", "'y' of rank 2")


# --- 4. a Ray address is checked before Ray is asked ---------------------------------------------------------


def scan_with_ray(capfd: pytest.CaptureFixture[str], tmp_path: Path, address: str) -> tuple[int, str]:
    model = save(sample_rate_model(), tmp_path / "m.onnx")
    calib = tmp_path / "calib"
    calib.mkdir(exist_ok=True)
    np.save(calib / "x.npy", np.zeros((2, 4), np.float32))
    np.save(calib / "sr.npy", np.full(2, 16000, np.int64))
    code, _, err = main(capfd, "scan", model, "--calib", calib, "--out", tmp_path / "run", "--executor", "ray",
                        "--ray-address", address, "--no-report", "--quiet")
    assert not (tmp_path / "run").exists()  # refused before the run folder is claimed
    return code, err


@pytest.mark.ray
@pytest.mark.parametrize(("address", "needles"), [
    ("", ["expected HOST:PORT", "empty address"]),
    ("http://127.0.0.1:8265", ["expected HOST:PORT", "dashboard", "without http://"]),
    ("https://head.example:8265", ["expected HOST:PORT", "dashboard"]),
    ("ray://127.0.0.1:10001", ["expected HOST:PORT", "ray[client]"]),
    ("127.0.0.1", ["expected HOST:PORT", "no port"]),
    ("127.0.0.1:99999", ["expected HOST:PORT", "1-65535"]),
    ("tcp://127.0.0.1:6379", ["expected HOST:PORT", "tcp://"]),
])
def test_a_ray_address_of_the_wrong_form_is_one_line(address: str, needles: list[str], tmp_path: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    """An unset variable, the dashboard URL, a Ray Client address without ray[client]: exit 3 before."""
    pytest.importorskip("ray")
    if address.startswith("ray://") and importlib.util.find_spec("grpc") is not None:
        pytest.skip("ray[client] is installed here: ray:// is a valid form")
    code, err = scan_with_ray(capfd, tmp_path, address)
    assert_one_line(code, err, 2, "--ray-address", *needles)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.mark.ray
def test_a_web_server_at_the_ray_address_is_one_line_not_a_hang(tmp_path: Path,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    """A web server where the GCS should be: ray.init retried for minutes and printed 20+ native lines."""
    pytest.importorskip("ray")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        code, err = scan_with_ray(capfd, tmp_path, f"127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert_one_line(code, err, 2, "expected a Ray GCS", "another kind of server")


@pytest.mark.ray
def test_a_server_that_never_answers_is_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A port that accepts connections (the kernel's backlog) and never speaks."""
    pytest.importorskip("ray")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        code, err = scan_with_ray(capfd, tmp_path, f"127.0.0.1:{silent.getsockname()[1]}")
    assert_one_line(code, err, 2, "expected a Ray GCS", "no HTTP/2 answer")


@pytest.mark.ray
def test_the_probe_recognises_a_real_ray_gcs(ray_cluster: Any) -> None:
    """The other half of the probe: the GCS of a running Ray (the shared test cluster) passes it."""
    from quantscan.executors import check_reachable

    check_reachable(ray_cluster.get_runtime_context().gcs_address)


# --- 5. repeated warnings are counted, not all printed ---------------------------------------------------------


def nan_chain(layers: int = 20) -> onnx.ModelProto:
    """Sqrt of data with negative values, then a chain of Conv+Relu: NaN in every activation."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Sqrt", ["x"], ["t0"], name="sqrt")]
    inits = []
    for k in range(layers):
        inits.append(numpy_helper.from_array(rng.normal(size=(4, 4, 1, 1)).astype(np.float32), f"w{k}"))
        nodes.append(helper.make_node("Conv", [f"t{k}", f"w{k}"], [f"c{k}"], name=f"conv{k}"))
        nodes.append(helper.make_node("Relu", [f"c{k}"], [f"t{k + 1}"], name=f"relu{k}"))
    graph = helper.make_graph(nodes, "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 4, 4])],
                              [helper.make_tensor_value_info(f"t{layers}", TensorProto.FLOAT, ["N", 4, 4, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def assert_capped(err: str, run_json: Path) -> None:
    """At most WARNINGS_PER_KIND warnings of a kind on stderr, and the counted rest equal to what run.json holds."""
    from quantscan.cli.notes import WARNINGS_PER_KIND, warning_kind

    lines = [ln.removeprefix("quantscan: warning: ") for ln in err.splitlines() if ln.startswith("quantscan: warning:")]
    counted = [ln for ln in lines if ln.startswith("… and ")]
    shown = [ln for ln in lines if not ln.startswith("… and ")]
    everything = json.loads(run_json.read_text())["warnings"]
    assert counted, "expected more warnings than the cap: the test would show nothing"
    assert shown == [w for w in everything if w in shown]  # the first ones, in their order
    per_kind: dict[str, int] = {}
    for warning in everything:
        per_kind[warning_kind(warning)] = per_kind.get(warning_kind(warning), 0) + 1
    assert max(per_kind[warning_kind(w)] for w in shown) > WARNINGS_PER_KIND
    for kind, n in per_kind.items():
        printed = sum(1 for w in shown if warning_kind(w) == kind)
        assert printed == min(n, WARNINGS_PER_KIND)
        if n > WARNINGS_PER_KIND:
            assert f"… and {n - WARNINGS_PER_KIND} more like \"{kind}\": see {run_json}" in counted


def test_nan_activations_print_a_few_warnings_of_each_kind_and_count_the_rest(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = save(nan_chain(), tmp_path / "nan.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(1).normal(size=(4, 4, 4, 4)).astype(np.float32))
    code, out, err = main(capfd, "scan", model, "--calib", calib, "--out", tmp_path / "run", "--no-report", "--quiet")
    assert code == 0, err
    assert_capped(err, tmp_path / "run" / "run.json")


@pytest.mark.real
def test_a_real_model_with_nan_activations_counts_its_warnings(assets: Path, tmp_path: Path,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    """mtcnn_onet with a Sqrt on its (mean-subtracted, partly negative) input: NaN from the first layer on."""
    proto = onnx.load(str(assets / "models" / "mtcnn_onet.onnx"))
    name = proto.graph.input[0].name
    for node in proto.graph.node:
        node.input[:] = ["sqrt_in" if i == name else i for i in node.input]
    proto.graph.node.insert(0, helper.make_node("Sqrt", [name], ["sqrt_in"], name="sqrt_in"))
    model = save(proto, tmp_path / "onet_nan.onnx")
    code, _, err = main(capfd, "scan", model, "--calib", assets / "calib" / "mtcnn_onet", "--limit", "4", "--no-gain",
                        "--out", tmp_path / "run", "--no-report", "--quiet")
    assert code == 0, err
    assert_capped(err, tmp_path / "run" / "run.json")


def test_warning_kinds_blank_names_and_numbers_only() -> None:
    from quantscan.cli.notes import capped_warnings, warning_kind

    assert warning_kind("tensor 't12': NaN/Inf in activations (FP32 side 256, int8 side 0 elements)") == \
        "tensor '…': NaN/Inf in activations (FP32 side #, int8 side # elements)"
    few = [f"tensor 'a{k}' is zero" for k in range(3)]
    assert capped_warnings(few, "run.json", per_kind=5) == few
    many = [f"tensor 'a{k}' is zero" for k in range(8)] + ["other"]
    assert capped_warnings(many, "run.json", per_kind=5) == [
        *many[:5], "other", "… and 3 more like \"tensor '…' is zero\": see run.json"]


# --- 6. what the model fuzz found on the other commands --------------------------------------------------------


def test_extract_of_a_model_that_fails_the_full_check_is_one_line(tmp_path: Path,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    """Add of a float16 input and a float32 weight: onnx.checker's plain check passes it, the full check the
    extracted subgraph gets raised InferenceError (exit 3). The oracle is onnx's own full check."""
    w = numpy_helper.from_array(np.ones((1, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"], name="add"),
                               helper.make_node("Relu", ["y"], ["z"], name="relu")], "mixed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(proto)
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.checker.check_model(proto, full_check=True)
    model = save(proto, tmp_path / "mixed.onnx")
    code, _, err = main(capfd, "extract", model, "--node", "add", "-o", tmp_path / "cut.onnx", "--out", tmp_path / "r")
    assert_one_line(code, err, 2, "subgraph around 'add'", "full check")
    assert not (tmp_path / "cut.onnx").exists()


@pytest.mark.real
def test_lowering_an_attribute_the_target_opset_lacks_is_refused(assets: Path, tmp_path: Path,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    """The RoiAlign fixture (opset 16, coordinate_transformation_mode) lowered to 13: the result failed
    onnx.checker inside rewrite (exit 3). onnx's schema for RoiAlign-10 is the oracle for the attribute."""
    assert "coordinate_transformation_mode" not in onnx.defs.get_schema("RoiAlign", 13, "").attributes
    code, _, err = main(capfd, "rewrite", assets / "ops" / "roialign_aligned_true" / "model.onnx", "--opset", "13",
                        "-o", tmp_path / "low.onnx", "--out", tmp_path / "r")
    assert_one_line(code, err, 2, "--opset 13", "coordinate_transformation_mode", "opset 13")
    assert not (tmp_path / "low.onnx").exists()
