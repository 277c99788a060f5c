"""`scheme_weight_bits_gain` under `--state`: each variant carries its own state through the stream.

Why it matters (issue 43): a decoder LM's int4 K/V error builds up over the decode steps, so a site's
worth at int8 is what it buys the deployed stream, each step reading the cache the quantized model itself
wrote, not a step read on the FP32 cache. Oracle: a recurrent cell written out in numpy (float32), its
weights fake-quantized by the loops below, run as a stream with its own state carried; the per-step
figure (FP32 state fed every step) is computed too, to show that the test tells the two apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantscan import scan

GROUP = 4
STEPS = 24


def int4_groups(w: np.ndarray, group: int) -> np.ndarray:
    """Symmetric int4 per column in groups of `group` rows: scale = (the entry of largest |.|) / -8,
    codes round-half-even, clipped to [-8, 7] (MatMulNBits' grid)."""
    out = np.empty_like(w)
    for col in range(w.shape[1]):
        for start in range(0, w.shape[0], group):
            block = w[start:start + group, col]
            scale = np.float32(block[np.abs(block).argmax()] / np.float32(-8.0))
            out[start:start + group, col] = np.clip(np.rint(block / scale), -8, 7) * scale
    return out


def int8_columns(w: np.ndarray) -> np.ndarray:
    """Symmetric int8 per output column: scale = absmax / 127."""
    scale = (np.abs(w).max(axis=0) / np.float32(127.0)).astype(np.float32)
    return (np.clip(np.rint(w / scale), -128, 127) * scale).astype(np.float32)


def cell_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    recurrent = rng.normal(0, 1, (8, 8))
    recurrent *= 0.95 / np.abs(np.linalg.eigvals(recurrent)).max()  # state error lingers over many steps
    return {"w_in": rng.normal(0, 0.8, (4, 8)).astype(np.float32), "w_rec": recurrent.astype(np.float32),
            "w_out": rng.normal(0, 0.5, (8, 3)).astype(np.float32)}


def cell_model(weights: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """carry = tanh(x @ w_in + h @ w_rec), y = carry @ w_out; outputs y and carry (fed back as h: a name
    that does not look like a state, so only `--state` says it is one)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["a"], name="in"),
        helper.make_node("MatMul", ["h", "w_rec"], ["b"], name="rec"),
        helper.make_node("Add", ["a", "b"], ["s"], name="add"),
        helper.make_node("Tanh", ["s"], ["carry"], name="tanh"),
        helper.make_node("MatMul", ["carry", "w_out"], ["y"], name="out"),
    ]
    graph = helper.make_graph(
        nodes, "cell",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3]),
         helper.make_tensor_value_info("carry", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


Cell = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def cell(w: Mapping[str, np.ndarray]) -> Cell:
    def step(x: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h_next = np.tanh(x @ w["w_in"] + h @ w["w_rec"]).astype(np.float32)
        return h_next @ w["w_out"], h_next
    return step


def stream(step: Cell, xs: np.ndarray, fp32_states: list[np.ndarray] | None = None) -> np.ndarray:
    """y over the stream; the state is the cell's own, or (per step) the FP32 stream's given one."""
    h = np.zeros((1, 8), np.float32)
    ys = []
    for k, x in enumerate(xs):
        y, h_next = step(x[None], h if fp32_states is None else fp32_states[k])
        ys.append(y.ravel())
        h = h_next
    return np.concatenate(ys).astype(np.float64)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def test_weight_bits_gain_under_state_carries_each_variants_own_state(tmp_path: Path) -> None:
    weights = cell_weights()
    model_path = tmp_path / "cell.onnx"
    onnx.save(cell_model(weights), model_path)
    xs = np.random.default_rng(3).normal(0, 1, (STEPS, 4)).astype(np.float32)
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "x.npy", xs)

    result = scan(model_path, tmp_path / "calib", scheme=f"w4af-g{GROUP}", state={"carry": "h"}, gain_samples=0,
                  deployed_samples=0)
    assert result.headline.outputs == ["y"]  # an OUT of --state is no headline output (CONTRACT)
    gains = result.layers.set_index("node")["scheme_weight_bits_gain"]

    fp32_states = [np.zeros((1, 8), np.float32)]
    for x in xs[:-1]:
        fp32_states.append(cell(weights)(x[None], fp32_states[-1])[1])
    reference = stream(cell(weights), xs)
    all_int4 = {k: int4_groups(v, GROUP) for k, v in weights.items()}
    per_step: dict[str, float] = {}
    for node, name in (("in", "w_in"), ("rec", "w_rec"), ("out", "w_out")):
        one_int8 = {**all_int4, name: int8_columns(weights[name])}
        carried = cosine(reference, stream(cell(one_int8), xs)) - cosine(reference, stream(cell(all_int4), xs))
        assert gains[node] == pytest.approx(carried, abs=2e-6), node
        per_step[node] = (cosine(reference, stream(cell(one_int8), xs, fp32_states))
                          - cosine(reference, stream(cell(all_int4), xs, fp32_states)))
    # the recurrent weight's error compounds only when the state is the model's own (25x the tolerance)
    assert abs(gains["rec"] - per_step["rec"]) > 5e-5
    assert gains.max() > 1e-4


def test_the_trained_lm_gains_carry_its_own_kv_cache(tmp_path: Path) -> None:
    """On the committed char GPT (32 decode steps of held-out text, cut from the middle of the stream):
    a site's gain is the logits cosine of the stream with that site's weights at int8 per column and every
    other MatMul weight int4 in groups of 32, each stream carrying its own cache, run by onnxruntime with
    the weights fake-quantized by the loops above; it is not the per-step figure on the FP32 cache."""
    import onnxruntime as ort

    from test_lm_task import LM, STATE, exporter

    ex = exporter()
    tokens = ex.encode(ex.corpus()[1])
    steps = tmp_path / "steps"
    ex.write_steps(str(LM), tokens, steps, 200, 32)
    result = scan(LM, steps, scheme="w4af-g32", state=STATE, task="lm", gain_samples=0, deployed_samples=0,
                  threads=1, no_report=True, gain_candidates=1, recover_check=False)
    assert result.headline.outputs == ["logits"]
    gains = result.layers.set_index("node")["scheme_weight_bits_gain"].dropna()

    model = onnx.load(LM)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    matmuls = {n.name: n.input[1] for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights}
    assert set(gains.index) == set(matmuls) and len(matmuls) == 17
    files = sorted(steps.glob("*.npz"))
    feeds = [dict(np.load(f)) for f in files]

    def logits(replaced: Mapping[str, np.ndarray], carry: bool) -> np.ndarray:
        variant = onnx.ModelProto()
        variant.CopyFrom(model)
        for init in variant.graph.initializer:
            if init.name in replaced:
                init.CopyFrom(numpy_helper.from_array(replaced[init.name], init.name))
        session = ort.InferenceSession(variant.SerializeToString(), providers=["CPUExecutionProvider"])
        cache: dict[str, np.ndarray] = {}
        rows = []
        for feed in feeds:
            out = dict(zip([o.name for o in session.get_outputs()], session.run(None, {**feed, **cache}), strict=True))
            cache = {past: out[present] for present, past in STATE.items()} if carry else {}
            rows.append(out["logits"].ravel())
        return np.concatenate(rows).astype(np.float64)

    all_int4 = {w: int4_groups(weights[w], 32) for w in matmuls.values()}
    expected: dict[tuple[str, bool], float] = {}
    for carry in (True, False):
        reference = logits({}, carry)
        base = cosine(reference, logits(all_int4, carry))
        for node in ("head/MatMul", "blocks.0.attn.qkv/MatMul"):
            w = matmuls[node]
            gain = cosine(reference, logits({**all_int4, w: int8_columns(weights[w])}, carry)) - base
            expected[node, carry] = gain
    for node in ("head/MatMul", "blocks.0.attn.qkv/MatMul"):
        assert gains[node] == pytest.approx(expected[node, True], abs=2e-6), node
    # K/V error builds up in the carried cache: the qkv MatMul is worth ~3x more there (1.3e-4 vs 3.7e-5)
    assert gains["blocks.0.attn.qkv/MatMul"] - expected["blocks.0.attn.qkv/MatMul", False] > 5e-5
