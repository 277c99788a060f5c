"""A character-level GPT decoder as ONNX: one decode step per run, its KV cache as inputs and outputs.

Why written with onnx.helper from numpy weights and not torch's exporter: the bytes are ours to pin
(sha256 in zoo.json) and the graph is what an edge NPU is handed for an LLM decode step, with static
shapes: a sliding cache of the last WINDOW tokens per layer (`past.N`, [2, heads, WINDOW, head_dim],
keys then values), shifted by one each step (`present.N`, same shape), so `--state present.N=past.N`
carries it from one step to the next. Positions are ALiBi (a constant bias per head and distance), so a
stream of any length runs in the same window; `position` (the step's index in the stream) only masks
the cache slots that are still empty during the first WINDOW steps.

Inputs: input_ids [1, 1] int64, position [1] int64, past.0 .. past.{L-1}. Outputs: logits [1, VOCAB],
present.0 .. present.{L-1}. The weights come from benchmarks/train_lm.py (`build_model(weights)`); this
module needs numpy and onnx only, and the vocabulary and ALiBi slopes it shares with the trainer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB_TEXT = "\n" + "".join(chr(c) for c in range(32, 127))
"""Token k is VOCAB_TEXT[k]: newline and printable ASCII (96 tokens); any other character reads as '?'."""
WINDOW = 64
"""Cache slots per layer: a step attends to the WINDOW tokens before it and to itself."""
MASK_VALUE = -50.0
"""Bias of an empty cache slot: finite (exp(-50) is nothing beside the live slots) so the score tensor's
range stays that of the ALiBi bias itself and int8 can hold it, as an NPU's static mask must."""
OPSET = 17
CHECK = True


def encode(text: str) -> np.ndarray:
    """Characters -> token ids (tabs as a space, anything outside the vocabulary as '?')."""
    index = {ch: k for k, ch in enumerate(VOCAB_TEXT)}
    unknown = index["?"]
    return np.array([index.get(" " if ch == "\t" else ch, unknown) for ch in text], dtype=np.int64)


WORD_PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]+|.", re.DOTALL)
"""A word piece: a run of letters or of digits with the space before it (GPT-2 style), else one character."""


def clean(text: str) -> str:
    """Tabs as a space, anything outside VOCAB_TEXT as '?': the characters every tokenizer here sees."""
    known = set(VOCAB_TEXT)
    return "".join(" " if ch == "\t" else ch if ch in known else "?" for ch in text)


def word_vocab(text: str, size: int) -> list[str]:
    """A word + character-fallback vocabulary of `size` tokens: the 96 characters of VOCAB_TEXT first
    (so any text encodes), then the most frequent multi-character word pieces of `text` (ties by the
    piece itself, so the list is a function of the text alone). Why not BPE: a word vocabulary gives the
    embedding and the head thousands of rows from a few lines of code, which is what the zoo's second
    decoder needs (large, unequal sites), and its tokens are readable in a report."""
    counts: dict[str, int] = {}
    for piece in WORD_PIECE.findall(clean(text)):
        if len(piece) > 1:
            counts[piece] = counts.get(piece, 0) + 1
    words = sorted(counts, key=lambda w: (-counts[w], w))[: size - len(VOCAB_TEXT)]
    return list(VOCAB_TEXT) + words


def encode_words(text: str, vocab: list[str]) -> np.ndarray:
    """Text -> token ids under `vocab` (from word_vocab): a known word piece is one token, any other
    piece is spelled out character by character."""
    index = {tok: k for k, tok in enumerate(vocab)}
    ids: list[int] = []
    for piece in WORD_PIECE.findall(clean(text)):
        if piece in index:
            ids.append(index[piece])
        else:
            ids.extend(index[ch] for ch in piece)
    return np.array(ids, dtype=np.int64)


def alibi_slopes(heads: int) -> np.ndarray:
    """ALiBi's geometric slopes 2^(-8k/heads), k = 1..heads (Press et al. 2022)."""
    return np.array([2.0 ** (-8.0 * (k + 1) / heads) for k in range(heads)], dtype=np.float32)


def alibi_bias(heads: int) -> np.ndarray:
    """[1, heads, 1, WINDOW+1]: -slope * distance for the cache slots (distance WINDOW..1) and the step."""
    distance = np.arange(WINDOW, -1, -1, dtype=np.float32)
    return (-alibi_slopes(heads)[:, None] * distance[None, :]).reshape(1, heads, 1, WINDOW + 1)


def dims(weights: Mapping[str, np.ndarray]) -> tuple[int, int, int, int]:
    """(layers, d_model, heads, vocab) read from the weights' shapes."""
    layers = sum(1 for k in weights if k.endswith(".attn.qkv.weight"))
    d_model = int(weights["tok.weight"].shape[1])
    heads = int(weights["heads"])
    return layers, d_model, heads, int(weights["tok.weight"].shape[0])


