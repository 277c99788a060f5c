"""`lm`: a language model's decode step, judged by the next token it would emit and the text it predicts.

Why not `classify`: a decoder LM's logits are a distribution over its vocabulary at every step, and
what a user of an int8 LM loses is (a) the token greedy decoding picks (top-1 of int8 vs FP32, the
"next-token agreement" a generated text diverges at) and (b) how much probability the model still
puts on the text that really comes next, perplexity. The perplexity ratio (int8 perplexity / FP32
perplexity on the same true next tokens) is 1.0 for a lossless model and grows with the loss; it needs
the true next token of each step (labels.json beside the calibration samples, `{"files": {NAME: ID}}`),
and is left out when no sample has one.

Sums, so shards merge exactly: samples, top1_agree, and over the labelled steps the natural-log
negative log-likelihoods of the true token under each model's softmax (float64, log-sum-exp shifted).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscan.taskmetrics.base import add_sums, ratio


def step_logits(a: np.ndarray) -> np.ndarray:
    """[steps, vocab] from a decode step's logits ([N, V], [N, 1, V] or [V]): the last axis is the vocabulary."""
    arr = np.asarray(a, dtype=np.float64)
    return arr.reshape(-1, arr.shape[-1])


def true_token_nll(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[token] per row, computed shifted by the row's max so no exp overflows."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1))
    return log_norm - shifted[np.arange(len(tokens)), tokens]


@dataclass
class LmAccumulator:
    """Next-token agreement and perplexities (int8 and FP32) of a decode step's logits."""

    kind: str = "lm"
    _s: dict[str, float] = field(default_factory=dict)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        r, t = step_logits(ref), step_logits(test)
        sums = {"samples": float(len(r)), "top1_agree": float(np.count_nonzero(r.argmax(1) == t.argmax(1)))}
        known = _known_rows(labels, len(r))
        if known is not None and known[0].size:
            rows, tokens = known
            sums |= {"labelled": float(rows.size),
                     "nll": float(true_token_nll(t[rows], tokens).sum()),
                     "fp32_nll": float(true_token_nll(r[rows], tokens).sum())}
        add_sums(self._s, sums)

    def merge(self, other: LmAccumulator) -> None:
        add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        out = {"next_token_agreement": ratio(s.get("top1_agree", 0), s.get("samples", 0))}
        if s.get("labelled"):
            ppl, fp32_ppl = math.exp(s["nll"] / s["labelled"]), math.exp(s["fp32_nll"] / s["labelled"])
            out |= {"perplexity": ppl, "fp32_perplexity": fp32_ppl, "perplexity_ratio": ppl / fp32_ppl}
        return out


def _known_rows(labels: Sequence[int | None] | None, rows: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(row indices, true tokens) of the rows whose label is known; one label per row or none at all."""
    if labels is None or len(labels) != rows:
        return None
    idx = np.array([i for i, lab in enumerate(labels) if lab is not None], dtype=np.int64)
    tokens = np.array([int(lab) for lab in labels if lab is not None], dtype=np.int64)
    return idx, tokens
