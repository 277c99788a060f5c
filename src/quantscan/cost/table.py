"""A profile's `[cost]` table as typed figures, each with the source it was read (or fitted) from.

The figures are data in the profile TOML, like the op limits: a user can describe their own chip. A
profile without the table (or with figures missing) cannot be priced; the error names what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from quantscan.compat.profile_schema import COST_FIGURES, OPTIONAL_COST_FIGURES
from quantscan.compat.profiles import Profile
from quantscan.errors import ProfileError

PRECISION_BYTES: dict[str, int] = {"int8": 1, "uint8": 1, "int16": 2, "fp16": 2, "float": 4}
"""Bytes per activation element at each precision a kernel may run at ("float" = float32, the CPU)."""


@dataclass(frozen=True)
class CostTable:
    """The figures of one chip's cost model (units in the names; `COST_FIGURES` says what each means)."""

    profile: str
    clock_mhz: float
    cores: float
    int8_macs_per_cycle: float
    int16_macs_per_cycle: float
    fp16_macs_per_cycle: float
    channel_align: float
    compute_efficiency: float
    depthwise_efficiency: float
    elementwise_per_cycle: float
    dram_gbps: float
    onchip_kib: float
    layer_overhead_us: float
    run_overhead_us: float
    cpu_gmacs: float
    cpu_gbps: float
    cpu_op_overhead_us: float
    converter_us: float
    partition_us: float
    attention_us: float = 0.0
    """Optional (OPTIONAL_COST_FIGURES): fitted where the zoo's attention models need it (rk3568)."""
    activation_per_cycle: float = 0.0
    """Optional: an activation kernel's rate; 0 (not given) means elementwise_per_cycle (`activation_rate`)."""
    sources: tuple[tuple[str, str], ...] = ()
    """(figure, where it comes from) for every figure, in COST_FIGURES order."""
    fitted: tuple[str, ...] = ()
    """Figures fitted to measured latencies (benchmarks/cost_fit.py) rather than read from a datasheet."""

    @classmethod
    def of(cls, profile: Profile) -> CostTable:
        """The profile's table; ProfileError naming the profile and every missing figure otherwise."""
        table = profile.cost
        if not table:
            raise ProfileError(
                f"profile {profile.name}: expected a [cost] table ({', '.join(COST_FIGURES)}) to estimate "
                "board time, found none"
            )
        missing = [k for k in COST_FIGURES if k not in table]
        if missing:
            raise ProfileError(f"profile {profile.name}: expected [cost] figures {', '.join(missing)}, found none")
        return cls.from_figures(profile.name, table)

    @classmethod
    def from_figures(cls, profile: str, table: dict[str, Any] | Any) -> CostTable:
        """Build from a mapping holding every COST_FIGURES key (plus optional `sources`/`fitted`)."""
        given = dict(table.get("sources", {}))
        fitted = tuple(table.get("fitted", ()))
        default = str(table.get("source", ""))
        named = (*COST_FIGURES, *(k for k in OPTIONAL_COST_FIGURES if k in table))
        sources = tuple((k, _source(k, given, fitted, default)) for k in named)
        return cls(
            profile=profile,
            **{k: float(table[k]) for k in named},
            sources=sources,
            fitted=fitted,
        )

    def with_figures(self, **figures: float) -> CostTable:
        """A copy with some figures replaced (the fit tries candidates this way)."""
        unknown = set(figures) - set(COST_FIGURES) - set(OPTIONAL_COST_FIGURES)
        if unknown:
            raise ValueError(f"not cost figures: {sorted(unknown)}")
        return replace(self, **{k: float(v) for k, v in figures.items()})  # type: ignore[arg-type]

    def figures(self) -> dict[str, float]:
        """Every numeric figure by name, as the profile spells it."""
        names = {f.name for f in fields(self)}
        return {k: float(getattr(self, k)) for k in (*COST_FIGURES, *OPTIONAL_COST_FIGURES) if k in names}

    @property
    def activation_rate(self) -> float:
        """Elements per cycle of an activation kernel: its own figure, or the elementwise one."""
        return self.activation_per_cycle or self.elementwise_per_cycle

    def macs_per_cycle(self, precision: str) -> float:
        """Peak MACs per cycle per core at a kernel precision (uint8 runs as int8)."""
        if precision in ("int8", "uint8"):
            return self.int8_macs_per_cycle
        if precision == "int16":
            return self.int16_macs_per_cycle
        return self.fp16_macs_per_cycle

    def assumptions(self) -> list[dict[str, object]]:
        """cost.json's `assumptions`: figure, value, source, fitted or read."""
        values = self.figures()
        return [
            {"figure": k, "value": values[k], "source": src, "fitted": k in self.fitted}
            for k, src in self.sources
        ]


def _source(key: str, given: dict[str, str], fitted: tuple[str, ...], default: str) -> str:
    if key in fitted:
        return given.get("fitted", "fitted (benchmarks/cost_fit.py)")
    if key in given:
        return given[key]
    return default or "not given"
