"""The kernel patterns on a real exported model: ppocrv4_rec (PP-OCRv4 SVTR, Paddle export) has five
arithmetic LayerNorms (ReduceMean/Pow/Sqrt/Div) and three Softmax ops. Respelled here the way other
exporters write the same functions (1/Sqrt, Reciprocal, Pow -0.5, means as MatMul by 1/C; Softmax as
ReduceMax/Sub/Exp/ReduceSum/Div), the scan must find the same kernels: same site count, the same
tensors quantized, each respelled kernel one site.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from conftest import asset_calib, asset_model
from quantscan.graph.index import GraphIndex
from quantscan.patterns import hardswish, layernorm
from quantscan.runner import Runner
from quantscan.scanning.prepare import prepare_scan
from quantscan.sites import Site

pytestmark = pytest.mark.real

MODEL = "ppocrv4_rec"


def _const(graph: onnx.GraphProto, name: str, value: np.ndarray) -> str:
    graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def _replace(graph: onnx.GraphProto, old: onnx.NodeProto, new: list[onnx.NodeProto]) -> None:
    """Put `new` where `old` was (graph order stays topological: `new` reads what `old` read). Nodes are
    found by their output: protobuf copies them when the list is rebuilt."""
    nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in graph.node]
    k = next(i for i, n in enumerate(nodes) if list(n.output) == list(old.output))
    del graph.node[:]
    graph.node.extend([*nodes[:k], *new, *nodes[k + 1 :]])


def respell_layernorms(model: onnx.ModelProto) -> list[str]:
    """LayerNorm k: 0 Div(1, Sqrt) then Mul; 1 Reciprocal then Mul; 2 Pow(-0.5) then Mul; 3 both means as
    MatMul by a [C, 1] matrix of 1/C; 4 as exported. Returns the spellings, in graph order."""
    graph = model.graph
    index = GraphIndex.of(model)
    matches = [m for n in index.nodes if isinstance(m := layernorm.match_at(index, n), layernorm.LayerNormMatch)]
    assert len(matches) == 5
    one = _const(graph, "respell/one", np.array(1.0, np.float32))
    mhalf = _const(graph, "respell/mhalf", np.array(-0.5, np.float32))
    for k, found in enumerate(matches):
        sqrt = next(n for n in found.nodes if n.op_type == "Sqrt")
        div = next(n for n in found.nodes if n.op_type == "Div")
        d, y, r = div.input[0], div.output[0], f"respell/r{k}"
        if k == 0:
            _replace(graph, div, [helper.make_node("Div", [one, sqrt.output[0]], [r], name=f"respell/inv{k}"),
                                  helper.make_node("Mul", [d, r], [y], name=f"respell/mul{k}")])
        elif k == 1:
            _replace(graph, div, [helper.make_node("Reciprocal", [sqrt.output[0]], [r], name=f"respell/inv{k}"),
                                  helper.make_node("Mul", [r, d], [y], name=f"respell/mul{k}")])
        elif k == 2:
            _replace(graph, div, [helper.make_node("Pow", [sqrt.input[0], mhalf], [r], name=f"respell/inv{k}"),
                                  helper.make_node("Mul", [d, r], [y], name=f"respell/mul{k}")])
            _replace(graph, sqrt, [])
        elif k == 3:
            assert found.scale is not None
            channels = index.constant(found.scale).size  # type: ignore[union-attr]
            w = _const(graph, "respell/mean", np.full((channels, 1), 1.0 / channels, np.float32))
            for mean in [n for n in found.nodes if n.op_type == "ReduceMean"]:
                _replace(graph, mean, [helper.make_node("MatMul", [mean.input[0], w], [mean.output[0]],
                                                        name=mean.name)])
    return ["Div(1, Sqrt)", "Reciprocal", "Pow -0.5", "MatMul mean", "as exported"]


def respell_softmaxes(model: onnx.ModelProto) -> int:
    """Every Softmax over the last axis -> ReduceMax/Sub/Exp/ReduceSum/Div (opset 12: axes attributes)."""
    graph = model.graph
    softmaxes = [n for n in graph.node if n.op_type == "Softmax"]
    for k, sm in enumerate(softmaxes):
        x, y, t = sm.input[0], sm.output[0], f"respell/sm{k}"
        _replace(graph, sm, [
            helper.make_node("ReduceMax", [x], [f"{t}/m"], name=f"{t}/max", axes=[-1], keepdims=1),
            helper.make_node("Sub", [x, f"{t}/m"], [f"{t}/d"], name=f"{t}/sub"),
            helper.make_node("Exp", [f"{t}/d"], [f"{t}/e"], name=f"{t}/exp"),
            helper.make_node("ReduceSum", [f"{t}/e"], [f"{t}/s"], name=f"{t}/sum", axes=[-1], keepdims=1),
            helper.make_node("Div", [f"{t}/e", f"{t}/s"], [y], name=f"{t}/div"),
        ])
    return len(softmaxes)


def sites_of(path: Path, assets: Path) -> list[Site]:
    return prepare_scan(path, asset_calib(assets, MODEL), limit=1).graph.sites


def test_respelled_layernorms_and_softmaxes_are_the_same_kernels(assets: Path, tmp_path: Path) -> None:
    model = onnx.load(asset_model(assets, MODEL))
    assert all(dict((a.name, a.i) for a in n.attribute)["axis"] in (2, 3) for n in model.graph.node
               if n.op_type == "Softmax")  # the last axis of rank 3 / rank 4 tensors: a last-axis softmax
    softmax_inputs = [[n.input[0]] for n in model.graph.node if n.op_type == "Softmax"]
    respell_layernorms(model)
    assert respell_softmaxes(model) == 3
    onnx.checker.check_model(model)
    path = tmp_path / "respelled.onnx"
    onnx.save(model, path)

    x = {"x": np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 320)).astype(np.float32)}
    runner = Runner(threads=1)
    want = runner.session(asset_model(assets, MODEL)).run(x)
    got = runner.session(path).run(x)
    for name, value in want.items():  # the respelled model computes what the export computes
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)

    before, after = sites_of(asset_model(assets, MODEL), assets), sites_of(path, assets)
    assert len(after) == len(before) == 127  # 126 kernels and the model input x
    # the opset 12 -> 13 upgrade wraps a Softmax-11 in Reshapes: its output gets an `_intermediate` twin
    assert {s.output for s in after} == {s.output.removesuffix("_intermediate") for s in before}
    norms = [s.kernel for s in after if s.kernel.startswith("LayerNorm[")]
    assert norms == [
        "LayerNorm[ReduceMean+Sub+Pow+ReduceMean+Add+Sqrt+Div+Mul+Mul+Add]",
        "LayerNorm[ReduceMean+Sub+Pow+ReduceMean+Add+Sqrt+Reciprocal+Mul+Mul+Add]",
        "LayerNorm[ReduceMean+Sub+Pow+ReduceMean+Add+Pow+Mul+Mul+Add]",
        "LayerNorm[MatMul+Sub+Pow+MatMul+Add+Sqrt+Div+Mul+Add]",
        "LayerNorm[ReduceMean+Sub+Pow+ReduceMean+Add+Sqrt+Div+Mul+Add]",
    ]
    softmax_sites = [s for s in after if s.kernel.startswith("Softmax[")]
    assert [s.kernel for s in softmax_sites] == ["Softmax[ReduceMax+Sub+Exp+ReduceSum+Div]"] * 3
    assert all(s.sensitive and len(s.inputs) == 1 for s in softmax_sites)
    assert [s.inputs for s in softmax_sites] == softmax_inputs  # quantized at what the Softmax read


def test_hardswish_respelled_as_x_times_hardsigmoid_keeps_the_sites(assets: Path, tmp_path: Path) -> None:
    """ppocr_mobile_v2_cls writes HardSwish as x·Clip(x+3, 0, 6)/6 after its Convs; written as
    x·HardSigmoid(x; 1/6, 1/2) instead (as other exporters do), every one is still fused into its Conv."""
    name = "ppocr_mobile_v2_cls"
    model = onnx.load(asset_model(assets, name))
    index = GraphIndex.of(model)
    found = [m for n in index.nodes
             if isinstance(m := hardswish.match_at(index, n), hardswish.HardSwishMatch)
             and m.spelling is hardswish.Spelling.CLIP]
    assert len(found) >= 5
    for k, match in enumerate(found):
        hs = f"respell/hs{k}"
        _replace(model.graph, match.nodes[-1], [
            helper.make_node("HardSigmoid", [match.x], [hs], name=hs, alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", [match.x, hs], [match.output], name=f"{hs}/mul"),
        ])
        for node in match.nodes[:-1]:
            _replace(model.graph, node, [])
    path = tmp_path / "respelled.onnx"
    onnx.save(model, path)
    x = {"x": np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)}
    runner = Runner(threads=1)
    want, got = runner.session(asset_model(assets, name)).run(x), runner.session(path).run(x)
    for out, value in want.items():
        np.testing.assert_allclose(got[out], value, rtol=1e-4, atol=1e-5, err_msg=out)
    calib = asset_calib(assets, name)
    before = prepare_scan(asset_model(assets, name), calib, limit=1).graph.sites
    after = prepare_scan(path, calib, limit=1).graph.sites
    def where(sites: list[Site]) -> list[tuple[str, str, list[str]]]:
        """Node, output and inputs of each site; `_v_*` names are the opset upgrade's own, numbered by it."""
        return [(s.node, s.output, ["_v_" if i.startswith("_v_") else i for i in s.inputs]) for s in sites]

    assert where(after) == where(before)
    relabelled = [s.kernel for s in after if "HardSigmoid+Mul" in s.kernel]
    assert len(relabelled) == len(found)
    assert all(k.startswith("Conv+") and k.endswith("HardSwish[HardSigmoid+Mul]") for k in relabelled)
