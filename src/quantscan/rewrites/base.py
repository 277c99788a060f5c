"""Result records every rewrite pass returns.

A pass never prints and never raises because a pattern is absent: it returns what it changed and, for
every candidate it left alone, why. The CLI and the rewrite report render those lists; the scan's graph
preparation only reads `model`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx


@dataclass
class Change:
    """One edit a pass made: which rule, at which node (original name), and what it did."""

    rewrite: str
    node: str
    detail: str


@dataclass
class Refusal:
    """A candidate a pass looked at and left unchanged, with the reason (shown to the user)."""

    rewrite: str
    node: str
    reason: str


@dataclass
class RewriteResult:
    """The new model (the input model is never mutated) plus what changed and what was refused.

    `exact` is False for approximations (e.g. `gelu-tanh`): their numeric proof is labelled
    approximate instead of being held to float32 rounding.
    """

    model: onnx.ModelProto
    changes: list[Change] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    exact: bool = True

    @property
    def applied(self) -> bool:
        return bool(self.changes)
