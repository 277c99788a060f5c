"""Per-channel statistics of chosen tensors over the calibration set, and per-tensor error figures.

Why here and not in the passes: `smooth` and `bias-correct` are pure functions of the model and these
statistics (testable with hand-made numbers); running the model is the runner's job. One session per
model, the tensors exposed as extra outputs, float64 sums streamed per sample (memory flat in the
sample count).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from quantscan.calib import CalibSet
from quantscan.graph.qdq import expose
from quantscan.runner import Runner


@dataclass
class ChannelStats:
    """min, max, mean and mean square per channel of one tensor (channel axis 1 for 'conv', else last)."""

    min: np.ndarray
    max: np.ndarray
    mean: np.ndarray
    meansq: np.ndarray
    count: int

    @property
    def absmax(self) -> np.ndarray:
        return np.maximum(np.abs(self.min), np.abs(self.max))


def _per_channel(x: np.ndarray, axis: str) -> np.ndarray:
    """`x` as [rows, channels] with the channel axis last."""
    x = np.asarray(x, dtype=np.float64)
    if axis == "conv" and x.ndim >= 2:
        x = np.moveaxis(x, 1, -1)
    return x.reshape(-1, x.shape[-1])


def channel_stats(
    model: onnx.ModelProto,
    tensors: Mapping[str, str],
    calib: CalibSet,
    *,
    limit: int | None = None,
    runner: Runner | None = None,
) -> dict[str, ChannelStats]:
    """Statistics of each tensor in `tensors` (name -> channel axis kind) over the calibration samples."""
    if not tensors:
        return {}
    runner = runner or Runner()
    session = runner.session(expose(model, tensors), built=True)
    names = list(tensors)
    acc: dict[str, list[np.ndarray]] = {}
    counts = dict.fromkeys(names, 0)
    for k, sample in enumerate(calib.samples()):
        if limit is not None and k >= limit:
            break
        values = session.run(sample, names)
        for n in names:
            rows = _per_channel(values[n], tensors[n])
            parts = [rows.min(axis=0), rows.max(axis=0), rows.sum(axis=0), (rows * rows).sum(axis=0)]
            if n not in acc:
                acc[n] = parts
            else:
                old = acc[n]
                acc[n] = [np.minimum(old[0], parts[0]), np.maximum(old[1], parts[1]), old[2] + parts[2],
                          old[3] + parts[3]]
            counts[n] += rows.shape[0]
    return {n: ChannelStats(a[0], a[1], a[2] / max(counts[n], 1), a[3] / max(counts[n], 1), counts[n])
            for n, a in acc.items()}


def tensor_sqnr(
    reference: onnx.ModelProto,
    tests: Mapping[str, onnx.ModelProto],
    tensors: list[str],
    calib: CalibSet,
    *,
    limit: int | None = None,
    runner: Runner | None = None,
) -> dict[str, dict[str, float]]:
    """SQNR in dB of each tensor of every test model against the reference, pooled over the samples.

    {test name: {tensor: dB}}. Why SQNR: bias correction removes a mean shift, which SQNR counts and
    cosine (scale-free, but not shift-free either) blurs on near-constant tensors.
    """
    runner = runner or Runner()
    ref = runner.session(expose(reference, tensors), built=True)
    sessions = {k: runner.session(expose(m, tensors), built=True) for k, m in tests.items()}
    signal = dict.fromkeys(tensors, 0.0)
    noise = {k: dict.fromkeys(tensors, 0.0) for k in tests}
    for i, sample in enumerate(calib.samples()):
        if limit is not None and i >= limit:
            break
        base = ref.run(sample, tensors)
        for t in tensors:
            signal[t] += float(np.square(base[t].astype(np.float64)).sum())
        for k, s in sessions.items():
            got = s.run(sample, tensors)
            for t in tensors:
                noise[k][t] += float(np.square(got[t].astype(np.float64) - base[t]).sum())
    return {k: {t: _db(signal[t], n[t]) for t in tensors} for k, n in noise.items()}


def _db(signal: float, noise: float) -> float:
    if noise <= 0:
        return float("inf")
    return 10.0 * float(np.log10(max(signal, 1e-300) / noise))
