"""The weight-bit exports (bisect/weight_exports.py): a plan as a blocked-QDQ model and as MatMulNBits.

Oracles: onnxruntime's own int4 packer (`quantize_matmul_4bits`, the kernel its MatMulNBitsQuantizer
calls) and, where onnx_ir is installed, MatMulNBitsQuantizer itself; the int4/int8 grids written out here
with numpy; the plan's own figures (bisect measured them), recomputed from the exported models run by
onnxruntime with pooled cosine written out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnxruntime.capi._pybind_state import quantize_matmul_4bits

from builders import write_chain
from quantscan.bisect import exports
from quantscan.bisect import weight_exports as we
from quantscan.errors import UsageError
from quantscan.records import Plan

LM = Path(__file__).resolve().parents[1] / "fixtures" / "lm" / "char_gpt_step.onnx"


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    """Basic optimizations: at ORT_ENABLE_ALL onnxruntime fuses DequantizeLinear + MatMul into MatMulNBits
    with int8 activations (its accuracy level 4), another model than the one bisect measured."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _pooled_cosine(fp32: onnx.ModelProto, other: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> float:
    """Σxy / sqrt(Σx² Σy²) over every element of every sample (CONTRACT: pooled cosine)."""
    a, b = _session(fp32), _session(other)
    sxy = sxx = syy = 0.0
    for feed in feeds:
        x = a.run(None, feed)[0].astype(np.float64)
        y = b.run(None, feed)[0].astype(np.float64)
        sxy, sxx, syy = sxy + float((x * y).sum()), sxx + float((x * x).sum()), syy + float((y * y).sum())
    return sxy / np.sqrt(sxx * syy)


