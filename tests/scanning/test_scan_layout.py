"""Analysis graphs of layout-heavy exports: NHWC front ends (tf2onnx) and position-embedding resizes (ViT).

Both once broke the scan's own graph: onnxruntime's TransposeOptimizer pushed the export's Transposes
through the Q/DQ pairs and shared constants of the analysis graph (a Mul by a (C,1,1) constant failed
shape inference; a weights-only Transpose came out permuted against its `@q` twin). Oracle: onnx's
ReferenceEvaluator running the saved QDQ model against the FP32 model, the cosine written out in numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

import quantscan
from builders import reference_outputs
from quantscan.errors import InternalError, SessionError
from quantscan.runner import Runner

NHWC_FRONT_END = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 7, 2, 9] x) => (float[N, 4] y) {
  a = Abs (x)
  t = Transpose <perm = [0, 3, 1, 2]> (a)
  m = Mul (t, c)
  e = Add (m, eps)
  l = Log (e)
  lt = Transpose <perm = [0, 2, 3, 1]> (l)
  f = Reshape (lt, flat)
  y = MatMul (f, w)
}
"""

POS_EMBED_RESIZE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 3, 16, 16] x) => (float[N, 10] y) {
  pe = Conv <kernel_shape = [4, 4], strides = [4, 4]> (x, pw, pb)
  tok0 = Reshape (pe, tokshape)
  tok = Transpose <perm = [0, 2, 1]> (tok0)
  toks = Shape (tok)
  dim = Slice (toks, two, big, zero)
  shp4 = Concat <axis = 0> (grid, dim)
  ppos = Slice (pos, one, big, one)
  ppos4 = Reshape (ppos, shp4)
  pt = Transpose <perm = [0, 3, 1, 2]> (ppos4)
  xs = Shape (x)
  hw = Slice (xs, two, four, zero)
  hw4 = Div (hw, four)
  sizes = Concat <axis = 0> (head_dims, hw4)
  rs = Resize <mode = "linear"> (pt, , , sizes)
  rst = Transpose <perm = [0, 2, 3, 1]> (rs)
  rs3 = Reshape (rst, seqshape)
  seqp = Add (tok, rs3)
  pool = ReduceMean <axes = [1], keepdims = 0> (seqp)
  y = MatMul (pool, hw_)
}
"""


def _save(tmp_path: Path, text: str, inits: dict[str, np.ndarray]) -> Path:
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in inits.items())
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return path


def _calib(tmp_path: Path, arrays: list[np.ndarray]) -> Path:
    folder = tmp_path / "calib"
    folder.mkdir()
    for i, a in enumerate(arrays):
        np.savez(folder / f"{i:03d}.npz", x=a)
    return folder


def nhwc_front_end(tmp_path: Path) -> tuple[Path, Path]:
    """tf2onnx's layout: NHWC in, Transpose to NCHW, a per-bin (C,1,1) gain and a log, Transpose back."""
    rng = np.random.default_rng(0)
    inits = {
        "c": rng.uniform(0.5, 2.0, (9, 1, 1)).astype(np.float32),
        "eps": np.array(1e-6, np.float32),
        "flat": np.array([0, -1], np.int64),
        "w": rng.normal(size=(7 * 2 * 9, 4)).astype(np.float32),
    }
    data = [rng.uniform(1.0, 4.0, (2, 7, 2, 9)).astype(np.float32) for _ in range(4)]
    return _save(tmp_path, NHWC_FRONT_END, inits), _calib(tmp_path, data)


