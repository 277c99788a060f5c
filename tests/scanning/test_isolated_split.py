"""The isolated error split per site (layers.csv `isolated_weight_only_*`, `isolated_act_only_*`): only the
site's weights quantized, or only its activations, fed FP32 inputs, as Horizon's accuracy debug tool and
AIMET's QuantAnalyzer report it.

Oracle: for one site of the chain model, a QDQ model of that site alone built here with onnx.helper
(weights fake-quantized per output channel in numpy; or the input and output
through QuantizeLinear/DequantizeLinear with the scales the scan wrote in layers.csv), fed the FP32
input tensor onnxruntime computes, SQNR written out in numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
from onnx import helper, numpy_helper

import quantscan
from builders import WIDTH, write_chain

SITE = 3
"""mm3: MatMul(h2, w3) + b3 -> Relu -> h3, one kernel."""


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    # no graph optimisation: at ORT_ENABLE_BASIC onnxruntime rewrites this small DQ -> MatMul -> Add -> Relu -> Q
    # chain and its act-only figure moves by 5 dB from the numpy arithmetic (40.05 vs 45.39 dB)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        names, feeds)


def _sqnr_db(x: np.ndarray, y: np.ndarray) -> float:
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    return float(10 * np.log10(np.sum(x64 * x64) / np.sum((x64 - y64) ** 2)))


def _site_model(w: np.ndarray, b: np.ndarray, qin: tuple[float, int] | None, qout: tuple[float, int] | None
                ) -> onnx.ModelProto:
    """h_in -> [QDQ] -> MatMul(w) + b -> Relu -> [QDQ] -> h_out."""
    nodes, inits, data = [], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], "h_in"
    for tag, q in (("in", qin),):
        if q is not None:
            inits += [numpy_helper.from_array(np.array(q[0], np.float32), f"s_{tag}"),
                      numpy_helper.from_array(np.array(q[1], np.uint8), f"z_{tag}")]
            nodes += [helper.make_node("QuantizeLinear", [data, f"s_{tag}", f"z_{tag}"], [f"q_{tag}"]),
                      helper.make_node("DequantizeLinear", [f"q_{tag}", f"s_{tag}", f"z_{tag}"], [f"dq_{tag}"])]
            data = f"dq_{tag}"
    nodes += [helper.make_node("MatMul", [data, "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
              helper.make_node("Relu", ["a"], ["r"])]
    out = "r"
    if qout is not None:
        inits += [numpy_helper.from_array(np.array(qout[0], np.float32), "s_out"),
                  numpy_helper.from_array(np.array(qout[1], np.uint8), "z_out")]
        nodes += [helper.make_node("QuantizeLinear", ["r", "s_out", "z_out"], ["q_out"]),
                  helper.make_node("DequantizeLinear", ["q_out", "s_out", "z_out"], ["dq_out"])]
        out = "dq_out"
    graph = helper.make_graph(nodes, "site", [helper.make_tensor_value_info("h_in", onnx.TensorProto.FLOAT,
                                                                            ["N", WIDTH])],
                              [helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, ["N", WIDTH])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _int8_weights(w: np.ndarray) -> np.ndarray:
    """Symmetric int8 per output channel (MatMul [K, N]: axis 1). The Add after the MatMul is not a Gemm
    bias: its constant stays float, as the scan's MatMul+Add+Relu kernel leaves it."""
    s_w = (np.abs(w).max(axis=0) / 127.0).astype(np.float32)
    return (np.clip(np.round(w / s_w), -127, 127) * s_w).astype(np.float32)


@pytest.fixture(scope="module")
def scanned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, pd.DataFrame]:
    model, calib = write_chain(tmp_path_factory.mktemp("split"), samples=16)
    result = quantscan.scan(model, calib, gain_candidates=0, recover_check=False, threads=1)
    return model, calib, result.layers.set_index("node")


def test_weight_only_and_act_only_equal_a_qdq_model_of_that_half(scanned: tuple[Path, Path, pd.DataFrame]) -> None:
    model_path, calib, layers = scanned
    model = onnx.load(str(model_path))
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w, b = init[f"w{SITE}"], init[f"b{SITE}"]
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.extend(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, ["N", WIDTH])
                                for t in (f"h{SITE - 1}", f"h{SITE}"))
    x = np.load(calib / "x.npy")
    h_in, h_out = _run(exposed, {"x": x}, [f"h{SITE - 1}", f"h{SITE}"])
    producer, site = layers.loc[f"mm{SITE - 1}"], layers.loc[f"mm{SITE}"]
    q_in = (float(producer["act_scale"]), int(producer["act_zero_point"]))
    q_out = (float(site["act_scale"]), int(site["act_zero_point"]))

    wq = _int8_weights(w)
    weight_only = _run(_site_model(wq, b, None, None), {"h_in": h_in}, None)[0]  # type: ignore[arg-type]
    act_only = _run(_site_model(w, b, q_in, q_out), {"h_in": h_in}, None)[0]  # type: ignore[arg-type]
    both = _run(_site_model(wq, b, q_in, q_out), {"h_in": h_in}, None)[0]  # type: ignore[arg-type]

    assert site["isolated_weight_only_sqnr_db"] == pytest.approx(_sqnr_db(h_out, weight_only), abs=1e-3)
    assert site["isolated_act_only_sqnr_db"] == pytest.approx(_sqnr_db(h_out, act_only), abs=1e-3)
    assert site["isolated_sqnr_db"] == pytest.approx(_sqnr_db(h_out, both), abs=1e-3)  # the halves' whole


def test_sites_without_weights_have_no_split(scanned: tuple[Path, Path, pd.DataFrame]) -> None:
    layers = scanned[2]
    assert np.isnan(layers.loc["x", "isolated_weight_only_cosine"])  # the model input: activations only
    weighted = layers.drop(index="x")
    assert weighted["isolated_weight_only_cosine"].notna().all() and weighted["isolated_act_only_cosine"].notna().all()


def test_the_split_can_be_turned_off(scanned: tuple[Path, Path, pd.DataFrame]) -> None:
    """`--no-isolated-split` (split_isolated=False): the columns stay, empty; the isolated figure does not move."""
    model, calib, layers = scanned
    off = quantscan.scan(model, calib, gain_candidates=0, recover_check=False, split_isolated=False,
                         threads=1).layers.set_index("node")
    assert off["isolated_weight_only_cosine"].isna().all() and off["isolated_act_only_sqnr_db"].isna().all()
    pd.testing.assert_series_equal(off["isolated_sqnr_db"], layers["isolated_sqnr_db"].loc[off.index])
