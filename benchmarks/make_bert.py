"""Export a BERT-base-shaped encoder with seeded random weights (torch, in a subprocess) and its token data.

Why: issue 11's benchmark table needs a transformer (bisection found no plan on one after 13 minutes),
and the assets hold none. The model is transformers' `BertModel` built from a default `BertConfig`
(12 layers, hidden 768, 12 heads, 30522-token vocabulary: BERT-base's shape) under a fixed torch
seed, never downloaded, exported with int64 `input_ids` and `attention_mask` of [batch, 128]. torch
is not part of quantscan's environment: this file runs itself under the torch interpreter
(TORCH_PYTHON) for the export, and the calling process only ever sees the .onnx file; nothing here
imports torch at module level. The export is cached (same seed, same file).

Calibration data is a .npy folder as the CONTRACT reads it: `input_ids.npy` and `attention_mask.npy`,
each [N, 128] int64 holding N samples; token ids are seeded uniform over the vocabulary (101/102 as
the first/last real token), each sample padded after a seeded length in [16, 128].

Run: python benchmarks/make_bert.py OUT.onnx [--seed N]   (re-runs itself under TORCH_PYTHON with -P, so
benchmarks/bisect.py does not shadow the standard library's bisect)
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import numpy as np

TORCH_PYTHON = Path(os.environ.get("QUANTSCAN_TORCH_PYTHON", "/work/venv-torch/bin/python"))
SEQ = 128
VOCAB = 30522
OPSET = 17
INPUTS = ("input_ids", "attention_mask")


def write_bert(path: Path, seed: int = 0, timeout_s: float = 900.0) -> Path:
    """The exported model at `path`, exporting it in a torch subprocess unless it is already there."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [str(TORCH_PYTHON), "-P", str(Path(__file__).resolve()), "--export", str(path), "--seed", str(seed)],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )
    if done.returncode != 0 or not path.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"BERT export under {TORCH_PYTHON} failed (exit {done.returncode}): {' / '.join(tail)}")
    return path


def write_tokens(folder: Path, n: int, seed: int = 1) -> Path:
    """`input_ids.npy` and `attention_mask.npy` ([n, SEQ] int64) in `folder`: one row per sample."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, VOCAB, size=(n, SEQ), dtype=np.int64)
    lengths = rng.integers(16, SEQ + 1, size=n)
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int64)
    ids[:, 0] = 101
    ids[np.arange(n), lengths - 1] = 102
    ids[mask == 0] = 0
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "input_ids.npy", ids)
    np.save(folder / "attention_mask.npy", mask)
    return folder


def _export(out: Path, seed: int) -> None:
    """Runs under TORCH_PYTHON only: build BertModel(BertConfig()) under `seed` and export it."""
    import torch
    from transformers import BertConfig, BertModel

    class ByName(torch.nn.Module):
        """Positional (input_ids, attention_mask) -> keywords: BertModel.forward's order is not ours."""

        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    torch.manual_seed(seed)
    model = ByName(BertModel(BertConfig())).eval()
    ids = torch.ones((1, SEQ), dtype=torch.int64)
    mask = torch.ones((1, SEQ), dtype=torch.int64)
    axes = {name: {0: "batch"} for name in (*INPUTS, "last_hidden_state", "pooler_output")}
    with torch.no_grad():
        torch.onnx.export(
            model, (ids, mask), str(out), input_names=list(INPUTS),
            output_names=["last_hidden_state", "pooler_output"], dynamic_axes=axes, opset_version=OPSET,
            dynamo=False,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--export", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.export is not None:
        _export(a.export, a.seed)
        return
    if a.out is None:
        ap.error("expected OUT.onnx")
    write_bert(a.out, a.seed)
    print(f"wrote {a.out} ({a.out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