def pos_embed_resize(tmp_path: Path) -> tuple[Path, Path]:
    """DINOv2's interpolate_pos_encoding: a 6x6 grid of embeddings resized to the 4x4 patch grid, its
    Reshape target taken from the token tensor's shape (so only the runtime folds it)."""
    rng = np.random.default_rng(1)
    d = 8
    inits = {
        "pw": rng.normal(0, 0.2, (d, 3, 4, 4)).astype(np.float32),
        "pb": np.zeros(d, np.float32),
        "tokshape": np.array([0, d, -1], np.int64),
        "pos": rng.normal(size=(1, 37, d)).astype(np.float32),
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
        "two": np.array([2], np.int64),
        "four": np.array([4], np.int64),
        "big": np.array([1000], np.int64),
        "grid": np.array([1, 6, 6], np.int64),
        "head_dims": np.array([1, d], np.int64),
        "seqshape": np.array([1, -1, d], np.int64),
        "hw_": rng.normal(0, 0.3, (d, 10)).astype(np.float32),
    }
    data = [rng.normal(size=(2, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    return _save(tmp_path, POS_EMBED_RESIZE, inits), _calib(tmp_path, data)


def _reference_cosine(model: Path, qdq: Path, calib: Path) -> float:
    """Output cosine of the saved QDQ model against FP32, both run by onnx's reference evaluator."""
    x, y = reference_outputs(model, qdq, calib)
    return float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))


@pytest.mark.parametrize("build", [nhwc_front_end, pos_embed_resize])
def test_layout_exports_scan_and_match_the_reference(tmp_path: Path, build) -> None:  # type: ignore[no-untyped-def]
    model, calib = build(tmp_path)
    qdq = tmp_path / "qdq.onnx"
    result = quantscan.scan(model, calib, save_qdq=qdq)
    assert result.headline.cosine == pytest.approx(_reference_cosine(model, qdq, calib), abs=1e-5)
    # every float tensor compared against its own `@q` twin: an element-wise match, never a broadcast
    assert result.tensors["cumulative_cosine"].notna().all()


def test_quantize_static_recipe_on_a_scalar_weight(tmp_path: Path) -> None:
    """quantize_static quantizes the Add's scalar epsilon as a weight: its figures are one channel's."""
    model, calib = nhwc_front_end(tmp_path)
    result = quantscan.scan(model, calib, profile="onnxruntime")
    rows = result.layers.set_index("node")
    eps_site = next(s.node for s in result.sites if s.weight == "eps")
    row = rows.loc[eps_site]
    assert row["weight_sqnr_db"] == pytest.approx(row["weight_worst_channel_sqnr_db"])
    assert row["weight_channel_range_spread"] == 1.0


RESHAPE_BY_INPUT = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 6] x, int64[2] s) => (float[A, B] y) {
  y = Reshape (x, s)
}
"""


def test_a_failed_run_of_a_graph_we_built_is_our_bug() -> None:
    """The same run failure is bad input on the user's model and an internal error on a built graph."""
    model = onnx.parser.parse_model(RESHAPE_BY_INPUT)
    feeds = {"x": np.zeros((1, 6), np.float32), "s": np.array([4, 4], np.int64)}
    runner = Runner()
    with pytest.raises(SessionError):
        runner.session(model).run(feeds)
    with pytest.raises(InternalError):
        runner.session(model, built=True).run(feeds)


def test_extract_reproduces_the_site(tmp_path: Path) -> None:
    """The Mul site cut out with its real inputs measures as it does inside the full model: the same
    isolated figure (same input and output ranges, same data), so a vendor or a bug report gets it."""
    from quantscan.extract import extract, save_samples

    model, calib = nhwc_front_end(tmp_path)
    full = quantscan.scan(model, calib).layers.set_index("node")
    cut = extract(model, "Mul_2", calib=calib)
    (tmp_path / "cut").mkdir()
    onnx.save(cut.model, tmp_path / "cut" / "mul.onnx")
    saved = save_samples(cut, calib, tmp_path / "cut" / "mul.onnx", samples=list(range(8)))
    (tmp_path / "cut_calib").mkdir()
    saved.inputs_path.rename(tmp_path / "cut_calib" / "mul.npz")
    alone = quantscan.scan(tmp_path / "cut" / "mul.onnx", tmp_path / "cut_calib").layers.set_index("node")
    assert alone.loc["Mul_2", "isolated_sqnr_db"] == pytest.approx(full.loc["Mul_2", "isolated_sqnr_db"], abs=1e-3)
