"""clamp-mask: a float-min attention mask becomes a finite value (-1e4 by default in the pass; the runner
chooses the smallest proven-exact candidate), the Softmax output is unchanged (oracle:
onnx.reference on the original), the runner's exact proof passes, and a sentinel that reaches no
Softmax is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from builders import FLOAT_MIN, attention_model, run
from quantscan.records import RewriteId
from quantscan.rewrites.clamp_mask import CLAMP_CANDIDATES, CLAMP_VALUE, clamp_mask
from quantscan.rewrites.pipeline import REWRITES, rewrite

X = np.random.default_rng(1).normal(size=(4, 8, 16)).astype(np.float32)


def _mask(model: onnx.ModelProto) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "mask"))


def test_float_min_mask_is_clamped_and_softmax_unchanged() -> None:
    m = attention_model()
    res = clamp_mask(m)
    assert len(res.changes) == 1 and res.exact
    assert "mask_add" in res.changes[0].detail and "softmax" in res.changes[0].detail
    before, after = _mask(m), _mask(res.model)
    assert before.min() == FLOAT_MIN and after.min() == CLAMP_VALUE
    assert np.array_equal(after[before > -1e30], before[before > -1e30])  # other values untouched
    (a,), (b,) = run(m, {"x": X}), run(res.model, {"x": X})
    assert np.abs(a - b).max() <= 1e-6 * np.abs(a).max()
    assert _mask(m).min() == FLOAT_MIN  # the input model is not mutated


def test_runner_proof_passes() -> None:
    assert REWRITES[RewriteId.CLAMP_MASK] is clamp_mask
    report = rewrite(attention_model(), ["clamp-mask"], write=False)
    assert report.passed and report.proof.exact
    assert [s.rewrite for s in report.steps] == ["clamp-mask"]


def test_without_a_value_the_smallest_exact_candidate_is_written() -> None:
    """The runner tries -100 first; on this block it is exact (its scores are small), so it is kept."""
    report = rewrite(attention_model(), ["clamp-mask"], write=False)
    assert report.passed and report.proof.exact
    assert _mask(report.model).min() == CLAMP_CANDIDATES[0] == -100.0


def test_a_candidate_that_would_change_the_output_is_skipped() -> None:
    """Scores scaled so that a -100 mask no longer makes masked positions vanish: -100 fails the proof,
    so the runner falls through to a larger magnitude, and the written model still proves exact."""
    model = attention_model()
    for init in model.graph.initializer:
        if init.name in ("wq", "wk"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 12.0, init.name))
    report = rewrite(model, ["clamp-mask"], write=False)
    assert report.passed and report.proof.exact
    assert _mask(report.model).min() in (CLAMP_CANDIDATES[1], CLAMP_VALUE)
    (a,), (b,) = run(model, {"x": X}), run(clamp_mask(model, -100.0).model, {"x": X})
    assert np.abs(a - b).max() > 1e-4 * np.abs(a).max()  # -100 really would have changed the output


def test_constant_node_and_minus_inf_are_clamped() -> None:
    m = attention_model()
    mask = _mask(m).copy()
    mask[mask < 0] = -np.inf
    keep = [t for t in m.graph.initializer if t.name != "mask"]
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    m.graph.node.insert(0, helper.make_node("Constant", [], ["mask"], name="mask_const",
                                            value=numpy_helper.from_array(mask, "mask")))
    res = clamp_mask(m)
    assert [c.node for c in res.changes] == ["Constant 'mask_const'"]
    (a,), (b,) = run(m, {"x": X}), run(res.model, {"x": X})
    assert np.abs(a - b).max() <= 1e-6 * np.abs(a).max()


def test_sentinel_without_softmax_is_refused() -> None:
    g = helper.make_graph(
        [helper.make_node("Max", ["x", "floor"], ["y"], name="floor_max")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.full(2, FLOAT_MIN, np.float32), "floor")],
    )
    res = clamp_mask(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    assert not res.changes and len(res.refusals) == 1 and "no Softmax" in res.refusals[0].reason


def test_cli_clamp_mask_value_is_written_and_proven(tmp_path: Path) -> None:
    import subprocess
    import sys

    src = tmp_path / "att.onnx"
    onnx.save(attention_model(), src)
    out = tmp_path / "clamped.onnx"
    proc = subprocess.run([sys.executable, "-m", "quantscan", "rewrite", str(src), "--clamp-mask-value", "-200",
                           "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "clamp-mask: 1 changes" in proc.stdout and "ok" in proc.stdout
    assert _mask(onnx.load(out)).min() == -200.0
