"""Rule: a pair for cross-layer equalization: the activation channels a layer reads span a wide range
while its weights for those channels span a wider one in the opposite direction, so the layer multiplies
the channels the per-tensor activation scale starved back up to full size (their rounding error with them).

The textbook case (issue 40, a BlazePose-style keypoint model): a depthwise conv whose input channels
span 250x in range while its per-channel weights span 12,776x. Each figure alone sat in a different row
of the ranking (rank 1 and 12); neither named equalization. This rule reads the pair together: the
producer's per-channel activation ranges (calibration) beside the consumer's weight range per input
channel (for a depthwise conv, its per-channel weights), and fires when both spread and their channel
orders run against each other (Spearman rank correlation of the log ranges <= MAX_RHO).

Fix: `rewrite --equalize` (Nagel et al. 2019; exact in FP32, no latency). What blocks it is said, with
the measurement that decides the way around: a Clip(0, 6) (Relu6) between the two is not
positive-homogeneous, but when its calibrated output never reaches 6 it acts as a Relu on the data, and
`rewrite --relu6-to-relu --calib DIR` swaps it (proven on the calibration data) so equalization
applies; when it does reach 6, or another non-homogeneous op (HardSwish, Sigmoid...) sits between them,
int16 activations (or per-channel activation scales) at the producer are the lever.
"""

from __future__ import annotations

import math

import numpy as np

from quantscan.diagnose.base import SENTINEL, Cause, CauseFinding, CauseFix, FixKind, PairFacts, SiteFacts, human

MIN_ACT_SPREAD = 20.0
"""Producer channel ranges spanning at least this many times (over 4 bits lost by the smallest)."""
MIN_WEIGHT_SPREAD = 100.0
"""...and the consumer's weight ranges for those channels at least this."""
MAX_RHO = -0.3
"""Spearman correlation of log activation range and log weight range at most this: the large weights sit
on the small channels (equalization moves range from one to the other)."""
MIN_CHANNELS = 4
RELU6 = "Clip"


def check(facts: SiteFacts) -> CauseFinding | None:
    pair = facts.pair
    if pair is None:
        return None
    act, weight = _paired(pair.act_ranges, pair.weight_ranges)
    if act.size < MIN_CHANNELS:
        return None
    act_spread, weight_spread = float(act.max() / act.min()), float(weight.max() / weight.min())
    rho = spearman(np.log(act), np.log(weight))
    if act_spread < MIN_ACT_SPREAD or weight_spread < MIN_WEIGHT_SPREAD or not rho <= MAX_RHO:
        return None
    kind = "depthwise conv" if pair.depthwise else "layer"
    reason = (f"`{pair.producer}` -> `{facts.node}`: the {kind}'s input channels span {human(act_spread)}x in range "
              f"while its weights for them span {human(weight_spread)}x, largest where the input is smallest "
              f"(rank correlation {rho:.2f}): it multiplies the channels one per-tensor scale starved back up")
    evidence = {"act_spread": act_spread, "weight_spread": weight_spread, "rho": rho,
                "blocker_max": pair.blocker_max}
    return CauseFinding(facts.node, Cause.PAIR_EQUALIZATION, evidence, reason, _fix(pair))


def _paired(act: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The channels both sides measured with a positive, finite, non-sentinel range (dead ones aside)."""
    if act.size != weight.size:
        return np.zeros(0), np.zeros(0)
    ok = np.isfinite(act) & np.isfinite(weight) & (act > 0) & (weight > 0) & (act < SENTINEL)
    return act[ok], weight[ok]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Rank correlation (ties by order: ranges are continuous)."""
    rx, ry = np.argsort(np.argsort(x)).astype(np.float64), np.argsort(np.argsort(y)).astype(np.float64)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = math.sqrt(float(np.sum(rx * rx) * np.sum(ry * ry)))
    return float(np.sum(rx * ry) / denom) if denom > 0 else math.nan


def _fix(pair: PairFacts) -> CauseFix:
    """Equalize; around a Relu6 that never reaches its cap, swap it for Relu first; else int16."""
    between = f"`{pair.producer}` and its reader"
    if not pair.blocker:
        return CauseFix(FixKind.REWRITE, "equalize", f"rewrite --equalize (or --recover): balances {between} "
                        "channel by channel, exact in FP32, no latency cost")
    if pair.blocker == RELU6 and math.isfinite(pair.blocker_cap) and pair.blocker_max < pair.blocker_cap:
        return CauseFix(FixKind.REWRITE, "relu6-to-relu",
                        f"the Clip(0, {human(pair.blocker_cap)}) between them blocks equalization, but on the "
                        f"calibration data it never reaches {human(pair.blocker_cap)} (max {human(pair.blocker_max)}):"
                        " it acts as a Relu; rewrite --relu6-to-relu --calib DIR (proven on that data), then "
                        "rewrite --equalize")
    capped = (f"the Clip(0, {human(pair.blocker_cap)}) between them reaches its cap on the calibration data"
              if pair.blocker == RELU6 else f"the {pair.blocker} between them is not positive-homogeneous")
    return CauseFix(FixKind.INT16, "int16", f"{capped}, so equalization cannot pass it: int16 activations "
                    f"at `{pair.producer}`'s output (or per-channel activation scales)")

