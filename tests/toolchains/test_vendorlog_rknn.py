"""RKNN-Toolkit2 2.5.0 logs recorded on this machine (tests/fixtures/vendorlog/rknn-2.5.0/README.md).

The expected facts were read off the logs by eye (which layer, which target, which figures), and the
console table is checked against the file the toolkit wrote for the same run (error_analysis.txt):
two renderings of one measurement must parse to the same rows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quantscan.toolchains.findings import RULE_CPU, RULE_FAILED, RULE_OUTLIER, RULE_PRECISION, log_findings
from quantscan.toolchains.parsed import Stage
from quantscan.toolchains.rknn.log import parse_accuracy_analysis, parse_rknn

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vendorlog" / "rknn-2.5.0"


def text(name: str) -> str:
    """The bytes as `quantscan log` reads them (read_text would turn progress-bar carriage returns into lines)."""
    return (FIXTURES / name).read_bytes().decode("utf-8")


def test_int8_build_with_analysis_reaches_the_analysis_stage() -> None:
    parsed = parse_rknn(text("rapid_orientation_int8_analysis.log"))
    assert parsed.tool == "rknn-toolkit2" and parsed.version == "2.5.0"
    assert parsed.failure is None
    assert parsed.stage_reached is Stage.ANALYSIS


def test_layer_table_placements_and_float16() -> None:
    parsed = parse_rknn(text("rapid_orientation_int8_analysis.log"))
    # The table numbers its rows 0..42: every row parsed, none invented.
    assert len(parsed.layers) == 43
    by_name = {row.layer: row for row in parsed.layers}
    assert by_name["Conv.0"].vendor_op == "ConvHardSwish" and by_name["Conv.0"].target == "npu"
    assert by_name["Softmax.0"].target == "npu" and by_name["Softmax.0"].dtype == "float16"
    reshape = by_name["p2o.pd_op.matmul.0.0_rs"]
    assert (reshape.vendor_op, reshape.target, reshape.dtype) == ("Reshape", "cpu", "float16")
    cpu = [r.layer for r in parsed.layers if r.target == "cpu" and not r.io_operator]
    assert cpu == ["p2o.pd_op.matmul.0.0_rs"]
    assert parsed.float_tensors == ["Add.9-rs_sw", "fetch_name_0", "p2o.pd_op.matmul.0.0_rs_sw__float16"]


def test_findings_without_a_model_name_the_vendor_layers() -> None:
    parsed = parse_rknn(text("rapid_orientation_int8_analysis.log"))
    rows = [(f.rule, f.node, f.op_type, str(f.severity)) for f in log_findings(parsed)]
    assert rows[:2] == [
        (RULE_PRECISION, "Softmax.0", "exSoftmax13", "info"),
        (RULE_CPU, "p2o.pd_op.matmul.0.0_rs", "Reshape", "warn"),
    ]
    assert [(rule, severity) for rule, _, _, severity in rows[2:]] == [(RULE_OUTLIER, "info")] * 7


def test_accuracy_analysis_console_equals_the_snapshot_file() -> None:
    console = parse_accuracy_analysis(text("rapid_orientation_int8_analysis.log"))
    snapshot = parse_accuracy_analysis(text("rapid_orientation_error_analysis.txt"))
    assert len(console) == 75
    strip = [(r.layer, r.vendor_op, r.entire_cosine, r.single_cosine, r.entire_euclidean, r.single_euclidean)
             for r in console]
    assert strip == [(r.layer, r.vendor_op, r.entire_cosine, r.single_cosine, r.entire_euclidean,
                      r.single_euclidean) for r in snapshot]


def test_accuracy_analysis_rows_as_printed() -> None:
    rows = {r.layer: r for r in parse_accuracy_analysis(text("rapid_orientation_error_analysis.txt"))}
    six = rows["p2o.pd_op.hardswish.5.0"]
    assert (six.vendor_op, six.entire_cosine, six.single_cosine) == ("HardSwish", 0.97523, 0.99163)
    assert (six.entire_euclidean, six.single_euclidean) == (184.11072, 106.29034)
    fused = rows["p2o.pd_op.batch_norm_.0.0"]  # the Conv RKNN fused with its HardSwish prints no figures
    assert fused.vendor_op == "Conv" and fused.entire_cosine is None and fused.single_cosine is None
    # Every row with figures in the file has a "|" between cosine and distance: count them independently.
    table = text("rapid_orientation_error_analysis.txt")
    with_figures = sum(1 for line in table.splitlines() if re.match(r"^\[\w+\].*\|", line))
    assert sum(1 for r in rows.values() if r.single_cosine is not None) == with_figures


def test_build_failure_names_the_stage_and_the_node() -> None:
    parsed = parse_rknn(text("nonzero_build_fail.log"))
    assert parsed.failure is not None
    assert parsed.failure.stage is Stage.BUILD
    assert (parsed.failure.vendor_op, parsed.failure.layer) == ("NonZero", "result")
    assert "Remove NonZero('result') manually" in parsed.failure.message
    assert parsed.stage_reached is Stage.LOAD
    finding = log_findings(parsed)[0]
    assert (finding.rule, finding.node, finding.value, str(finding.severity)) == (RULE_FAILED, "result", "build",
                                                                                  "error")
    assert finding.rewrite is not None and finding.rewrite.value == "fix-dim"


def test_quantize_failure_inside_build_after_a_progress_bar() -> None:
    # The error follows the quantization progress bar on the same line: `...?it/s]E build: The input(...`.
    log = text("rapid_orientation_quantize_fail.log")
    parsed = parse_rknn(log)
    assert parsed.failure is not None and parsed.failure.stage is Stage.QUANTIZE
    assert parsed.failure.message.startswith("The input(") and "is wrong, expect 'nchw' like (1, 3, 224, 224)!" in (
        parsed.failure.message)
    assert parsed.stage_reached is Stage.LOAD
    # `source` names the file line a user finds the message on.
    assert "is wrong, expect 'nchw'" in log.split("\n")[parsed.failure.line - 1]


def test_line_numbers_are_file_lines() -> None:
    log = text("rapid_orientation_int8_analysis.log").split("\n")
    parsed = parse_rknn("\n".join(log))
    for row in parsed.similarity[:5] + parsed.similarity[-5:]:
        assert row.layer in log[row.line - 1]
    for layer in parsed.layers:
        assert layer.layer in log[layer.line - 1]


def test_load_failure_suggests_the_opset_rewrite() -> None:
    parsed = parse_rknn(text("dft_load_fail.log"))
    assert parsed.failure is not None and parsed.failure.stage is Stage.LOAD
    assert parsed.failure.message == "Unsupport onnx opset 20, need <= 19!"
    assert parsed.stage_reached is None
    (finding,) = log_findings(parsed)
    assert finding.node == "" and finding.rewrite is not None and finding.rewrite.value == "opset-down"


def test_cpu_fallback_of_an_op_the_npu_does_not_run() -> None:
    parsed = parse_rknn(text("einsum_cpu_fallback.log"))
    assert parsed.failure is None and parsed.stage_reached is Stage.COMPILE
    findings = log_findings(parsed)
    assert [(f.rule, f.node, f.op_type, str(f.placement)) for f in findings] == [(RULE_CPU, "z", "Einsum", "cpu")]


@pytest.mark.parametrize("name", ["rapid_orientation_int8_analysis.log", "nonzero_build_fail.log"])
def test_colour_codes_do_not_reach_the_findings(name: str) -> None:
    for finding in log_findings(parse_rknn(text(name))):
        assert "\x1b" not in finding.reason + finding.fix + finding.node


def test_weight_outlier_table() -> None:
    outliers = parse_rknn(text("rapid_orientation_int8_analysis.log")).weight_outliers
    assert [o.tensor for o in outliers] == [f"conv2d_{i}.w_0_deepcopy_{j}" for i, j in
                                            [(5, 25), (9, 45), (15, 75), (17, 85), (19, 95), (21, 105), (27, 129)]]
    assert (outliers[0].abs_mean, outliers[0].abs_std, outliers[0].values) == (3.48, 5.27, (-63.446,))
    assert outliers[2].values == (-19.155, -18.787)
