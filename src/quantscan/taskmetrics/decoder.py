"""`decoder`: token sequences of an autoregressive (attention) decoder, greedy as its own postprocess reads them.

Why not `ctc`: an attention decoder (a Loop that feeds its ArgMax back, `graph.decoders`) emits one
token per step from a start token until an end token; CTC's "collapse repeats, drop the blank" would
merge two real `<td></td>` cells into one and read the padding after the end as text. The decode here
is PaddleOCR's `TableLabelDecode`/`AttnLabelDecode`: argmax per step, stop at the first end token after
step 0, skip start and end tokens; the class table is `[sos] + characters + [eos]`.

`--task decoder:output=NAME,bos=K,eos=K` names the tokens instead (a g2p decoder: `<s>` = 2, `</s>` = 3),
for a Loop, a Scan or an unrolled decoder alike (its output is [N, T, C] per-step scores either way); the
first step is then a real prediction, so the end token is looked for from step 0. Both sides are read
as the application reads them: the FP32 sequence up to its end token, the int8 one up to its own (an
int8 decode that misses the end token reads on, and those tokens count as errors); the steps after the
end, which the application never reads, never count. `token_error_rate` = edit distance / FP32 tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscan.metrics import cosine_from_sums
from quantscan.taskmetrics.base import add_sums, ratio
from quantscan.taskmetrics.ctc import Charset, levenshtein


@dataclass(frozen=True)
class TokenTable:
    """Where a decoder's start and end tokens sit among its classes."""

    sos: int
    eos: int
    first_end_step: int = 1
    """The first step where an end token ends the sequence: 1 for PaddleOCR's tables (step 0 may echo the
    start), 0 for a table named by `bos=`/`eos=` (every step is a prediction)."""


def token_table(charset: Charset | None, classes: int) -> TokenTable | None:
    """PaddleOCR's attention convention (`[sos] + characters + [eos]`) when the charset's characters
    plus those two make exactly `classes`; None when there is no charset or the count does not fit
    (then the end token is unknown and no decode would be the model's own)."""
    if charset is None:
        return None
    characters = len(charset.symbols) - 1  # Charset holds the CTC blank's empty slot beside the characters
    return TokenTable(0, classes - 1) if classes == characters + 2 and classes >= 3 else None


def decode_tokens(scores: np.ndarray, table: TokenTable) -> list[np.ndarray]:
    """[N, T, C] (or [T, C]) → per row the token ids: argmax per step until the first end token after
    step 0, start and end tokens skipped."""
    arr = np.asarray(scores)
    best = np.argmax(arr[None] if arr.ndim == 2 else arr, axis=-1)
    rows = []
    for row in best:
        ends = np.flatnonzero(row[table.first_end_step:] == table.eos)
        kept = row[: ends[0] + table.first_end_step] if len(ends) else row
        rows.append(kept[(kept != table.sos) & (kept != table.eos)])
    return rows


def read_steps(scores: np.ndarray, table: TokenTable) -> np.ndarray:
    """[N, T] bool: the steps the application reads, from the first up to and including the first end
    token (every step when there is none)."""
    arr = np.asarray(scores)
    best = np.argmax(arr[None] if arr.ndim == 2 else arr, axis=-1)
    steps = np.arange(best.shape[1])
    ends = (best == table.eos) & (steps >= table.first_end_step)[None]
    last = np.where(ends.any(axis=1), np.argmax(ends, axis=1), best.shape[1] - 1)
    return steps[None] <= last[:, None]


@dataclass
class DecoderAccumulator:
    """Sequence agreement and token error rate of the int8 decode against the FP32 decode, and
    `cosine_to_end`: the scores' cosine over the steps FP32 reads (up to its end token), the figure the
    output's headline cosine would be if the padding steps after the end did not count."""

    table: TokenTable
    kind: str = "decoder"
    sample_metric: str = "token_error_rate"
    higher_is_worse: bool = True
    _s: dict[str, float] = field(default_factory=dict)
    _samples: list[float] = field(default_factory=list)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        r, t = decode_tokens(ref, self.table), decode_tokens(test, self.table)
        errors = [levenshtein(a, b) for a, b in zip(r, t, strict=True)]
        read = read_steps(ref, self.table)
        x = np.where(read[..., None], np.asarray(ref, np.float64).reshape(read.shape + (-1,)), 0.0)
        y = np.where(read[..., None], np.asarray(test, np.float64).reshape(read.shape + (-1,)), 0.0)
        add_sums(self._s, {"read_sxy": float(np.sum(x * y)), "read_sxx": float(np.sum(x * x)),
                           "read_syy": float(np.sum(y * y))})
        add_sums(self._s, {
            "samples": float(len(r)),
            "sequence_agree": float(sum(np.array_equal(a, b) for a, b in zip(r, t, strict=True))),
            "token_errors": float(sum(errors)),
            "ref_tokens": float(sum(len(a) for a in r)),
        })
        self._samples.extend(e / max(len(a), 1) for e, a in zip(errors, r, strict=True))

    def take_samples(self) -> list[float]:
        """Per sample of the batches fed since the last call: its edit distance over its FP32 tokens."""
        out, self._samples = self._samples, []
        return out

    def merge(self, other: DecoderAccumulator) -> None:
        add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        return {"sequence_agreement": ratio(s.get("sequence_agree", 0), s.get("samples", 0)),
                "token_error_rate": ratio(s.get("token_errors", 0), s.get("ref_tokens", 0)),
                "cosine_to_end": float(cosine_from_sums(s.get("read_sxy", 0.0), s.get("read_sxx", 0.0),
                                                        s.get("read_syy", 0.0))) if s.get("samples") else math.nan}
