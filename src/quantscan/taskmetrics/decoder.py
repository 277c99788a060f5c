"""`decoder`: token sequences of an autoregressive (attention) decoder, greedy as its own postprocess reads them.

Why not `ctc`: an attention decoder (a Loop that feeds its ArgMax back, `graph.decoders`) emits one
token per step from a start token until an end token; CTC's "collapse repeats, drop the blank" would
merge two real `<td></td>` cells into one and read the padding after the end as text. The decode here
is PaddleOCR's `TableLabelDecode`/`AttnLabelDecode`: argmax per step, stop at the first end token after
step 0, skip start and end tokens; the class table is `[sos] + characters + [eos]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscan.taskmetrics.base import add_sums, ratio
from quantscan.taskmetrics.ctc import Charset, levenshtein


@dataclass(frozen=True)
class TokenTable:
    """Where a decoder's start and end tokens sit among its classes."""

    sos: int
    eos: int


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
        ends = np.flatnonzero(row[1:] == table.eos)
        kept = row[: ends[0] + 1] if len(ends) else row
        rows.append(kept[(kept != table.sos) & (kept != table.eos)])
    return rows


@dataclass
class DecoderAccumulator:
    """Sequence agreement and token error rate of the int8 decode against the FP32 decode."""

    table: TokenTable
    kind: str = "decoder"
    _s: dict[str, float] = field(default_factory=dict)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        r, t = decode_tokens(ref, self.table), decode_tokens(test, self.table)
        add_sums(self._s, {
            "samples": float(len(r)),
            "sequence_agree": float(sum(np.array_equal(a, b) for a, b in zip(r, t, strict=True))),
            "token_errors": float(sum(levenshtein(a, b) for a, b in zip(r, t, strict=True))),
            "ref_tokens": float(sum(len(a) for a in r)),
        })

    def merge(self, other: DecoderAccumulator) -> None:
        add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        return {"sequence_agreement": ratio(s.get("sequence_agree", 0), s.get("samples", 0)),
                "token_error_rate": ratio(s.get("token_errors", 0), s.get("ref_tokens", 0))}
