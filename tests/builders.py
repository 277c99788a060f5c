"""Shared model builders and oracles for the tests (no tests here): ONNX-text models, the reference oracle.

The oracle is onnx.reference.ReferenceEvaluator on the *original* model: pure numpy kernels that are
independent from the rewrite code and from onnxruntime.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun


def build(text: str, initializers: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A model from ONNX text, with numpy initializers appended (the parser wants literal values)."""
    model = onnx.parser.parse_model(text)
    for name, value in (initializers or {}).items():
        model.graph.initializer.append(numpy_helper.from_array(value, name=name))
    onnx.checker.check_model(model, full_check=True)
    return model


class BatchNormalization(OpRun):
    """Inference-mode BN for every opset.

    onnx.reference's BatchNormalization_9 (opsets 9-13) switches to batch statistics whenever the
    `momentum` attribute is present, which Paddle exports always set: that is not what the spec (or any
    runtime) does for those opsets, so the oracle uses this kernel instead.
    """

    op_domain = ""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None, **_):  # type: ignore[no-untyped-def]
        if training_mode:
            raise NotImplementedError("training-mode BN is not an inference oracle")
        shape = (-1,) + (1,) * (x.ndim - 2)
        eps = 1e-5 if epsilon is None else epsilon
        y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape)
        return ((y + bias.reshape(shape)).astype(x.dtype),)


def evaluator(model: onnx.ModelProto) -> ReferenceEvaluator:
    return ReferenceEvaluator(model, new_ops=[BatchNormalization])


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(o) for o in evaluator(model).run(None, feeds)]


def assert_same_outputs(
    a: onnx.ModelProto, b: onnx.ModelProto, feeds: dict[str, np.ndarray], rel: float = 1e-4
) -> None:
    """Outputs equal within float32 rounding: max-abs ≤ rel × (output range, at least 1)."""
    assert [o.name for o in a.graph.output] == [o.name for o in b.graph.output]
    for x, y in zip(run(a, feeds), run(b, feeds), strict=True):
        assert x.shape == y.shape
        scale = max(float(np.ptp(x)) if x.size else 0.0, 1.0)
        np.testing.assert_allclose(y, x, atol=rel * scale, rtol=0)


def op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def rng_array(shape: tuple[int, ...], seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def calib_images(calib_dir: Path, limit: int = 4) -> list[np.ndarray]:
    """NCHW float32 tensors from an asset image folder, per its preprocess.json (images already sized)."""
    from PIL import Image

    spec = json.loads((calib_dir / "preprocess.json").read_text())
    out = []
    for name in spec["files"][:limit]:
        img = np.asarray(Image.open(calib_dir / name).convert("RGB"), dtype=np.float32)
        if spec.get("channel_order") == "BGR":
            img = img[..., ::-1]
        img = img * float(spec["scale"])
        img = (img - np.array(spec["mean"], np.float32)) / np.array(spec["std"], np.float32)
        out.append(np.ascontiguousarray(img.transpose(2, 0, 1)[None]).astype(np.float32))
    return out
