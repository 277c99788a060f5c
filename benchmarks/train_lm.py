"""Train the zoo's decoder LM here, on real text a package ships, and write its decode-step ONNX.

Why trained here: no PyPI wheel found ships a small GPT's trained weights with an ONNX decode step (the
TinyStories/nanoGPT packages fetch theirs from a hub at run time, which this project cannot). The text:
CPython's own reference documentation as the stdlib ships it (`pydoc_data.topics`, the help() pages:
English prose with code), every 10th topic (sorted by name, from the 5th) held out for perplexity and calibration.

Model: character-level GPT, 4 layers, d=96, 4 heads, ReLU MLP x4, pre-LayerNorm, ALiBi (no position
table, so the exported sliding cache runs a stream of any length), untied head: ~0.46 M parameters,
1.9 MB as ONNX, small enough to commit as a test fixture. Training: AdamW, 1 thread, fixed seed, a fixed
wall-clock-free number of steps; the ONNX is written by zoo_export_lm.build_model and its sha256 pinned
in zoo.json (the committed file is the artifact; retraining on another CPU or torch build may differ in
the last bits).

Run (700 steps, 0.5 s each on a free core; about 20 minutes on this shared machine):
  /work/venvs/lm/bin/python -P benchmarks/train_lm.py --out tests/fixtures/lm/char_gpt_step.onnx
prints held-out bits/char and perplexity of the model and of the unigram baseline.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.append(str(Path(__file__).resolve().parent))
from zoo_export_lm import VOCAB_TEXT, WINDOW, alibi_slopes, build_model, corpus, encode  # noqa: E402

LAYERS, D_MODEL, HEADS = 4, 96, 4
BLOCK = WINDOW + 1
"""Training context: a token sees at most the WINDOW tokens before it, as in the exported cache."""


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.attn.proj = nn.Linear(D_MODEL, D_MODEL)
        self.fc1, self.fc2 = nn.Linear(D_MODEL, 4 * D_MODEL), nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        hd = d // HEADS
        q, k, v = self.attn.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, HEADS, hd).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + bias, dim=-1)
        x = x + self.attn.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


class CharGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(len(VOCAB_TEXT), D_MODEL)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, len(VOCAB_TEXT))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        i = torch.arange(t)
        distance = (i[:, None] - i[None, :]).float()
        slopes = torch.from_numpy(alibi_slopes(HEADS))[:, None, None]
        bias = torch.where(distance >= 0, -slopes * distance, torch.tensor(float("-inf")))
        x = self.tok(ids)
        for block in self.blocks:
            x = block(x, bias)
        return self.head(self.ln_f(x))


def batches(data: np.ndarray, size: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    starts = rng.integers(0, len(data) - BLOCK - 1, size)
    chunk = np.stack([data[s : s + BLOCK + 1] for s in starts])
    return torch.from_numpy(chunk[:, :-1]), torch.from_numpy(chunk[:, 1:])


@torch.no_grad()
def held_out_bits(model: CharGPT, data: np.ndarray) -> float:
    """Mean bits/char over non-overlapping BLOCK windows of the held-out text (full-context positions)."""
    n = (len(data) - 1) // BLOCK
    x = torch.from_numpy(data[: n * BLOCK].reshape(n, BLOCK))
    y = torch.from_numpy(data[1 : n * BLOCK + 1].reshape(n, BLOCK))
    losses = [nn.functional.cross_entropy(model(x[i : i + 64]).flatten(0, 1), y[i : i + 64].flatten(), reduction="sum")
              for i in range(0, n, 64)]
    return float(sum(losses)) / (n * BLOCK) / math.log(2)


def unigram_bits(train: np.ndarray, held: np.ndarray) -> float:
    counts = np.bincount(train, minlength=len(VOCAB_TEXT)) + 1.0
    p = counts / counts.sum()
    return float(-np.mean(np.log2(p[held])))


def export_matches(model: CharGPT, onnx_model: object, data: np.ndarray) -> float:
    """Largest |logit| difference between the exported step graph, run token by token through onnx's
    ReferenceEvaluator with its cache carried, and the torch model on the same BLOCK tokens at once."""
    from onnx.reference import ReferenceEvaluator
    from zoo_export_lm import empty_cache

    run = ReferenceEvaluator(onnx_model)
    feeds = empty_cache(onnx_model)
    with torch.no_grad():
        want = model(torch.from_numpy(data[None, :BLOCK]))[0].numpy()
    worst = 0.0
    for t in range(BLOCK):
        logits, *present = run.run(None, {"input_ids": data[None, t : t + 1], "position": np.array([t]), **feeds})
        feeds = {f"past.{n}": p for n, p in enumerate(present)}
        worst = max(worst, float(np.abs(logits[0] - want[t]).max()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    train_text, held_text = corpus()
    train, held = encode(train_text), encode(held_text)
    print(f"train {len(train)} chars, held out {len(held)} chars; unigram {unigram_bits(train, held):.3f} bits/char")
    model = CharGPT()
    print(f"parameters {sum(p.numel() for p in model.parameters())}")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=args.steps, pct_start=0.05)
    t0 = time.time()
    for step in range(args.steps):
        x, y = batches(train, args.batch, rng)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item() / math.log(2):.3f} bits/char  {time.time() - t0:.0f}s", flush=True)
    model.eval()
    bits = held_out_bits(model, held)
    print(f"held out: {bits:.3f} bits/char, perplexity {2 ** bits:.2f} per char "
          f"(unigram {2 ** unigram_bits(train, held):.2f})")
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    weights["heads"] = np.array(HEADS)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    exported = build_model(weights)
    print(f"export vs torch: max |logit diff| {export_matches(model, exported, held):.2e} over {BLOCK} steps")
    args.out.write_bytes(exported.SerializeToString())
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