def _int4_groups_written_out(w: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """[K, N] weight, symmetric int4 per group of `group` rows: the group's largest-magnitude value on
    code -8 (MLAS, llama.cpp Q4_0). Returns codes [K, N] and scales [k_blocks, N]."""
    k, n = w.shape
    blocks = -(-k // group)
    codes = np.zeros((k, n), np.int8)
    scales = np.zeros((blocks, n), np.float32)
    for c in range(n):
        for b in range(blocks):
            part = w[b * group:(b + 1) * group, c].astype(np.float64)
            extreme = part[np.argmax(np.abs(part))]
            scale = np.float32(extreme / -8.0) if extreme != 0 else np.float32(1.0)
            scales[b, c] = scale
            codes[b * group:(b + 1) * group, c] = np.clip(np.rint(part / scale), -8, 7)
    return codes, scales


def test_int4_packing_is_byte_for_byte_onnxruntimes_on_a_trained_weight() -> None:
    """MatMulNBits' B (and zero points) for a real trained weight (the char LM's fc2, [384, 96], blocks of
    32 and 128) equal what onnxruntime's quantize_matmul_4bits writes, symmetric and with a zero point."""
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(LM).graph.initializer}
    w = inits["blocks.0.fc2.weight"].astype(np.float32)
    k, n = w.shape
    for block in (32, 128):
        for symmetric in (True, False):
            blocks = -(-k // block)
            packed = np.zeros((n, blocks, block // 2), np.uint8)
            scales = np.zeros((n, blocks), np.float32)
            zps = np.zeros((n, -(-blocks // 2)), np.uint8)
            quantize_matmul_4bits(packed, w, scales, zps, block, n, k, symmetric)
            q = we.quantized_weight(w, 1, we.WeightChoice(4, block, not symmetric))
            mine, mine_zp = we.pack_nbits(q.values, None if symmetric else np.asarray(q.qparams.zero_point), block)
            assert np.array_equal(mine, packed)
            assert np.allclose(np.asarray(q.qparams.scale).T, scales, rtol=1e-6, atol=0)
            if not symmetric:
                assert np.array_equal(mine_zp, zps)


def _tiny(k: int = 40, n: int = 24) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x[3, k] -> MatMul w1 [k, n] -> MatMul w2 [n, 8] -> y."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(size=(k, n)).astype(np.float32)
    w2 = rng.normal(size=(n, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
         helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm2")],
        "tiny", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {"w1": w1, "w2": w2}


def test_both_exports_compute_the_written_out_weights() -> None:
    """w1 int4 in groups of 16 (K = 40: a short last group), w2 int8 per output column: both models give
    x @ W1q @ W2q with the grids written out here (int8: absmax / 127, rounded half to even)."""
    model, w = _tiny()
    codes, scales = _int4_groups_written_out(w["w1"], 16)
    w1q = codes.astype(np.float32) * np.repeat(scales, 16, axis=0)[:40]
    s2 = np.abs(w["w2"]).max(axis=0) / 127
    w2q = np.clip(np.rint(w["w2"] / s2), -127, 127) * s2
    x = np.random.default_rng(1).normal(size=(3, 40)).astype(np.float32)
    expected = x.astype(np.float64) @ w1q @ w2q
    choices = {"w1": we.WeightChoice(4, 16), "w2": we.WeightChoice(8)}
    blocked = we.blocked_qdq_model(model, choices)
    nbits = we.matmulnbits_model(model, choices)
    assert [n.op_type for n in nbits.graph.node].count("MatMulNBits") == 1
    assert any(n.op_type == "DequantizeLinear" and any(a.name == "block_size" for a in n.attribute)
               for n in blocked.graph.node)
    for built in (blocked, nbits):
        onnx.checker.check_model(built)
        got = _session(built).run(None, {"x": x})[0]
        assert np.allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_a_block_matmulnbits_does_not_take_stays_blocked_qdq_and_the_metadata_says_so() -> None:
    model, _ = _tiny()
    nbits = we.matmulnbits_model(model, {"w1": we.WeightChoice(4, 8), "w2": None})
    assert "MatMulNBits" not in {n.op_type for n in nbits.graph.node}
    meta = {p.key: p.value for p in nbits.metadata_props}
    assert meta["quantscan_weights"] == "1 float, 1 int4-g8 DequantizeLinear"
    assert not we.nbits_block_ok(8) and not we.nbits_block_ok(48) and we.nbits_block_ok(16)


def _bisect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quantscan", "bisect", *args, "--quiet"],
                          capture_output=True, text=True, timeout=900)


def test_exported_models_give_the_figures_the_plan_claims(tmp_path: Path) -> None:
    """A w4af-g16 plan with 8-bit-weight sites (bisect --fallback int8): the blocked-QDQ and the MatMulNBits
    models, run by onnxruntime on the searched and on the held-out samples, give the search's figure and the
    plan's claim to 1e-6; the tpu-mlir qtable lists the 8-bit sites as INT8 and the RKLLM file their share."""
    model_path, calib = write_chain(tmp_path, samples=8)
    out = tmp_path / "b"
    run = _bisect(str(model_path), "--calib", str(calib), "--out", str(out), "--scheme", "w4af-g16",
                  "--fallback", "int8", "--target-cosine", "0.995",
                  "--export", "onnxruntime", "qdq-blocked", "matmulnbits", "tpu-mlir", "rkllm")
    assert run.returncode == 0, run.stderr
    plan = json.loads((out / "plan.json").read_text())
    kept = {s["node"] for s in plan["sites"]}
    assert kept and {s["precision"] for s in plan["sites"]} == {"int8"}
    fp32 = onnx.load(model_path)
    x = np.load(calib / "x.npy")
    feeds = [{"x": x[i:i + 1]} for i in range(x.shape[0])]
    for name in ("plan_weights_qdq.onnx", "plan_matmulnbits.onnx"):
        built = onnx.load(out / name)
        assert _pooled_cosine(fp32, built, feeds[0::2]) == pytest.approx(plan["search"]["achieved"]["cosine"], abs=1e-6)
        assert _pooled_cosine(fp32, built, feeds[1::2]) == pytest.approx(plan["achieved"]["cosine"], abs=1e-6)
    nbits = onnx.load(out / "plan_matmulnbits.onnx")
    weighted = sum(n.op_type == "MatMul" for n in fp32.graph.node)
    assert sum(n.op_type == "MatMulNBits" for n in nbits.graph.node) == weighted - len(kept)
    qtable = [ln.split() for ln in (out / "tpu_mlir.qtable").read_text().splitlines() if ln and not ln.startswith("#")]
    assert {mode for _, mode in qtable} == {"INT8"}  # every op of the kept kernels, named as model_transform does
    assert {name for name, _ in qtable if name.endswith("_MatMul")} == {
        f"{n.output[0]}_MatMul" for n in fp32.graph.node if n.name in kept}
    rkllm = json.loads((out / "rkllm_build.json").read_text())
    assert rkllm["build"] == {"quantized_dtype": "w4a16_g16", "hybrid_rate": round(len(kept) / weighted, 4)}
    again = _bisect("--from-plan", str(out / "plan.json"), "--export", "rknn", "--out", str(tmp_path / "c"))
    assert again.returncode == 2 and "qdq-blocked" in again.stderr  # a CNN cfg would call 8-bit sites float


def test_model_export_without_the_model_is_bad_input(tmp_path: Path) -> None:
    from tests.bisect.test_bisect_exports import PLAN

    with pytest.raises(UsageError, match="--export qdq-blocked: expected the plan's model"):
        exports.write_exports(Plan.from_json(PLAN.to_json()), tmp_path, ["qdq-blocked"])


def test_matmulnbits_export_equals_onnxruntimes_own_quantizer_on_the_char_lm() -> None:
    """All 17 MatMul weights of the trained char LM at w4 (groups of 32, symmetric): quantscan's MatMulNBits
    initializers equal those MatMulNBitsQuantizer(block_size=32, is_symmetric=True) writes (needs onnx_ir)."""
    pytest.importorskip("onnx_ir")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(LM)
    theirs = MatMulNBitsQuantizer(onnx.load(LM), block_size=32, is_symmetric=True)
    theirs.process()
    choices = {u.weight: we.WeightChoice(4, 32) for u in we.weight_uses(model) if u.op_type == "MatMul"}
    mine = we.matmulnbits_model(model, choices)
    ours = {n.name: n for n in mine.graph.node if n.op_type == "MatMulNBits"}
    ref = {n.input[1]: n for n in theirs.model.model.graph.node if n.op_type == "MatMulNBits"}
    assert len(ours) == len(ref) > 0
    mine_t = {t.name: numpy_helper.to_array(t) for t in mine.graph.initializer}
    ref_t = {t.name: numpy_helper.to_array(t) for t in theirs.model.model.graph.initializer}
    for node in ours.values():
        weight = node.input[1].removesuffix("__Q4")
        other = next(n for name, n in ref.items() if name.startswith(weight))
        assert np.array_equal(mine_t[node.input[1]], ref_t[other.input[1]])
        assert np.allclose(mine_t[node.input[2]].reshape(-1), ref_t[other.input[2]].reshape(-1), rtol=1e-6)


def test_a_plan_on_the_trained_char_lm_exports_to_models_that_give_its_figures(tmp_path: Path) -> None:
    """bisect --fallback int8 under rk3588-llm's w4a16-g32 on the decoder LM (8 real decode steps): both
    models give the search's figure and the claim (worst output, pooled cosine) to 1e-6, and rkllm_build.json
    (written by the profile's default exports) gives the plan's share of 8-bit-weight layers of the 17."""
    from tests.bisect.test_menu import _worst_cosine
    from tests.test_lm_task import exporter

    ex = exporter()
    _, held = ex.corpus()
    calib = tmp_path / "steps"
    ex.write_steps(str(LM), ex.encode(held), calib, 1000, 8)
    out = tmp_path / "b"
    run = _bisect(str(LM), "--calib", str(calib), "--out", str(out), "--profile", "rk3588-llm", "--scheme",
                  "w4a16-g32", "--fallback", "int8", "--target-cosine", "0.9993")
    assert run.returncode in (0, 1), run.stderr
    plan = json.loads((out / "plan.json").read_text())
    assert plan["sites"] and {s["precision"] for s in plan["sites"]} == {"int8"}
    rkllm = json.loads((out / "rkllm_build.json").read_text())
    assert rkllm["build"] == {"quantized_dtype": "w4a16_g32", "hybrid_rate": round(len(plan["sites"]) / 17, 4)}
    again = _bisect("--from-plan", str(out / "plan.json"), "--export", "qdq-blocked", "matmulnbits",
                    "--out", str(out))
    assert again.returncode == 0, again.stderr
    from quantscan.calib import load_calibration
    from quantscan.model import graph_inputs, read_model_file

    feeds = list(load_calibration(calib, graph_inputs(read_model_file(LM))).samples())
    fp32 = onnx.load(LM)
    for name in ("plan_weights_qdq.onnx", "plan_matmulnbits.onnx"):
        built = onnx.load(out / name)
        assert _worst_cosine(fp32, built, feeds[0::2]) == pytest.approx(plan["search"]["achieved"]["cosine"], abs=1e-6)
        assert _worst_cosine(fp32, built, feeds[1::2]) == pytest.approx(plan["achieved"]["cosine"], abs=1e-6)


def test_a_w8a8_plan_exports_its_weights_only_and_the_model_says_so() -> None:
    """A plan from before schemes (w8a8: float mm2, int16 mm5): w2 stays float, w5 is INT16 behind its
    DequantizeLinear (opset 21), every other weight INT8 per column; the metadata says the activations of
    the scheme are not in the model, and onnxruntime runs it."""
    from tests.bisect.test_bisect_exports import PLAN

    from builders import chain_model

    model = chain_model(layers=7)
    built = we.plan_blocked_qdq(PLAN, model)
    onnx.checker.check_model(built)
    inits = {t.name: t for t in built.graph.initializer}
    stored = {n.input[0].removesuffix("__quantized"): inits[n.input[0]].data_type
              for n in built.graph.node if n.op_type == "DequantizeLinear"}
    weights = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
    assert set(stored) == weights - {"w2"}
    assert stored["w5"] == onnx.TensorProto.INT16
    assert {v for k, v in stored.items() if k != "w5"} == {onnx.TensorProto.INT8}
    assert next(o.version for o in built.opset_import if o.domain in ("", "ai.onnx")) >= 21
    meta = {p.key: p.value for p in built.metadata_props}
    assert "holds the plan's weights only" in meta["quantscan_note"]
    x = np.random.default_rng(0).normal(size=(2, 16)).astype(np.float32)
    assert _session(built).run(None, {"x": x})[0].shape == (2, 10)
