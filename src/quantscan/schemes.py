"""Quantization schemes as data: what the weights and the activations of every site are stored in.

A scheme is four choices (CONTRACT.md, "Schemes"): weights int8 or int4, per output channel or in groups
of G along the input axis, symmetric or with a zero point; activations uint8, int8, int16 (per tensor)
or float (weight-only: the LLM NPUs' "a16", fp16 activations, which quantscan keeps float32). Its name
is the shorthand chips and toolkits use: `w8a8`, `w8a16`, `w4a16-g128`, `w8a8-g128`, `w4a16-g64-zp`.

What `a16` means depends on the chip: int16 on a CNN NPU (Qualcomm W8A16, rknn-toolkit2's w8a16), fp16
on an LLM NPU (RKLLM w4a16). Without a profile the shorthand's a16 is int16; a profile's `[schemes]` table
says `a16 = "float"` when its chip's 16-bit activations are fp16, and lists the schemes the chip runs.
No onnxruntime, no argparse: the CLI and the scan resolve a `Scheme` here and hand it on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from quantscan.errors import UsageError

WEIGHT_TYPES = ("int8", "int4")
ACTIVATION_TYPES = ("uint8", "int8", "int16", "float")
EIGHT_BIT = ("uint8", "int8")
_SHORTHAND = re.compile(r"^w(?P<w>4|8)a(?P<a>8|16|16f|f|f16|fp16|float)(?:-g(?P<g>[1-9][0-9]*))?(?P<zp>-zp)?$")


@dataclass(frozen=True)
class Scheme:
    """One quantization scheme; `activations` is a member of ACTIVATION_TYPES."""

    weights: str = "int8"
    group_size: int | None = None
    weight_zero_point: bool = False
    activations: str = "uint8"

    @property
    def weight_bits(self) -> int:
        return 4 if self.weights == "int4" else 8

    @property
    def activation_bits(self) -> int | None:
        """8 or 16; None for float activations (weight-only)."""
        return None if self.activations == "float" else (16 if self.activations == "int16" else 8)

    @property
    def weight_only(self) -> bool:
        return self.activations == "float"

    @property
    def needs_opset21(self) -> bool:
        """QuantizeLinear on int16 and DequantizeLinear on int4 / with `block_size` come with opset 21."""
        return self.activations == "int16" or self.weights == "int4" or self.group_size is not None

    @property
    def is_default(self) -> bool:
        """The scheme quantscan simulated before schemes existed: int8 per channel, 8-bit activations; on a
        chip whose 8-bit weights carry zero points (RKNN) its w8a8 is that chip's plain scheme too."""
        return self.weights == "int8" and self.group_size is None and self.activations in EIGHT_BIT

    def name(self, a16: str = "int16") -> str:
        """The shorthand: `w4a16-g128`; float activations are `a16` where the chip's a16 is float,
        else `af` (so that a name never means two schemes)."""
        if self.activations == "float":
            act = "16" if a16 == "float" else "f"
        else:
            act = "16" if self.activations == "int16" else "8"
        group = f"-g{self.group_size}" if self.group_size else ""
        return f"w{self.weight_bits}a{act}{group}{'-zp' if self.weight_zero_point else ''}"

    def runs_as(self, other: Scheme) -> bool:
        """True when a chip that runs `other` runs this one: equal, 8-bit activations of either
        signedness alike (a profile's w8a8 has always taken `--activations uint8|int8`)."""
        same_acts = self.activations == other.activations or (
            self.activations in EIGHT_BIT and other.activations in EIGHT_BIT)
        return same_acts and (self.weights, self.group_size, self.weight_zero_point) == (
            other.weights, other.group_size, other.weight_zero_point)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name(), "weights": self.weights, "group_size": self.group_size,
                "weight_zero_point": self.weight_zero_point, "activations": self.activations}


