"""`ctc`: greedy-decoded string agreement and character error rate for CTC recognisers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantscan.errors import UsageError
from quantscan.readers.jsonfile import read_json
from quantscan.readers.text import read_text
from quantscan.taskmetrics.base import add_sums, ratio

CHARSET_FILES = ("charset.json", "charset.txt")


# --- CTC recognisers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Charset:
    """The class table of a CTC head: `symbols[i]` is class i's text, `blank` the class that emits nothing."""

    symbols: tuple[str, ...]
    blank: int = 0

    def fitted(self, classes: int) -> Charset:
        """PP-OCR keys files omit the trailing space class their models add (use_space_char)."""
        if len(self.symbols) + 1 == classes:
            return Charset((*self.symbols, " "), self.blank)
        return self


def greedy_decode(logits: np.ndarray, charset: Charset) -> list[str]:
    """[N, T, C] (or [T, C]) → strings: argmax per step, collapse repeats, drop blanks."""
    arr = np.asarray(logits)
    arr = arr[None] if arr.ndim == 2 else arr
    best = np.argmax(arr, axis=-1)
    texts = []
    for row in best:
        keep = np.ones(row.shape, dtype=bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != charset.blank
        texts.append("".join(charset.symbols[i] if i < len(charset.symbols) else "\ufffd" for i in row[keep]))
    return texts


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance of two strings (insert, delete, substitute all cost 1); see `levenshtein`."""
    return levenshtein(np.frombuffer(a.encode("utf-32-le"), dtype=np.uint32),
                       np.frombuffer(b.encode("utf-32-le"), dtype=np.uint32))


def levenshtein(a: np.ndarray, b: np.ndarray) -> int:
    """Levenshtein distance of two 1-D code sequences (characters or token ids), one row at a time.

    Why numpy: a decoder's strings run to thousands of characters (SLANet's 501 HTML tokens), and the
    pure-Python double loop took 6.7 s per sample there. Row i from row i-1: x[j] = min(prev[j] + 1,
    prev[j-1] + (a[i] != b[j])), then the insertions cur[j] = min(x[j], cur[j-1] + 1), which is
    j + the running minimum of x[k] - k (`np.minimum.accumulate`)."""
    if not len(a) or not len(b):
        return len(a) + len(b)
    steps = np.arange(len(b) + 1)
    prev = steps.copy()
    for i, ca in enumerate(a, 1):
        x = np.empty_like(prev)
        x[0] = i
        x[1:] = np.minimum(prev[1:] + 1, prev[:-1] + (b != ca))
        prev = np.minimum.accumulate(x - steps) + steps
    return int(prev[-1])


@dataclass
class CtcAccumulator:
    """String agreement and character error rate of the int8 decode against the FP32 decode."""

    charset: Charset
    kind: str = "ctc"
    sample_metric: str = "cer"
    higher_is_worse: bool = True
    _s: dict[str, float] = field(default_factory=dict)
    _samples: list[float] = field(default_factory=list)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        charset = self.charset.fitted(np.shape(ref)[-1])
        r, t = greedy_decode(ref, charset), greedy_decode(test, charset)
        errors = [edit_distance(a, b) for a, b in zip(r, t, strict=True)]
        add_sums(self._s, {
            "samples": float(len(r)),
            "string_agree": float(sum(a == b for a, b in zip(r, t, strict=True))),
            "char_errors": float(sum(errors)),
            "ref_chars": float(sum(len(a) for a in r)),
        })
        self._samples.extend(e / max(len(a), 1) for e, a in zip(errors, r, strict=True))

    def take_samples(self) -> list[float]:
        """Per sample of the batches fed since the last call: its character error rate (worst samples)."""
        out, self._samples = self._samples, []
        return out

    def merge(self, other: CtcAccumulator) -> None:
        add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        return {"string_agreement": ratio(s.get("string_agree", 0), s.get("samples", 0)),
                "cer": ratio(s.get("char_errors", 0), s.get("ref_chars", 0))}


# --- files beside the data and auto-detection --------------------------------------------------------


def load_charset(path: Path) -> Charset:
    """charset.json (a list of characters for classes 1.., or {"characters": [...], "blank": k}) or a
    PP-OCR style .txt (one character per line, blank 0 before them)."""
    if Path(path).suffix.lower() != ".json":
        return _with_blank([line.rstrip("\r\n") for line in read_text(Path(path), "--charset").splitlines()], 0)
    data = read_json(Path(path), "--charset")
    if isinstance(data, Mapping):
        chars, blank = data.get("characters"), data.get("blank", 0)
    else:
        chars, blank = data, 0
    if not isinstance(chars, list) or not all(isinstance(c, str) for c in chars) or not isinstance(blank, int):
        raise UsageError(f'--charset: expected a list of strings or {{"characters": [...], "blank": 0}} in {path}')
    return _with_blank(chars, blank)


def charset_from_text(text: str) -> Charset:
    """A model's own `character` metadata (PP-OCR exports): one character per line, blank 0 before them."""
    return _with_blank(text.splitlines(), 0)


def _with_blank(chars: Sequence[str], blank: int) -> Charset:
    symbols = list(chars)
    symbols.insert(min(max(blank, 0), len(symbols)), "")
    return Charset(tuple(symbols), blank)


def find_charset(data_dir: Path | None) -> Path | None:
    """charset.json / charset.txt beside the evaluation data, if any."""
    if data_dir is None or not data_dir.is_dir():
        return None
    return next((data_dir / n for n in CHARSET_FILES if (data_dir / n).is_file()), None)