class _Graph:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op: str, inputs: list[str], out: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out


def _linear(g: _Graph, w: Mapping[str, np.ndarray], x: str, key: str) -> str:
    """x @ W^T + b with torch's [out, in] weight stored as the MatMul's [in, out]."""
    weight = g.const(f"{key}.weight", w[f"{key}.weight"].astype(np.float32).T)
    bias = g.const(f"{key}.bias", w[f"{key}.bias"].astype(np.float32))
    return g.op("Add", [g.op("MatMul", [x, weight], f"{key}/MatMul"), bias], f"{key}/Add")


def _norm(g: _Graph, w: Mapping[str, np.ndarray], x: str, key: str) -> str:
    scale = g.const(f"{key}.weight", w[f"{key}.weight"].astype(np.float32))
    bias = g.const(f"{key}.bias", w[f"{key}.bias"].astype(np.float32))
    return g.op("LayerNormalization", [x, scale, bias], f"{key}/LayerNorm", axis=-1, epsilon=1e-5)


def _attention(g: _Graph, w: Mapping[str, np.ndarray], x: str, n: int, heads: int, d_model: int,
               bias: str) -> str:
    """One layer's attention over its cache plus the step; writes present.n."""
    hd = d_model // heads
    key = f"blocks.{n}.attn"
    qkv = _linear(g, w, _norm(g, w, x, f"blocks.{n}.ln1"), f"{key}.qkv")
    split = g.const(f"{key}/split_sizes", np.array([d_model] * 3, dtype=np.int64))
    g.nodes.append(helper.make_node("Split", [qkv, split], [f"{key}/q", f"{key}/k", f"{key}/v"],
                                    name=f"{key}/Split", axis=-1))
    shape = g.const(f"{key}/heads_shape", np.array([1, 1, heads, hd], dtype=np.int64))

    def per_head(t: str) -> str:  # [1, 1, d] -> [1, heads, 1, hd]
        return g.op("Transpose", [g.op("Reshape", [t, shape], f"{t}/Reshape")], f"{t}/Transpose",
                    perm=[0, 2, 1, 3])

    q, k, v = per_head(f"{key}/q"), per_head(f"{key}/k"), per_head(f"{key}/v")
    past = f"past.{n}"
    zero, one = g.const(f"{key}/idx0", np.array([0], np.int64)), g.const(f"{key}/idx1", np.array([1], np.int64))
    past_k = g.op("Gather", [past, zero], f"{key}/past_k", axis=0)  # [1, heads, WINDOW, hd]
    past_v = g.op("Gather", [past, one], f"{key}/past_v", axis=0)
    keys = g.op("Concat", [past_k, k], f"{key}/keys", axis=2)  # [1, heads, WINDOW+1, hd]
    values = g.op("Concat", [past_v, v], f"{key}/values", axis=2)
    scores = g.op("MatMul", [q, g.op("Transpose", [keys], f"{key}/keysT", perm=[0, 1, 3, 2])], f"{key}/QK")
    scaled = g.op("Mul", [scores, g.const(f"{key}/scale", np.array(1.0 / np.sqrt(hd), np.float32))],
                  f"{key}/scaled")
    probs = g.op("Softmax", [g.op("Add", [scaled, bias], f"{key}/biased")], f"{key}/Softmax", axis=-1)
    context = g.op("MatMul", [probs, values], f"{key}/AV")  # [1, heads, 1, hd]
    merged = g.op("Reshape", [g.op("Transpose", [context], f"{key}/AV/Transpose", perm=[0, 2, 1, 3]),
                              g.const(f"{key}/merge_shape", np.array([1, 1, d_model], np.int64))],
                  f"{key}/merged")
    starts = g.const(f"{key}/start", np.array([1], np.int64))
    ends = g.const(f"{key}/end", np.array([WINDOW + 1], np.int64))
    axis = g.const(f"{key}/axis", np.array([2], np.int64))
    kept_k = g.op("Slice", [keys, starts, ends, axis], f"{key}/kept_k")
    kept_v = g.op("Slice", [values, starts, ends, axis], f"{key}/kept_v")
    g.op("Concat", [kept_k, kept_v], f"present.{n}", axis=0)
    return _linear(g, w, merged, f"{key}.proj")


