"""Warnings as the CLI prints them: a few of each kind, then how many more and where they all are.

Why: a model with NaN activations gave one warning per tensor and pass (463 lines on stderr before
the summary); the reader needs the kinds and a count, and the run's record keeps every line.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Sequence

WARNINGS_PER_KIND = 5
"""Warnings of one kind printed before the rest are counted in one line."""

_QUOTED = re.compile(r"'[^']*'")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")


def warning_kind(text: str) -> str:
    """The warning with what varies between its instances (quoted names, numbers) blanked out."""
    return _NUMBER.sub("#", _QUOTED.sub("'…'", text))


def capped_warnings(warnings: Sequence[str], record: str | None, per_kind: int = WARNINGS_PER_KIND) -> list[str]:
    """The warning lines to print: the first `per_kind` of each kind in their order, then one line per kind
    that had more, saying how many and where all of them are (`record`: a file of the run, or None)."""
    seen: Counter[str] = Counter()
    shown = []
    for text in warnings:
        kind = warning_kind(text)
        seen[kind] += 1
        if seen[kind] <= per_kind:
            shown.append(text)
    where = f": see {record}" if record else ""
    more = [f"… and {n - per_kind} more like \"{kind}\"{where}" for kind, n in seen.items() if n > per_kind]
    return shown + more


def print_warnings(warnings: Sequence[str], record: str | None) -> None:
    for line in capped_warnings(warnings, record):
        print(f"quantscan: warning: {line}", file=sys.stderr)
