"""A `--const` input with a free non-batch axis takes its size from `--input-shape INPUT:AXIS=V`.

The error for such a const asks for exactly that flag; before, giving it changed nothing (silero-vad's
`state` [2, ?, 128] with `--const state=0 --input-shape state:1=1` got the same error back).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from tests.builders import build

import quantscan
from quantscan.errors import UsageError

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 4] x, float[2, ?, 3] s) => (float[N, 4] y, float[2, ?, 3] s_out) {
  w = Constant <value = float[4, 4] {1,0,0,0, 0,2,0,0, 0,0,3,0, 0,0,0,4}> ()
  m = MatMul (x, w)
  y = Relu (m)
  s_out = Identity (s)
}
"""


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    model = tmp_path / "m.onnx"
    onnx.save(build(MODEL), model)
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    np.save(calib / "x.npy", rng.normal(size=(8, 4)).astype(np.float32))
    return model, calib


def test_const_takes_the_size_input_shape_gives(tmp_path: Path) -> None:
    model, calib = _setup(tmp_path)
    with pytest.raises(UsageError, match="--input-shape s:1=N"):
        quantscan.scan(model, calib, const={"s": 0.0}, quiet=True)
    result = quantscan.scan(model, calib, const={"s": 0.0}, input_dims=["s:1=5"], quiet=True)
    assert set(result.layers["op_type"]) >= {"MatMul"}
    assert result.output_metrics["y"].cosine > 0.99