def _step_bias(g: _Graph, heads: int) -> str:
    """ALiBi plus the empty-slot mask for this step: slot j (0..WINDOW) is empty while j + position < WINDOW."""
    slot = g.const("mask/slot", np.arange(WINDOW + 1, dtype=np.float32))
    pos = g.op("Cast", ["position"], "mask/position_f", to=TensorProto.FLOAT)
    empty = g.op("Less", [g.op("Add", [slot, pos], "mask/slot_plus_pos"),
                          g.const("mask/window", np.array(WINDOW, np.float32))], "mask/empty")
    mask = g.op("Where", [empty, g.const("mask/value", np.array(MASK_VALUE, np.float32)),
                          g.const("mask/zero", np.array(0.0, np.float32))], "mask/values")
    return g.op("Add", [g.const("alibi", alibi_bias(heads)), mask], "mask/bias")


def build_model(weights: Mapping[str, np.ndarray], name: str = "char_gpt_step") -> onnx.ModelProto:
    """The decode-step graph (see the module docstring) from the trainer's state dict as numpy."""
    layers, d_model, heads, vocab = dims(weights)
    hd = d_model // heads
    g = _Graph()
    tok = g.const("tok.weight", weights["tok.weight"].astype(np.float32))
    x = g.op("Gather", [tok, "input_ids"], "embed", axis=0)  # [1, 1, d]
    bias = _step_bias(g, heads)
    for n in range(layers):
        x = g.op("Add", [x, _attention(g, weights, x, n, heads, d_model, bias)], f"blocks.{n}/attn_residual")
        hidden = g.op("Relu", [_linear(g, weights, _norm(g, weights, x, f"blocks.{n}.ln2"), f"blocks.{n}.fc1")],
                      f"blocks.{n}/Relu")
        x = g.op("Add", [x, _linear(g, weights, hidden, f"blocks.{n}.fc2")], f"blocks.{n}/mlp_residual")
    head = _linear(g, weights, _norm(g, weights, x, "ln_f"), "head")
    g.op("Reshape", [head, g.const("logits_shape", np.array([1, vocab], np.int64))], "logits")
    cache = [2, heads, WINDOW, hd]
    graph = helper.make_graph(
        g.nodes, name,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 1]),
         helper.make_tensor_value_info("position", TensorProto.INT64, [1])]
        + [helper.make_tensor_value_info(f"past.{n}", TensorProto.FLOAT, cache) for n in range(layers)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, vocab])]
        + [helper.make_tensor_value_info(f"present.{n}", TensorProto.FLOAT, cache) for n in range(layers)],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="quantscan benchmarks/train_lm.py", producer_version="1")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=CHECK)
    return model


def corpus() -> tuple[str, str]:
    """(train, held-out) text: the stdlib's help() topics (CPython's reference documentation as
    `pydoc_data.topics` ships it), sorted by name, every 10th topic (the 5th, 15th, ...) held out."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    train = "\n\n".join(topics[k] for i, k in enumerate(names) if i % 10 != 4)
    held = "\n\n".join(topics[k] for i, k in enumerate(names) if i % 10 == 4)
    return train, held


def write_steps(model_path: str, tokens: np.ndarray, folder: Path, skip: int, count: int,
                classes: Sequence[str] = VOCAB_TEXT) -> None:
    """Calibration from real text: the FP32 model runs over `tokens` one step at a time with its cache
    carried; steps skip .. skip+count-1 become one .npz each (input_ids, position, past.N as the FP32
    stream left them), named by position so file order is stream order, and labels.json gives each
    file's true next token (`--task lm`'s perplexity) and `classes` the tokens' text. Starting past
    `skip` steps, every file has a real, full cache: a set cut anywhere in the stream is as the deployed
    model sees it."""
    import json

    import onnxruntime as ort

    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    feeds = empty_cache(onnx.load(model_path))
    names = [o.name for o in session.get_outputs()]
    labels: dict[str, int] = {}
    folder.mkdir(parents=True, exist_ok=True)
    for t in range(skip + count):
        step: dict[str, Any] = {"input_ids": tokens[None, t : t + 1].astype(np.int64),
                                "position": np.array([t], np.int64), **feeds}
        if t >= skip:
            name = f"{t:06d}.npz"
            np.savez(folder / name, **step)
            labels[name] = int(tokens[t + 1])
        outs = dict(zip(names, session.run(None, step), strict=True))
        feeds = {k: outs[k.replace("past", "present")] for k in feeds}
    (folder / "labels.json").write_text(json.dumps({"classes": list(classes), "files": labels}, indent=None))


def empty_cache(weights_or_model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Zero past.N for every layer of a built model (the first step's cache)."""
    feeds = {}
    for vi in weights_or_model.graph.input:
        if vi.name.startswith("past."):
            feeds[vi.name] = np.zeros([d.dim_value for d in vi.type.tensor_type.shape.dim], np.float32)
    return feeds
