"""layers.csv's board time: each site's estimated time on the chip and what keeping it at the fallback
precision would add (`est_ms`, `fallback_extra_ms`), when the scan's profile has a `[cost]` table.

The estimate is `quantscan.cost` on the user's model at the probe's input shapes (batch 1: time per
inference of one sample). A profile without a table prices nothing: the columns are left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from quantscan.scanning.site_result import BoardTime, SiteResult


@dataclass(frozen=True)
class BoardEstimate:
    """What the scan records: per site node its board time, and the all-int8 total (run.json)."""

    profile: str
    int8_ms: float
    sites: Mapping[str, BoardTime]
    input_shapes: Mapping[str, Sequence[int]]

    def to_json(self) -> dict[str, object]:
        return {"profile": self.profile, "int8_ms": round(self.int8_ms, 6), "estimated": True,
                "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
                "model": "quantscan.cost roofline, the profile's [cost] table (fitted figures: benchmarks/cost_fit.py)"}


def board_estimate(
    model: onnx.ModelProto, profile_spec: str | Path, input_shapes: Mapping[str, Sequence[int]]
) -> BoardEstimate | None:
    """None when the profile has no cost table (nothing to price)."""
    from quantscan.compat.profiles import load_profile
    from quantscan.cost import Pricer

    profile = load_profile(profile_spec)
    if not profile.cost:
        return None
    pricer = Pricer.of(model, profile, input_shapes or None)
    base = pricer.price({})
    extra = pricer.fallback_extra_ms()
    # the sites, and the nodes the profile runs on the CPU (their layers.csv rows): their CPU time
    sites = {s.node: BoardTime(s.est_ms, extra.get(s.node, 0.0)) for s in base.per_site
             if s.site or s.device == "cpu"}
    return BoardEstimate(profile.name, base.total_ms, sites, dict(input_shapes))


def probe_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, list[int]]:
    """The graph inputs' shapes as the probe ran them, a symbolic batch set to 1."""
    inits = {t.name for t in model.graph.initializer}
    out: dict[str, list[int]] = {}
    for vi in model.graph.input:
        if vi.name in inits or vi.name not in shapes:
            continue
        dims = list(shapes[vi.name])
        first = vi.type.tensor_type.shape.dim[0] if vi.type.tensor_type.shape.dim else None
        if dims and (first is None or not first.HasField("dim_value")):
            dims[0] = 1
        out[vi.name] = dims
    return out


def with_board_time(results: Sequence[SiteResult], board: BoardEstimate) -> list[SiteResult]:
    """Each priced site's row with its board time (CPU rows and model inputs carry none)."""
    return [replace(r, board=board.sites[r.node]) if r.node in board.sites else r for r in results]
