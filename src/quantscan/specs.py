"""Small typed records shared by the loader, the calibration reader and the analyses."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Dim = int | str | None
"""A tensor dimension: a fixed size, a symbolic name (`"batch"`), or unknown (None)."""


@dataclass(frozen=True)
class InputSpec:
    """One graph input as the model declares it (initializer-backed inputs excluded)."""

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]

    @property
    def is_dynamic(self) -> bool:
        return any(not isinstance(d, int) or d < 0 for d in self.shape)


@dataclass
class Warnings:
    """Conditions inside a valid run (ignored files, zero-range tensors, NaN in activations...).

    Collected, never printed: the CLI prints them to stderr and the report lists them.
    """

    messages: list[str] = field(default_factory=list)

    def add(self, message: str) -> None:
        if message not in self.messages:
            self.messages.append(message)

    def extend(self, messages: list[str]) -> None:
        for m in messages:
            self.add(m)
