"""--state OUT=IN: samples in file order carry the FP32 model's state; parsing and name checks; a scan of
a tiny recurrent model and of silero-vad (after freeze-input) with its state fed back."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
from calib_helpers import spec
from onnx import TensorProto, helper

from builders import if_wrapped
from conftest import asset_calib, asset_model
from quantscan.api import scan
from quantscan.calib import load_calibration
from quantscan.calib.recurrent import check_state, parse_state, state_consts, with_state
from quantscan.errors import UsageError
from quantscan.rewrites.pipeline import rewrite

X = np.arange(1, 13, dtype=np.float32).reshape(6, 2)


def running_sum_folder(tmp_path: Path) -> Path:
    np.save(tmp_path / "x.npy", X)
    return tmp_path


def test_each_sample_gets_the_state_the_sample_before_left(tmp_path: Path) -> None:
    """A running sum s' = s + x: sample k must be fed s = x_0 + ... + x_{k-1} (numpy oracle), and the
    second pass reuses the states (the model runs once per sample, not once per sample per pass)."""
    calls = []

    def step(sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(1)
        return {"s_out": sample["s"] + sample["x"]}

    cs = load_calibration(running_sum_folder(tmp_path), [spec("x", (1, 2)), spec("s", (1, 2))],
                          consts=state_consts({"s_out": "s"}, {}))
    stateful = with_state(cs, {"s_out": "s"}, step)
    fed = [s["s"].copy() for s in stateful.samples()]
    expected = np.concatenate([np.zeros((1, 2), np.float32), np.cumsum(X, axis=0)[:-1]])[:, None, :]
    np.testing.assert_array_equal(np.stack(fed), expected)
    again = [s["s"] for s in stateful.samples()]
    np.testing.assert_array_equal(np.stack(again), expected)
    assert len(calls) == len(X) - 1
    assert [s["x"].tolist() for s in stateful.samples()] == [[x.tolist()] for x in X]  # the data is untouched


def test_a_given_start_value_is_the_first_state(tmp_path: Path) -> None:
    cs = load_calibration(running_sum_folder(tmp_path), [spec("x", (1, 2)), spec("s", (1, 2))],
                          consts=state_consts({"s_out": "s"}, {"s": 10.0}))
    stateful = with_state(cs, {"s_out": "s"}, lambda f: {"s_out": f["s"] + f["x"]})
    assert [float(s["s"][0, 0]) for s in stateful.samples()][:3] == [10.0, 11.0, 14.0]


def test_a_state_the_folder_stores_starts_the_stream(tmp_path: Path) -> None:
    """A folder cut from the middle of a stream (a decoder LM's KV cache, stored with each step) starts
    from its first file's stored state, not from zeros; later samples still get the carried one."""
    for k, x in enumerate(X):
        np.savez(tmp_path / f"{k:03d}.npz", x=x[None], s=np.full((1, 2), 100.0 + k, np.float32))
    pairs = {"s_out": "s"}
    consts = state_consts(pairs, {}, tmp_path)
    assert consts == {}
    cs = load_calibration(tmp_path, [spec("x", (1, 2)), spec("s", (1, 2))], consts=consts)
    stateful = with_state(cs, pairs, lambda f: {"s_out": f["s"] + f["x"]})
    fed = np.stack([s["s"][0] for s in stateful.samples()])
    expected = 100.0 + np.concatenate([np.zeros((1, 2), np.float32), np.cumsum(X, axis=0)[:-1]])
    np.testing.assert_array_equal(fed, expected)
    plain = tmp_path / "plain"
    plain.mkdir()
    assert state_consts(pairs, {}, running_sum_folder(plain)) == {"s": 0.0}  # no stored state: zeros


def test_bad_state_settings_are_usage_errors() -> None:
    assert parse_state(["stateN=state"]) == {"stateN": "state"}
    with pytest.raises(UsageError, match="OUT=IN"):
        parse_state(["stateN"])
    inputs = [spec("input", (1, 4)), spec("state", (2, 1, 4))]
    with pytest.raises(UsageError, match="expected an output of the model"):
        check_state({"stateM": "state"}, inputs, ["output", "stateN"])
    with pytest.raises(UsageError, match="expected an input of the model"):
        check_state({"stateN": "hidden"}, inputs, ["output", "stateN"])


def recurrent_model() -> onnx.ModelProto:
    """y = Relu(x·W + s), s' = Tanh(y): a state the output depends on, so the fed state shows in y."""
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.normal(size=(2, 2)).astype(np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "s"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
        helper.make_node("Tanh", ["y"], ["s_out"]),
    ]
    graph = helper.make_graph(
        nodes, "rnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2]),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [1, 2])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_scan_with_state_calibrates_on_carried_states(tmp_path: Path) -> None:
    """With the state carried, the Add sees x·W + s with s far from zero: its calibrated range is the
    range of the carried run (numpy oracle), not of s = 0."""
    model = recurrent_model()
    path = tmp_path / "rnn.onnx"
    onnx.save(model, path)
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(1)
    xs = rng.uniform(0, 1, size=(16, 2)).astype(np.float32)
    np.save(data / "x.npy", xs)
    w = onnx.numpy_helper.to_array(model.graph.initializer[0])
    s = np.zeros((1, 2), np.float32)
    carried = []
    for x in xs:
        y = np.maximum(x[None] @ w + s, 0)
        carried.append(y)
        s = np.tanh(y)
    result = scan(path, data, state={"s_out": "s"}, gain_candidates=0)
    assert result.run_info.options["batch_size"] == 1
    with_zero = scan(path, data, const={"s": 0.0}, gain_candidates=0)
    carried_max = np.concatenate(carried).max(axis=0)
    fresh_max = np.maximum(xs @ w, 0).max(axis=0)
    assert not np.allclose(carried_max, fresh_max)  # the two calibrations must differ to tell them apart
    np.testing.assert_allclose(_act_max(result, "y"), carried_max, rtol=1e-5)
    np.testing.assert_allclose(_act_max(with_zero, "y"), fresh_max, rtol=1e-5)


def _act_max(result: object, output: str) -> np.ndarray:
    ch = result.channels  # type: ignore[attr-defined]
    rows = ch[(ch["output"] == output) & ch["act_max"].notna()]
    return rows.sort_values("channel")["act_max"].to_numpy()


@pytest.mark.real
def test_silero_frozen_scans_with_its_state_and_measures_the_lstm(assets: Path, tmp_path: Path) -> None:
    """silero-vad as shipped (If on sr, rebuilt from the asset's graph) frozen at sr=16000, scanned with
    --state stateN=state: the LSTM that sat inside the If is a measured site, and quantization shows."""
    wrapped = if_wrapped(onnx.load(asset_model(assets, "silero_vad_openvino_16k")))
    frozen = rewrite(wrapped, [], freeze_input=["sr=16000"], write=False)
    assert frozen.passed
    path = tmp_path / "silero_16k.onnx"
    onnx.save(frozen.model, path)
    result = scan(path, asset_calib(assets, "silero_vad_openvino_16k"), state={"stateN": "state"}, limit=24,
                  gain_candidates=0, out=tmp_path / "run")
    layers = result.layers
    assert "LSTM" in set(layers["op_type"])
    assert layers.loc[layers["op_type"] == "LSTM", "isolated_cosine"].notna().all()
    assert result.headline.cosine < 0.99999  # quantized: not the float model's 1.00000
    assert not any("not analysed" in w for w in result.warnings)
    import pandas as pd

    assert "LSTM" in set(pd.read_csv(tmp_path / "run" / "layers.csv")["op_type"])


@pytest.mark.real
def test_silero_with_its_if_and_const_sr_scans_as_frozen_first(assets: Path, tmp_path: Path) -> None:
    """silero-vad as shipped (If on sr) scanned with --const sr=16000 --state stateN=state gives the
    layers.csv of the two-step route (rewrite --freeze-input sr=16000, then scan): the If is folded
    as freeze-input folds it, the LSTM inside is measured, and nothing is left float."""
    wrapped = if_wrapped(onnx.load(asset_model(assets, "silero_vad_openvino_16k")))
    path = tmp_path / "silero_if.onnx"
    onnx.save(wrapped, path)
    frozen = tmp_path / "silero_16k.onnx"
    assert rewrite(path, [], freeze_input=["sr=16000"], out=frozen).written
    calib = asset_calib(assets, "silero_vad_openvino_16k")
    result = scan(path, calib, const={"sr": 16000}, state={"stateN": "state"}, limit=12, gain_candidates=0,
                  out=tmp_path / "unfrozen")
    scan(frozen, calib, state={"stateN": "state"}, limit=12, gain_candidates=0, out=tmp_path / "frozen")
    import pandas as pd

    unfrozen_layers = pd.read_csv(tmp_path / "unfrozen" / "layers.csv")
    assert "LSTM" in set(unfrozen_layers["op_type"])
    pd.testing.assert_frame_equal(unfrozen_layers, pd.read_csv(tmp_path / "frozen" / "layers.csv"),
                                  check_exact=False, rtol=0, atol=1e-9)
    assert not any("not analysed" in w for w in result.warnings)
    assert any("If_0" in w and "--freeze-input sr=16000" in w for w in result.warnings)
