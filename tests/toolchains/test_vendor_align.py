"""The vendor/quantscan join on tiny hand-made tables: names, loss kinds, placements, agreement."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from quantscan.toolchains import align

GRAPH = align.GraphNames(
    producer={"x": "", "conv_out": "Conv.0", "hs_out": "HardSwish.0", "mm_out": "MatMul.0", "logits": "Add.8",
              "prob": "Softmax.0"},
    op_type={"Conv.0": "Conv", "HardSwish.0": "HardSwish", "MatMul.0": "MatMul", "Add.8": "Add",
             "Softmax.0": "Softmax"},
    outputs=frozenset({"prob"}),
)


@pytest.mark.parametrize(("name", "node", "tensor", "derived"), [
    ("hs_out", "HardSwish.0", "hs_out", False),  # a layer named by its ONNX output tensor
    ("Conv.0", "Conv.0", "", False),  # a node name
    ("MatMul.0#2", "MatMul.0", "", True),  # RKNN's rewrite of a node keeps its name plus #N
    ("mm_out_rs_sw", "MatMul.0", "mm_out", True),  # reshaped/swapped copy of a tensor
    ("x_int8", "", "x", True),  # the quantized input
    ("logits-rs_sw", "Add.8", "logits", True),
])
def test_vendor_names_map_back_to_the_onnx_graph(name: str, node: str, tensor: str, derived: bool) -> None:
    assert align.onnx_name(name, GRAPH) == align.Mapped(node, tensor, derived)


def test_a_name_the_graph_never_had_maps_to_nothing() -> None:
    assert align.onnx_name("rknn_private_7", GRAPH) is None


def test_loss_kinds_follow_the_error_ratio() -> None:
    assert align.classify_loss(0.99995, 0.9999) == "none"
    assert align.classify_loss(0.99, 0.991) == "quantization"  # they agree: int8 is the cause
    assert align.classify_loss(0.999, 0.95) == "lowering"  # the vendor loses 50x more than the simulation
    assert align.classify_loss(0.95, 0.999) == "quantization"  # quantscan pessimistic: still int8's loss
    assert align.classify_loss(math.nan, 0.9) == ""


def test_same_values_rejects_a_layer_named_after_its_input() -> None:
    # RKNN names its swapped Softmax "logits-rs_sw": the values are probabilities, not the logits
    softmax = align.onnx_name("logits-rs_sw", GRAPH)
    assert softmax is not None and not align.same_values(softmax, "exSoftmax13", GRAPH)
    reshaped = align.onnx_name("mm_out_rs_sw", GRAPH)
    assert reshaped is not None and align.same_values(reshaped, "Reshape", GRAPH)
    assert align.same_values(reshaped, "Conv", GRAPH)  # MatMul lowered to a 1x1 Conv: same values


def test_a_swapped_layer_is_the_op_that_reads_the_tensor_it_is_named_after() -> None:
    """RKNN's swap_reshape_prelu (MTCNN RNet): `/dense4/Gemm_output_0_sw` is /prelu4/PRelu moved above a
    Reshape, named after the Gemm output it reads; it is compared with the PReLU's figures, not the Gemm's."""
    graph = align.GraphNames(
        producer={"x": "", "gemm_out": "Gemm.0", "act": "PRelu.0"},
        op_type={"Gemm.0": "Gemm", "PRelu.0": "PRelu"},
        outputs=frozenset({"act"}),
        readers={"x": (("Gemm.0", "gemm_out"),), "gemm_out": (("PRelu.0", "act"),)},
    )
    layers = [align.LayerFigures("gemm_out_sw", "PRelu", 0.9995, 0.999),
              align.LayerFigures("gemm_out_mm", "Conv", 0.9999, 0.9999)]
    qs_layers = pd.DataFrame({"node": ["Gemm.0"], "output": ["act"], "isolated_cosine": [0.9994]})
    qs_tensors = pd.DataFrame({"tensor": ["gemm_out", "act"], "cumulative_cosine": [0.9998, 0.9991]})
    table = align.align_layers(layers, graph, qs_layers, qs_tensors, [], {}).set_index("layer")
    assert (table.loc["gemm_out_sw", "node"], table.loc["gemm_out_sw", "tensor"]) == ("PRelu.0", "act")
    assert table.loc["gemm_out_sw", "qs_isolated_cosine"] == 0.9994
    assert table.loc["gemm_out_sw", "qs_cumulative_cosine"] == 0.9991
    assert table.loc["gemm_out_mm", "tensor"] == "gemm_out"  # the Gemm's own output stays the Gemm's
    two_readers = align.GraphNames(graph.producer, graph.op_type, graph.outputs,
                                   {"gemm_out": (("PRelu.0", "act"), ("Add.0", "sum"))})
    mapped = align.onnx_name("gemm_out_sw", two_readers)
    assert mapped is not None and align.swapped("gemm_out_sw", "PRelu", mapped, two_readers) is None


def test_check_placements_combines_cpu_and_float16_findings() -> None:
    findings = pd.DataFrame([
        {"node": "Softmax.0", "rule": "float16", "placement": "npu"},
        {"node": "Softmax.0", "rule": "precision", "placement": "npu"},
        {"node": "MatMul.0", "rule": "param-limit", "placement": "cpu"},
    ])
    assert align.predicted_placements(findings) == {"Softmax.0": "npu-float16", "MatMul.0": "cpu"}


def _table() -> pd.DataFrame:
    layers = [
        align.LayerFigures("hs_out", "HardSwish", 0.99, 0.98),
        align.LayerFigures("mm_out_rs_sw", "Conv", 0.90, 0.89),
        align.LayerFigures("logits-rs_sw", "exSoftmax13", 0.999, 0.97),
        align.LayerFigures("prob", "Reshape", 1.0, 0.97),
    ]
    qs_layers = pd.DataFrame({"node": ["Conv.0", "MatMul.0", "Softmax.0"], "output": ["hs_out", "mm_out", "prob"],
                              "isolated_cosine": [0.991, 0.999, 0.9995]})
    qs_tensors = pd.DataFrame({"tensor": ["hs_out", "mm_out", "logits", "prob"],
                               "cumulative_cosine": [0.985, 0.95, 0.95, 0.96]})
    places = [align.VendorPlace("Conv.0", "ConvHardSwish", "npu"), align.VendorPlace("MatMul.0#2", "Conv", "npu"),
              align.VendorPlace("Softmax.0", "exSoftmax13", "npu-float16"),
              align.VendorPlace("mm_out_rs", "Reshape", "cpu-float16")]
    return align.align_layers(layers, GRAPH, qs_layers, qs_tensors, places, {"Softmax.0": "npu-float16"})


def test_align_layers_lines_up_figures_losses_and_placements() -> None:
    table = _table().set_index("layer")
    assert list(_table().columns) == align.VENDOR_COLUMNS
    hs = table.loc["hs_out"]
    assert (hs["node"], hs["qs_isolated_cosine"], hs["qs_cumulative_cosine"]) == ("HardSwish.0", 0.991, 0.985)
    assert hs["loss"] == "quantization" and hs["vendor_placement"] == "npu"  # via its kernel Conv.0
    assert table.loc["mm_out_rs_sw", "loss"] == "lowering"  # 0.90 against quantscan's 0.999
    assert table.loc["mm_out_rs_sw", "vendor_placement"] == "npu"  # MatMul.0#2 outranks the inserted Reshape
    assert math.isnan(table.loc["logits-rs_sw", "qs_isolated_cosine"])  # not the logits' values
    assert bool(table.loc["prob", "is_output"]) and table.loc["prob", "check_placement"] == "npu-float16"


def test_placement_findings_explain_inserted_layout_nodes_only() -> None:
    places = [align.VendorPlace("Softmax.0", "exSoftmax13", "npu-float16"),
              align.VendorPlace("mm_out_rs", "Reshape", "cpu-float16"),
              align.VendorPlace("Conv.0", "ConvHardSwish", "npu")]
    rows, unexplained, explained = align.placement_findings(places, GRAPH, {}, "rknn-toolkit2", "rk3588")
    assert (unexplained, explained) == (1, 1)
    softmax = rows.set_index("node").loc["Softmax.0"]
    assert (softmax["value"], softmax["limit"], softmax["severity"]) == ("npu-float16", "npu", "warn")
    _, unexplained, _ = align.placement_findings(places, GRAPH, {"Softmax.0": "npu-float16"}, "rknn-toolkit2",
                                                 "rk3588")
    assert unexplained == 0  # once the profile knows, check predicts it


def test_agreement_counts_rank_correlation_and_top_overlap() -> None:
    table = pd.DataFrame({
        "layer": [f"l{i}" for i in range(8)],
        "qs_isolated_cosine": [0.90, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97],
        "vendor_single_cosine": [0.91, 0.90, 0.92, 0.93, 0.94, 0.95, 0.97, 0.96],
        "qs_cumulative_cosine": [0.9] * 8,
        "vendor_entire_cosine": [math.nan] * 8,
    })
    got = align.agreement(table)
    assert got["spearman_isolated"] == pytest.approx(1 - 6 * 4 / (8 * 63))  # two swapped pairs: sum d^2 = 4
    assert got["top5_overlap_isolated"] == 5 and got["isolated_layers"] == 8
    assert got["cumulative_layers"] == 0 and math.isnan(float(got["spearman_cumulative"]))


def test_agreement_per_site_collapses_vendor_layers_that_share_one_quantscan_figure() -> None:
    """RKNN splits one Gemm site into out0_mm, out0_int8, out0: the same quantscan figure three times
    against three vendor figures. Per site, the vendor's worst of them stands for the site."""
    table = pd.DataFrame({
        "layer": ["a", "b", "c", "out0_mm", "out0_int8", "out0"],
        "qs_isolated_cosine": [0.990, 0.995, 0.999, 0.980, 0.980, 0.980],
        "vendor_single_cosine": [0.991, 0.996, 0.9995, 0.985, 0.9999, 0.9999],
        "qs_cumulative_cosine": [math.nan] * 6,
        "vendor_entire_cosine": [math.nan] * 6,
    })
    got = align.agreement(table)
    assert got["spearman_isolated"] < 0.9 and got["isolated_sites"] == 4
    assert got["spearman_isolated_sites"] == pytest.approx(1.0)  # a < b < c and out0 worst on both sides