def parse_scheme(name: str, *, a16: str = "int16", eight_bit: str = "uint8", weight_zero_point: bool = False) -> Scheme:
    """A shorthand as a `Scheme`: `w{4,8}a{8,16,f}[-gG][-zp]`. `a8` takes `eight_bit` (the profile's
    8-bit activation type), `a16` takes `a16` (int16, or float on an LLM NPU); `af`/`a16f`: float.
    `weight_zero_point`: the chip's 8-bit weights carry zero points (a profile's `[quantization]
    weight_zero_point`), so its `w8a8` is `w8a8-zp`, as its toolkit calls it w8a8."""
    m = _SHORTHAND.match(name.strip().lower().replace("_", "-"))
    if m is None:
        raise UsageError(f"--scheme: expected a shorthand like w8a8, w8a16, w4a16-g128 or w8a8-g128-zp "
                         f"(w4|w8, a8|a16|af, optional -gG and -zp), found {name!r}")
    act = m["a"]
    activations = eight_bit if act == "8" else a16 if act == "16" else "float"
    group = int(m["g"]) if m["g"] else None
    weights = "int4" if m["w"] == "4" else "int8"
    zero_point = bool(m["zp"]) or (weight_zero_point and weights == "int8")
    return Scheme(weights, group, zero_point, activations)


@dataclass(frozen=True)
class ChipSchemes:
    """The schemes a profile's chip runs (its `[schemes]` table), and what its `a16` means."""

    names: tuple[str, ...]
    a16: str = "int16"
    eight_bit: str = "uint8"
    weight_zero_point: bool = False
    """The chip's 8-bit weights carry zero points (its `w8` shorthands mean `w8...-zp`)."""

    def parse(self, name: str) -> Scheme:
        """A shorthand as this chip means it."""
        return parse_scheme(name, a16=self.a16, eight_bit=self.eight_bit, weight_zero_point=self.weight_zero_point)

    def schemes(self) -> list[Scheme]:
        return [self.parse(n) for n in self.names]

    def runs(self, scheme: Scheme) -> bool:
        return any(scheme.runs_as(s) for s in self.schemes())


def chip_schemes(table: dict[str, Any] | None, eight_bit: str, weight_zero_point: bool = False) -> ChipSchemes:
    """A profile's `[schemes]` table as `ChipSchemes`; a profile without one runs w8a8 only (the one
    scheme every shipped profile described before schemes were data). `weight_zero_point`: the profile's
    `[quantization] weight_zero_point`."""
    if not table:
        return ChipSchemes(("w8a8",), eight_bit=eight_bit, weight_zero_point=weight_zero_point)
    return ChipSchemes(tuple(table.get("names", ("w8a8",))), table.get("a16", "int16"), eight_bit, weight_zero_point)


def resolve_scheme(
    *,
    scheme: str | None,
    weights: str | None,
    group_size: int | None,
    activations: str | None,
    profile_activations: str | None,
    chip: ChipSchemes | None,
    profile: str | None = None,
) -> Scheme:
    """The scheme a scan simulates: `--scheme` (read with the profile's meaning of a16), then the single
    flags over it; without either, int8 per-channel weights and the profile's (else uint8) activations.
    A scheme the profile's chip does not run is bad input, naming the ones it does."""
    eight_bit = profile_activations if profile_activations in EIGHT_BIT else "uint8"
    a16 = chip.a16 if chip else "int16"
    zero_point = chip.weight_zero_point if chip else False
    if scheme:
        base = parse_scheme(scheme, a16=a16, eight_bit=eight_bit, weight_zero_point=zero_point)
    else:
        base = Scheme(weight_zero_point=zero_point, activations=eight_bit)
    check_values(weights, group_size, activations)
    chosen = replace(
        base,
        weights=weights or base.weights,
        group_size=group_size if group_size is not None else base.group_size,
        activations=activations or base.activations,
    )
    if chip is not None and not chip.runs(chosen):
        raise UsageError(f"--scheme: expected a scheme profile {profile} runs ({', '.join(chip.names)}), "
                         f"found {chosen.name(a16)}")
    return chosen


def check_values(weights: str | None, group_size: int | None, activations: str | None) -> None:
    """Refuse a value none of the flags takes, with the flag's name."""
    if weights is not None and weights not in WEIGHT_TYPES:
        raise UsageError(f"--weights: expected {' or '.join(WEIGHT_TYPES)}, found {weights!r}")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1):
        raise UsageError(f"--group-size: expected a positive integer, found {group_size!r}")
    if activations is not None and activations not in ACTIVATION_TYPES:
        raise UsageError(f"--activations: expected one of {'|'.join(ACTIVATION_TYPES)}, found {activations!r}")


def scheme_names(schemes: Sequence[Scheme], a16: str = "int16") -> list[str]:
    return [s.name(a16) for s in schemes]
