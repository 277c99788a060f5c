"""hb_mapper logs D-Robotics published (tests/fixtures/vendorlog/hb_mapper-*/README.md cites each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantscan.toolchains.findings import RULE_CPU, RULE_FAILED, RULE_PRECISION, log_findings
from quantscan.toolchains.horizon.log import parse_hb_mapper
from quantscan.toolchains.parsed import ParsedLog, Stage

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vendorlog"


def parsed(name: str) -> ParsedLog:
    return parse_hb_mapper((FIXTURES / name).read_text(encoding="utf-8"))


def test_makertbin_node_table_with_cosine_and_a_cpu_reshape() -> None:
    log = parsed("hb_mapper-bayes-e/repvgg_makertbin.log")
    assert log.failure is None and log.stage_reached is Stage.COMPILE
    assert len(log.layers) == 47
    (cpu,) = [row for row in log.layers if row.target == "cpu"]
    assert (cpu.layer, cpu.vendor_op, cpu.dtype, cpu.partition, cpu.cosine) == (
        "/linear/Gemm_reshape_output", "Reshape", "float/float", None, 0.768926)
    assert {row.partition for row in log.layers if row.target == "npu"} == {0}
    # Names longer than the column are cut from the left and kept as printed.
    assert "...ge1.0/nonlinearity/Relu_output_0_calibrated_pad" in {row.layer for row in log.layers}
    # Requantize rows print no cosine; the rows that do are the similarity table.
    gap = next(row for row in log.layers if row.layer == "/gap/GlobalAveragePool")
    assert (gap.vendor_op, gap.cosine, gap.dtype) == ("GlobalAveragePool", 0.700676, "int8/int8")


def test_quantify_model_output_agrees_with_the_node_table() -> None:
    log = parsed("hb_mapper-bayes-e/repvgg_makertbin.log")
    (output,) = [s for s in log.similarity if s.is_output]
    assert (output.layer, output.entire_cosine) == ("/linear/Gemm", 0.768926)
    gemm = next(row for row in log.layers if row.layer == "/linear/Gemm")
    assert gemm.cosine == output.entire_cosine  # the tool's two tables, one number


def test_makertbin_phases_and_march() -> None:
    log = parsed("hb_mapper-bayes-e/yolov5n_makertbin.log")
    assert log.target == "bayes-e"
    assert log.failure is None and log.stage_reached is Stage.COMPILE
    assert all(row.target == "npu" and row.partition == 0 for row in log.layers)
    assert log.layers[0].layer == "HZ_PREPROCESS_FOR_images"
    # int8 in, int32 out is the high-precision last Conv of the int8 kernel, not a fallback.
    assert [f for f in log_findings(log) if f.rule == RULE_PRECISION] == []


def test_checker_cpu_nodes_split_the_bpu_graph() -> None:
    log = parsed("hb_mapper-bernoulli2/x3_checker_cpu.log")
    cpu = [row.layer for row in log.layers if row.target == "cpu"]
    assert cpu == ["fc1_reshape_0", "fc_output/square", "fc_output/sum_pre_reshape", "fc_output/sum_reshape_0",
                   "fc_output/sqrt", "fc_output/expand_pre_reshape", "fc1_reshape_1", "fc_output/expand_reshape_0",
                   "fc_output/op"]
    assert sorted({row.partition for row in log.layers if row.target == "npu"}) == [0, 1, 2]
    findings = log_findings(log)
    assert [f.node for f in findings if f.rule == RULE_CPU] == cpu
    assert all(f.partition is None and str(f.placement) == "cpu" for f in findings)


DOCUMENTED = (FIXTURES / "hb_mapper-docs" / "documented_messages.txt").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("line", [ln for ln in DOCUMENTED if "ERROR" in ln])
def test_every_documented_error_line_is_a_failure(line: str) -> None:
    log = parse_hb_mapper(line)
    assert log.failure is not None
    assert log.failure.message == line.split("ERROR", 1)[1].strip()
    (finding,) = log_findings(log)
    assert finding.rule == RULE_FAILED and str(finding.severity) == "error"


def documented(words: str) -> ParsedLog:
    return parse_hb_mapper(next(ln for ln in DOCUMENTED if words in ln))


def test_documented_messages_name_stage_node_and_fix() -> None:
    compile_error = documented("hbdk-cc").failure
    assert compile_error is not None and compile_error.stage is Stage.COMPILE
    pass_error = documented("error in pass").failure
    assert pass_error is not None and (pass_error.stage, pass_error.layer) == (Stage.BUILD, "{op_name}")
    cpu_ops = documented("cpu operators").failure
    assert cpu_ops is not None and cpu_ops.vendor_op == "{op_type}"
    shape = documented("dimensions of 0")
    assert shape.failure is not None and shape.failure.stage is Stage.LOAD
    assert [str(f.rewrite) for f in log_findings(shape)] == ["fix-dim"]
    assert [str(f.rewrite) for f in log_findings(documented("opset_version 10/11"))] == ["opset-down"]


def test_documented_cpu_notice_is_a_placement() -> None:
    line = next(ln for ln in DOCUMENTED if "will be executed on CPU" in ln)
    log = parse_hb_mapper(line)
    assert log.failure is None
    assert [(row.layer, row.target) for row in log.layers] == [("{op_name}", "cpu")]
    # Braces in a vendor name are text, not a format field.
    assert [(f.node, f.rule) for f in log_findings(log)] == [("{op_name}", "vendor-cpu")]
