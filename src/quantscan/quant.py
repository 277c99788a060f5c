"""Quantization arithmetic and calibration observers, in plain numpy.

This is the reference the fake-quant graph must agree with:

* :func:`quantize` / :func:`dequantize` follow ONNX QuantizeLinear / DequantizeLinear exactly
  (float32 division by the scale, round half to even, add the zero point, saturate to the type).
* :func:`activation_qparams` reproduces onnxruntime's ``quant_utils.compute_scale_zp`` (range widened
  to include 0, scale computed in float64 then stored as float32, a scale below float32 ``tiny`` falls
  back to 1), so a range gives the same scale/zero point here as in an ORT-quantized model.
* Weights are symmetric per output channel; biases int32 at ``s_in * s_w[c]`` (CONTRACT.md,
  "Quantization sites").

Observers see a tensor batch by batch and keep a bounded state (running extrema or a histogram), so
calibration is one streaming pass whatever the number of samples. NaN/Inf values are left out of every
statistic and counted in ``nonfinite``; the caller turns a non-zero count into a warning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

F32 = NDArray[np.float32]
F64 = NDArray[np.float64]

# scheme -> (storage dtype, qmin, qmax used to derive the scale, symmetric). Symmetric schemes use the
# restricted range [-127, 127] / [-32767, 32767] for the scale, as onnxruntime does, while
# QuantizeLinear still saturates to the full type range.
_SCHEMES: dict[str, tuple[type[np.integer], int, int, bool]] = {
    "uint8": (np.uint8, 0, 255, False),
    "int8": (np.int8, -127, 127, True),
    "int16": (np.int16, -32767, 32767, True),
    "uint16": (np.uint16, 0, 65535, False),
}
_WEIGHT_SCHEMES = {8: "int8", 16: "int16"}
_INT4_RANGE = {True: (-8, 7), False: (0, 15)}
"""Stored range of a 4-bit weight: signed (symmetric, zero point 0) or unsigned (with a zero point), as
ONNX INT4/UINT4. numpy has no 4-bit type: the codes are held in int8/uint8 and `QParams.bits` says 4."""
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)
_INT32 = np.iinfo(np.int32)


@dataclass(frozen=True, eq=False)
class QParams:
    """Scale and zero point of one quantized tensor (per tensor when ``axis`` is None)."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None = None
    block_size: int | None = None
    """Blocked (group-wise) parameters, ONNX opset 21 semantics: `scale` has the tensor's rank and one
    entry per `block_size` elements along `axis` (the weight's input axis); None: per tensor / channel."""
    bits: int | None = None
    """4 for int4/uint4 codes held in an 8-bit array; None: the zero point's own type decides the range."""

    @property
    def qmin(self) -> int:
        """Lowest stored value: QuantizeLinear saturates to the full range of the zero point's type."""
        if self.bits == 4:
            return _INT4_RANGE[self.zero_point.dtype == np.int8][0]
        return int(np.iinfo(self.zero_point.dtype).min)

    @property
    def qmax(self) -> int:
        if self.bits == 4:
            return _INT4_RANGE[self.zero_point.dtype == np.int8][1]
        return int(np.iinfo(self.zero_point.dtype).max)

    @property
    def dtype(self) -> np.dtype:
        return self.zero_point.dtype

    @property
    def per_channel(self) -> bool:
        return self.axis is not None


def _scheme(scheme: str) -> tuple[type[np.integer], int, int, bool]:
    try:
        return _SCHEMES[scheme]
    except KeyError:
        raise ValueError(
            f"unknown quantization scheme {scheme!r}; expected one of {sorted(_SCHEMES)}"
        ) from None


def activation_qparams(rmin: float, rmax: float, scheme: str = "uint8") -> QParams:
    """Per-tensor activation parameters for a calibrated range, exactly as onnxruntime computes them.

    "uint8": asymmetric, range widened to include 0, scale = (rmax - rmin) / 255,
    zero point = round(-rmin / scale); "uint16" the same over 0..65535 (quantize_static's QUInt16,
    the onnxruntime recipe's int16 activations). "int8" / "int16": symmetric, scale = absmax / 127 (/ 32767),
    zero point 0. A zero range (rmin == rmax == 0) gets scale 1 and zero point 0: every value
    quantizes to 0, which is exact for a tensor that is always zero; the caller warns about it.
    """
    dtype, qmin, qmax, symmetric = _scheme(scheme)
    if not (math.isfinite(rmin) and math.isfinite(rmax)):
        raise ValueError(f"calibrated range must be finite, got [{rmin}, {rmax}]")
    if rmin > rmax:
        raise ValueError(f"calibrated range is inverted: rmin {rmin} > rmax {rmax}")
    # Ranges are stored as float32 (they come from float32 tensors); widen to include 0 so that zero
    # (padding, ReLU output) is exactly representable.
    lo = min(np.float32(rmin), np.float32(0.0))
    hi = max(np.float32(rmax), np.float32(0.0))
    if symmetric:
        absmax = max(abs(lo), abs(hi))
        lo, hi = -absmax, absmax
    scale = (float(hi) - float(lo)) / float(qmax - qmin)
    if scale < _FLOAT32_TINY:
        return QParams(np.array(1.0, dtype=np.float32), np.array(0, dtype=dtype))
    zero_point = 0 if symmetric else int(np.clip(np.round(qmin - float(lo) / scale), qmin, qmax))
    return QParams(np.array(scale, dtype=np.float32), np.array(zero_point, dtype=dtype))


def activation_scales(rmin: np.ndarray, rmax: np.ndarray, scheme: str = "uint8") -> NDArray[np.float32]:
    """`activation_qparams(rmin, rmax, scheme).scale` elementwise over arrays of finite ranges.

    Why a second spelling: calib-advice scores thousands of candidate subsets per tensor, and one Python
    call per range dominated it; every step mirrors activation_qparams (float32 ranges widened to 0,
    ±absmax when symmetric, the float64 difference over the code count, scale 1 below float32's tiny),
    and a test holds the two equal bit for bit."""
    _, qmin, qmax, symmetric = _scheme(scheme)
    lo = np.minimum(np.asarray(rmin, np.float32), np.float32(0.0))
    hi = np.maximum(np.asarray(rmax, np.float32), np.float32(0.0))
    if symmetric:
        hi = np.maximum(np.abs(lo), np.abs(hi))
        lo = -hi
    scale = (hi.astype(np.float64) - lo.astype(np.float64)) / float(qmax - qmin)
    return np.where(scale < _FLOAT32_TINY, 1.0, scale).astype(np.float32)


def weight_qparams(
    w: np.ndarray,
    axis: int,
    bits: int = 8,
    per_channel: bool = True,
    *,
    group_size: int | None = None,
    symmetric: bool = True,
    input_axis: int | None = None,
) -> QParams:
    """Weight parameters: symmetric per output channel by default, scale_c = absmax_c / 127 (int8),
    / 32767 (int16) or / 7 (int4).

    `per_channel=False` is a chip without per-channel weight scales (NXP Neutron, TIDL): one scale,
    the whole tensor's absmax / 127, given to every channel. It stays in per-channel form (the same
    value on each channel along `axis`) so every reader of a weight plan (bias scales, channel tables,
    the QDQ graph) takes it unchanged; the stored values are those of a per-tensor scale.
    Symmetric int4 puts the value of largest magnitude on code -8 (scale = that value / -8, as
    onnxruntime's MatMulNBits and llama.cpp's Q4_0), so its scale is negative when that value is positive.
    `group_size=G`: one scale per G consecutive weights along the input axis (`input_axis`, default
    :func:`weight_input_axis`), separately for every output channel (and kernel tap): the group-wise
    int4 of the LLM NPUs (RKLLM w4a16_g128, QNN LPBQ, onnxruntime MatMulNBits); the parameters are
    blocked as ONNX opset 21 DequantizeLinear takes them (`axis` = the input axis, `block_size` = G).
    `symmetric=False`: asymmetric with a zero point (uint8 / uint4 codes), the range widened to 0 as
    for activations. An all-zero channel or group gets scale 1 (CONTRACT.md): any positive scale
    represents it exactly, and 1 keeps the bias scale s_in * s_w finite.
    """
    if bits not in (4, *_WEIGHT_SCHEMES):
        raise ValueError(f"weight bits must be 4, 8 or 16, got {bits}")
    arr = np.asarray(w)
    if arr.ndim == 0:
        raise ValueError("a per-channel weight needs at least one axis")
    if not np.isfinite(arr).all():
        raise ValueError("weight contains NaN or Inf")
    ax = _normalize_axis(axis, arr.ndim)
    if group_size is not None:
        if group_size < 1:
            raise ValueError(f"group size must be positive, got {group_size}")
        block_axis = weight_input_axis(ax, arr.ndim) if input_axis is None else _normalize_axis(input_axis, arr.ndim)
        lo, hi = _block_extrema(arr.astype(np.float32), block_axis, group_size)
        scale, zero_point = _weight_grid(lo, hi, bits, symmetric)
        return QParams(scale, zero_point, block_axis, block_size=group_size, bits=4 if bits == 4 else None)
    others = tuple(i for i in range(arr.ndim) if i != ax)
    lo = arr.astype(np.float32).min(axis=others, initial=0.0).astype(np.float64)
    hi = arr.astype(np.float32).max(axis=others, initial=0.0).astype(np.float64)
    if not per_channel:
        lo, hi = np.full_like(lo, lo.min(initial=0.0)), np.full_like(hi, hi.max(initial=0.0))
    scale, zero_point = _weight_grid(lo, hi, bits, symmetric)
    return QParams(scale, zero_point, ax, bits=4 if bits == 4 else None)


def channel_absmax(qp: QParams, output_axis: int | None) -> F64:
    """Per output channel, the largest |value| the weight grid represents: scale * 127 for symmetric int8
    per channel; for a blocked (group-wise) grid the widest group of the channel; with a zero point
    the longer side of it. What channels.csv reports as `weight_absmax`."""
    scale = np.abs(np.atleast_1d(np.asarray(qp.scale, np.float32)).astype(np.float64))
    zp = np.asarray(qp.zero_point, np.float64)
    restricted = 1 if qp.bits != 4 and not zp.any() else 0  # symmetric int8/int16: -128 is never used
    reach = scale * np.maximum(qp.qmax - zp, zp - qp.qmin - restricted)
    if qp.block_size and reach.ndim > 1:
        out = _normalize_axis(output_axis or 0, reach.ndim)
        reach = reach.max(axis=tuple(i for i in range(reach.ndim) if i != out))
    return np.asarray(reach, np.float64).reshape(-1)


def weight_input_axis(output_axis: int, ndim: int) -> int:
    """The axis a weight sums over (its input channels): the other axis of a MatMul [K, N] / Gemm weight,
    axis 1 of a Conv [O, I, kH, kW] weight, axis 0 of a ConvTranspose [I, O/g, kH, kW] one."""
    if ndim == 1:
        return 0
    return 1 if output_axis == 0 else 0


def _block_extrema(w: F32, axis: int, block: int) -> tuple[F64, F64]:
    """Per-block min and max along `axis` (the last block may be short), each with w's rank: the
    blocked parameter shape of ONNX opset 21 (dim `axis` = ceil(D / block))."""
    length = w.shape[axis]
    n_blocks = -(-length // block)
    pad = [(0, 0)] * w.ndim
    pad[axis] = (0, n_blocks * block - length)
    padded = np.pad(w, pad)  # zeros: the range is widened to include 0 anyway
    shape = (*w.shape[:axis], n_blocks, block, *w.shape[axis + 1:])
    blocks = padded.reshape(shape).astype(np.float64)
    return blocks.min(axis=axis + 1), blocks.max(axis=axis + 1)


def _weight_grid(lo: F64, hi: F64, bits: int, symmetric: bool) -> tuple[F32, np.ndarray]:
    """Scale and zero point for ranges (lo <= 0 <= hi, float64 arrays) on a `bits`-bit weight grid.

    Symmetric: absmax / (2^(bits-1) - 1), zero point 0 (int8/int16 codes); int4 (held in int8): the
    signed extreme / -8, see below.
    Asymmetric: (hi - lo) / (2^bits - 1), zero point round(-lo / scale) (uint codes), as activations."""
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    if symmetric and bits == 4:
        # The value of largest magnitude lands on -8 (scale = that value / -8, negative when it is
        # positive), so all 16 codes serve: onnxruntime's MatMulNBits quantizer (MLAS
        # MlasQuantizeBlockwise, symmetric) and llama.cpp's Q4_0 do this; absmax / 7 would waste one code.
        extreme = np.where(-lo > hi, lo, hi)
        scale = (extreme / -8.0).astype(np.float32)
        scale = np.where(np.abs(scale) < _FLOAT32_TINY, np.float32(1.0), scale).astype(np.float32)
        return scale, np.zeros(scale.shape, dtype=np.int8)
    if symmetric:
        dtype, _, qmax, _ = _scheme(_WEIGHT_SCHEMES[bits])
        absmax_scale = np.maximum(np.abs(lo), np.abs(hi)) / qmax
        scale = np.where(absmax_scale < _FLOAT32_TINY, 1.0, absmax_scale).astype(np.float32)
        return scale, np.zeros(scale.shape, dtype=dtype)
    levels = 2**bits - 1
    scale64 = (hi - lo) / levels
    tiny = scale64 < _FLOAT32_TINY
    scale64 = np.where(tiny, 1.0, scale64)
    zp = np.where(tiny, 0, np.clip(np.round(-lo / scale64), 0, levels))
    udtype = np.uint16 if bits == 16 else np.uint8
    return scale64.astype(np.float32), zp.astype(udtype)


def expand_blocks(param: np.ndarray, axis: int, block_size: int, length: int | None) -> np.ndarray:
    """A blocked parameter repeated `block_size` times along `axis` (cut to `length`, the tensor's size
    there): the element-wise scale DequantizeLinear with `block_size` applies (ONNX opset 21)."""
    full = np.repeat(param, block_size, axis=axis)
    return full if length is None else np.take(full, np.arange(length), axis=axis)


def _normalize_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} out of range for a rank-{ndim} tensor")
    return axis % ndim


def _broadcast(param: np.ndarray, qp: QParams, shape: tuple[int, ...]) -> np.ndarray:
    """Shape a per-channel parameter so it broadcasts along ``qp.axis`` (ONNX ``axis`` semantics); a
    blocked one is repeated over its blocks to the tensor's `shape`."""
    ndim = len(shape)
    if qp.axis is None or param.ndim == 0:
        return param
    if qp.block_size:
        axis = _normalize_axis(qp.axis, ndim)
        return expand_blocks(param, axis, qp.block_size, shape[axis])
    channel_shape = [1] * ndim
    channel_shape[_normalize_axis(qp.axis, ndim)] = param.size
    return param.reshape(channel_shape)


def quantize(x: np.ndarray, qp: QParams) -> np.ndarray:
    """QuantizeLinear: saturate(round_half_to_even(x / scale) + zero_point), in the zero point's dtype.

    The division is float32 like the ONNX reference and onnxruntime's kernel, so results match bit
    for bit. NaN (undefined in ONNX) maps to the zero point, i.e. dequantizes to 0.
    """
    x32 = np.asarray(x, dtype=np.float32)
    scale = _broadcast(np.asarray(qp.scale, dtype=np.float32), qp, x32.shape)
    zp = _broadcast(np.asarray(qp.zero_point), qp, x32.shape).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.rint(x32 / scale).astype(np.float64) + zp
    q = np.where(np.isnan(q), zp, q)
    return np.clip(q, qp.qmin, qp.qmax).astype(qp.dtype)


def dequantize(q: np.ndarray, qp: QParams) -> F32:
    """DequantizeLinear: (q - zero_point) * scale, computed in float32 as the ONNX reference does."""
    q32 = np.asarray(q).astype(np.float32)
    scale = _broadcast(np.asarray(qp.scale, dtype=np.float32), qp, q32.shape)
    zp = _broadcast(np.asarray(qp.zero_point), qp, q32.shape).astype(np.float32)
    return np.asarray((q32 - zp) * scale, dtype=np.float32)


def fake_quant(x: np.ndarray, qp: QParams) -> F32:
    """QuantizeLinear followed by DequantizeLinear: what a QDQ pair does to a float tensor."""
    return dequantize(quantize(x, qp), qp)


def quantize_bias(
    b: np.ndarray, input_scale: float, weight_scale: np.ndarray
) -> tuple[NDArray[np.int32], F32, bool]:
    """Bias as int32 at scale s_in * s_w[c], the scale an integer accumulator works at.

    Returns (int32 values, float32 scale per element of ``b``, overflowed). Values beyond int32 are
    clamped and ``overflowed`` is True: the caller warns, since the chip saturates the same way. The
    division is float64 so that the overflow test itself is exact.
    """
    bias = np.asarray(b, dtype=np.float64)
    bias_scale = np.broadcast_to(
        (np.float32(input_scale) * np.asarray(weight_scale, dtype=np.float32)).astype(np.float32), bias.shape
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(bias / bias_scale.astype(np.float64))
    q = np.where(np.isnan(q), 0.0, q)  # 0 / 0: zero bias with a zero scale
    overflowed = bool(((q < _INT32.min) | (q > _INT32.max)).any())
    clamped = np.clip(q, _INT32.min, _INT32.max).astype(np.int32)
    return clamped, np.array(bias_scale, dtype=np.float32), overflowed


def widen_weight_scale_for_bias(weight_scale: np.ndarray, input_scale: float, b: np.ndarray) -> F32:
    """The weight scale onnxruntime's quantize_static uses so that bias / (s_in * s_w) fits int32.

    Same arithmetic as its qdq_quantizer._adjust_weight_scale_for_int32_bias (1.20-1.32): per channel
    (per tensor for a scalar scale), when s_in * s_w < 1.0001 * 2|b| / (2^32 - 2), s_w grows by the
    ratio. It matters with 16-bit inputs and weights, whose product scale is ~1e-9.
    """
    scale = np.array(weight_scale, dtype=np.float32, copy=True)
    bias = np.abs(np.asarray(b, dtype=np.float32)).reshape(-1)
    qrange = np.float64(_INT32.max) - np.float64(_INT32.min + 1)
    s_in = float(np.float32(input_scale))
    flat = scale.reshape(-1)
    per_tensor = flat.size == 1
    for i in range(flat.size):
        # onnxruntime's precision: float64 per tensor, float32 up to the division per channel
        absmax = np.float64(bias.max(initial=0.0)) if per_tensor else bias[i]
        smallest = float(1.0001 * (2.0 * absmax) / qrange)
        candidate = s_in * float(flat[i])
        if 0.0 < candidate < smallest:
            flat[i] = np.float32(float(flat[i]) * (smallest / candidate))
    return scale


# --------------------------------------------------------------------------------------------------
# Observers


class Observer(Protocol):
    """Streams batches of one tensor and proposes its calibrated range."""

    nonfinite: int

    def update(self, x: np.ndarray) -> None: ...

    def range(self) -> tuple[float, float]: ...


def _finite_flat(x: np.ndarray) -> tuple[F32, int]:
    """Flattened float32 values without NaN/Inf, and how many were dropped.

    float32 is what the histograms are built in, as in onnxruntime, so equal inputs give equal bins.
    """
    flat = np.asarray(x, dtype=np.float32).ravel()
    ok = np.isfinite(flat)
    if ok.all():
        return flat, 0
    return flat[ok], int(flat.size - np.count_nonzero(ok))


class MinMaxObserver:
    """Running min/max (float64); with ``symmetric`` the range is ±absmax, like ORT's MinMaxCalibrater."""

    def __init__(self, symmetric: bool = False) -> None:
        self.symmetric = symmetric
        self.nonfinite = 0
        self.seen = 0
        self._min = math.inf
        self._max = -math.inf

    def update(self, x: np.ndarray) -> None:
        arr = np.asarray(x, dtype=np.float64).ravel()
        ok = np.isfinite(arr)
        finite = arr if ok.all() else arr[ok]
        self.nonfinite += int(arr.size - finite.size)
        if finite.size == 0:
            return
        self.seen += int(finite.size)
        self._min = min(self._min, float(finite.min()))
        self._max = max(self._max, float(finite.max()))

    def merge(self, other: MinMaxObserver) -> None:
        """Add another shard's range (`--workers`): a min and a max, so exact."""
        self.nonfinite += other.nonfinite
        self.seen += other.seen
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)

    def range(self) -> tuple[float, float]:
        """(min, max) seen; (0, 0) before any finite value."""
        if not self.seen:
            return 0.0, 0.0
        if self.symmetric:
            absmax = max(abs(self._min), abs(self._max))
            return -absmax, absmax
        return self._min, self._max


def _symmetric_histogram(data: F32, bins: int, threshold: np.ndarray) -> tuple[NDArray[np.int64], np.ndarray]:
    """``np.histogram`` over [-threshold, threshold] with the bounds kept as float32 arrays.

    Python-float bounds would make numpy bin in float64 and move a few values across bin edges
    relative to onnxruntime, which passes float32 bounds.
    """
    bounds: Any = (-threshold, threshold)
    return np.histogram(data, bins, range=bounds)


MAX_HISTOGRAM_BINS = 1 << 22
"""Above this many bins a growing signed histogram is re-binned (`_rebinned`) instead of grown by whole old-width
bins. onnxruntime grows it without a cap: after a first batch near zero (a text detector's probability map of a
photo, max 1e-7) a later batch asks for 145 million bins, which np.histogram refuses over float32 bounds, so
quantize_static itself fails there; below the cap quantscan stays ORT's bin for bin."""


def _rebinned(data: F32, old_hist: NDArray[np.int64], old_threshold: np.ndarray,
              threshold: np.ndarray) -> tuple[NDArray[np.int64], np.ndarray]:
    """`data` and the old counts over [-threshold, threshold] in as many bins as before: each old bin's count
    lands in the new bin holding its centre (the old bins are far narrower than the new ones)."""
    bins = len(old_hist)
    hist, edges = _symmetric_histogram(data, bins, threshold)
    old_edges = np.linspace(-float(old_threshold), float(old_threshold), bins + 1)
    centres = (old_edges[:-1] + old_edges[1:]) / 2
    moved, _ = np.histogram(centres, bins, range=(-float(threshold), float(threshold)), weights=old_hist)
    return hist + np.rint(moved).astype(np.int64), edges


def _rebinned_abs(absolute: F32, old_hist: NDArray[np.int64], old_edges: np.ndarray,
                  amax: np.floating[Any]) -> tuple[NDArray[np.int64], np.ndarray]:
    """|x| and the old counts over [first edge, amax] in as many bins as before (each old bin's count in the new bin
    holding its centre): the capped counterpart of `_AbsHistogram`'s growth by whole old-width bins."""
    edges = np.linspace(float(old_edges[0]), float(amax), len(old_hist) + 1)
    hist, _ = np.histogram(absolute, bins=edges)
    centres = (old_edges[:-1].astype(np.float64) + old_edges[1:]) / 2
    moved, _ = np.histogram(centres, bins=edges, weights=old_hist)
    return hist + np.rint(moved).astype(np.int64), edges


class _SignedHistogram:
    """onnxruntime's ``HistogramCollector.collect_value``/``merge_histogram``, for one tensor.

    Bins cover [-T, T] with T the largest |value| seen. When a batch exceeds T the histogram grows by
    whole old-width bins on both sides, so earlier counts are kept exactly and the pass stays streaming.
    """

    def __init__(self, num_bins: int) -> None:
        self.num_bins = num_bins
        self.hist: NDArray[np.int64] | None = None
        self.edges: np.ndarray = np.zeros(0, dtype=np.float32)
        self.min = np.float32(0.0)
        self.max = np.float32(0.0)
        self.threshold: np.ndarray = np.array(0.0, dtype=np.float32)

    def update(self, data: F32) -> None:
        min_value, max_value = data.min(), data.max()
        threshold: np.ndarray = np.array(max(abs(min_value), abs(max_value)), dtype=data.dtype)
        if self.hist is None:
            self.hist, self.edges = _symmetric_histogram(data, self.num_bins, threshold)
            self.min, self.max, self.threshold = min_value, max_value, threshold
            return
        self.min, self.max = min(self.min, min_value), max(self.max, max_value)
        old_hist, old_threshold = self.hist, self.threshold
        if threshold <= old_threshold:
            new_hist, _ = _symmetric_histogram(data, len(old_hist), old_threshold)
            self.hist = new_hist + old_hist
            return
        if old_threshold == 0:
            hist, self.edges = _symmetric_histogram(data, len(old_hist), threshold)
            hist += old_hist
        else:
            old_num_bins = len(old_hist)
            old_stride: np.ndarray = 2 * old_threshold / old_num_bins  # float32 arithmetic, as in ORT
            half_increased_bins = int((threshold - old_threshold) // old_stride + 1)
            new_num_bins = old_num_bins + 2 * half_increased_bins
            if new_num_bins > MAX_HISTOGRAM_BINS:
                hist, self.edges = _rebinned(data, old_hist, old_threshold, threshold)
            else:
                threshold = half_increased_bins * old_stride + old_threshold
                hist, self.edges = _symmetric_histogram(data, new_num_bins, threshold)
                hist[half_increased_bins : new_num_bins - half_increased_bins] += old_hist
        self.hist, self.threshold = hist, threshold


class _AbsHistogram:
    """onnxruntime's ``HistogramCollector.collect_absolute_value``, for one tensor.

    Histogram of |x|. The first batch fixes the bin width over [min|x|, max|x|]; later batches append
    bins of that width when they exceed the last edge. Faithful to ORT including its quirk that values
    below the first batch's smallest |x| are not binned (negligible for real activations, where that
    minimum is ~0).
    """

    def __init__(self, num_bins: int) -> None:
        self.num_bins = num_bins
        self.hist: NDArray[np.int64] | None = None
        self.edges: np.ndarray = np.zeros(0, dtype=np.float32)
        self.min = np.float32(0.0)
        self.max = np.float32(0.0)

    def update(self, data: F32) -> None:
        min_value, max_value = data.min(), data.max()
        absolute = np.absolute(data)
        if self.hist is None:
            self.hist, edges = np.histogram(absolute, bins=self.num_bins)
            self.edges = edges.astype(absolute.dtype)
            self.min, self.max = min_value, max_value
            return
        edges = self.edges
        amax = absolute.max()
        width = edges[1] - edges[0]
        if amax > edges[-1] and (amax - edges[-1]) / width > MAX_HISTOGRAM_BINS:  # ORT would ask for billions of bins
            hist, new_edges = _rebinned_abs(absolute, self.hist, edges, amax)
        else:
            if amax > edges[-1]:
                edges = np.hstack((edges, np.arange(edges[-1] + width, amax + width, width)))
            hist, new_edges = np.histogram(absolute, bins=edges)
            hist[: len(self.hist)] += self.hist
        self.hist, self.edges = hist, new_edges.astype(absolute.dtype)
        self.min, self.max = min(self.min, min_value), max(self.max, max_value)


class _HistogramObserver:
    """Shared streaming front end: drop non-finite values, feed the histogram."""

    def __init__(self, histogram: _SignedHistogram | _AbsHistogram) -> None:
        self._histogram = histogram
        self.nonfinite = 0

    def update(self, x: np.ndarray) -> None:
        data, dropped = _finite_flat(x)
        self.nonfinite += dropped
        if data.size:
            self._histogram.update(data)

    @property
    def seen(self) -> bool:
        return self._histogram.hist is not None


class PercentileObserver(_HistogramObserver):
    """Percentile range as onnxruntime's HistogramCollector computes it.

    Histogram: of |x| when ``symmetric`` (range (-t, t) with t the ``percentile`` of |x|), of signed x
    otherwise (cutting (100 - percentile)/2 % from each tail). Either bound is then clamped to the
    observed min/max, so a symmetric range over a ReLU output comes back as (0, t), as in ORT.
    """

    def __init__(self, percentile: float = 99.999, symmetric: bool = False, num_bins: int = 2048) -> None:
        if not 0 <= percentile <= 100:
            raise ValueError(f"percentile must be in [0, 100], got {percentile}")
        self.percentile = percentile
        self.symmetric = symmetric
        super().__init__(_AbsHistogram(num_bins) if symmetric else _SignedHistogram(num_bins))

    def range(self) -> tuple[float, float]:
        h = self._histogram
        if h.hist is None:
            return 0.0, 0.0
        cdf = np.cumsum(h.hist / h.hist.sum())
        if self.symmetric:
            right = h.edges[np.searchsorted(cdf, self.percentile / 100.0)]
            lo, hi = -right, right
        else:
            cut = (100.0 - self.percentile) / 200.0
            lo = h.edges[np.searchsorted(cdf, cut)]
            hi = h.edges[np.searchsorted(cdf, 1.0 - cut)]
        return float(max(lo, h.min)), float(min(hi, h.max))


def _smooth(p: np.ndarray, eps: float = 0.0001) -> F32 | None:
    """onnxruntime's ``smooth_distribution`` (float32): move eps mass onto the empty bins."""
    is_zeros = (p == 0).astype(np.float32)
    is_nonzeros = (p != 0).astype(np.float32)
    n_zeros = is_zeros.sum()
    n_nonzeros = p.size - n_zeros
    if not n_nonzeros:
        return None
    eps1 = eps * float(n_zeros) / float(n_nonzeros)
    hist = p.astype(np.float32)
    hist += eps * is_zeros + (-eps1) * is_nonzeros
    return hist


def _kl_divergence(p: F32, q: F32) -> float:
    """onnxruntime's float32 ``entropy(p, q)``; kept in float32 so the argmin picks ORT's threshold."""
    pk = p / np.sum(p, axis=0, keepdims=True)
    qk = q / np.sum(q, axis=0, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        vec = pk * np.log(pk / qk)
    vec[(pk == 0) & (qk >= 0)] = 0
    vec[~((pk > 0) & (qk > 0))] = np.inf
    return float(np.sum(vec, axis=0))


def _entropy_candidate(
    hist: NDArray[np.int64], cum: NDArray[np.int64], start: int, end: int, nq: int
) -> float:
    """KL(p || q) for one candidate window [start, end) of the histogram (ORT's loop body, vectorised)."""
    sliced = hist[start:end]
    p = sliced.copy()
    p[0] += cum[start]
    p[-1] += cum[-1] - cum[end]
    merged = sliced.size // nq
    body = nq * merged
    quantized = sliced[:body].reshape(nq, merged).sum(axis=1)
    quantized[-1] += sliced[body:].sum()
    norm = (p[:body] != 0).reshape(nq, merged).sum(axis=1)
    expanded = np.where(norm != 0, quantized // np.maximum(norm, 1), 0)  # ORT truncates into int64
    q = np.zeros(p.size, dtype=np.int64)
    q[:body] = np.repeat(expanded, merged)
    ps, qs = _smooth(p), _smooth(q)
    if ps is None or qs is None:
        return math.inf
    return _kl_divergence(ps, qs)


class EntropyObserver(_HistogramObserver):
    """KL-divergence (TensorRT-style entropy) range, as onnxruntime's HistogramCollector computes it.

    Histogram of signed values over [-T, T] whatever ``symmetric`` says (ORT's entropy method always
    uses ``collect_value``). Candidate windows are centred on the zero bin and grow one bin per side;
    the window whose ``num_quantized_bins``-level requantization has the smallest KL divergence from the
    clipped distribution wins, clamped to the observed min/max. ORT's own default is 128 bins, where
    the search has a single candidate; we default to 2048 so the search means something.
    """

    def __init__(self, num_bins: int = 2048, num_quantized_bins: int = 128) -> None:
        self.num_quantized_bins = num_quantized_bins
        super().__init__(_SignedHistogram(num_bins))

    def range(self) -> tuple[float, float]:
        h = self._histogram
        if h.hist is None:
            return 0.0, 0.0
        hist, edges, nq = h.hist, h.edges, self.num_quantized_bins
        num_bins = hist.size
        zero_bin, half_q = num_bins // 2, nq // 2
        if zero_bin < half_q:
            return float(h.min), float(h.max)
        cum = np.concatenate(([0], np.cumsum(hist)))
        windows = [(zero_bin - i, min(zero_bin + i + 1, num_bins)) for i in range(half_q, zero_bin + 1)]
        divergences = [_entropy_candidate(hist, cum, start, end, nq) for start, end in windows]
        start, end = windows[int(np.argmin(divergences))]  # first minimum, as ORT's np.argmin
        lo, hi = edges[start], edges[end]
        return float(max(lo, h.min)), float(min(hi, h.max))


class MseObserver(_HistogramObserver):
    """Range minimising the expected fake-quant MSE of the histogram (no ORT equivalent).

    Candidates shrink the observed range (widened to include 0) by α = k/K, k = 1..K, on both ends:
    (α·min, α·max) for the asymmetric uint8 scheme, ±α·absmax for the symmetric int8 one. Each is
    scored by fake-quantizing the bin centres with :func:`activation_qparams`' parameters, weighted by
    the bin counts; the smallest error wins (ties go to the wider range, so clean data is not clipped).
    """

    def __init__(self, symmetric: bool = False, num_bins: int = 2048, num_candidates: int = 256) -> None:
        self.symmetric = symmetric
        self.scheme = "int8" if symmetric else "uint8"
        self.num_candidates = num_candidates
        super().__init__(_SignedHistogram(num_bins))

    def candidate_ranges(self) -> list[tuple[float, float]]:
        """The ranges :meth:`range` chooses from, narrowest first."""
        h = self._histogram
        lo, hi = min(float(h.min), 0.0), max(float(h.max), 0.0)
        if self.symmetric:
            hi = max(-lo, hi)
            lo = -hi
        alphas = np.arange(1, self.num_candidates + 1, dtype=np.float64) / self.num_candidates
        return [(float(a * lo), float(a * hi)) for a in alphas]

    def expected_mse(self, candidates: list[tuple[float, float]]) -> F64:
        """Histogram-weighted fake-quant MSE of each candidate range."""
        h = self._histogram
        if h.hist is None:
            return np.zeros(len(candidates))
        edges = h.edges.astype(np.float64)
        centres = (edges[:-1] + edges[1:]) / 2
        counts = h.hist.astype(np.float64)
        used = counts > 0
        centres, counts = centres[used], counts[used]
        params = [activation_qparams(lo, hi, self.scheme) for lo, hi in candidates]
        scale = np.array([float(p.scale) for p in params])[:, None]
        zp = np.array([float(p.zero_point) for p in params])[:, None]
        qmin, qmax = params[0].qmin, params[0].qmax
        fq = (np.clip(np.rint(centres / scale) + zp, qmin, qmax) - zp) * scale
        return np.asarray(((fq - centres) ** 2 * counts).sum(axis=1) / counts.sum(), dtype=np.float64)

    def range(self) -> tuple[float, float]:
        if not self.seen:
            return 0.0, 0.0
        candidates = self.candidate_ranges()
        if candidates[-1] == (0.0, 0.0):
            return 0.0, 0.0
        mse = self.expected_mse(candidates)
        best = int(len(mse) - 1 - np.argmin(mse[::-1]))  # last minimum = widest range
        return candidates[best]


class ChannelRangeObserver:
    """Running per-channel min/max of an activation: spread and dead channels for the report.

    A per-tensor scale serves every channel, so a channel whose range is 100x smaller than the widest
    one is quantized with ~7 bits fewer; ``spread`` measures that. The channel axis comes from the
    caller (see ``metrics.channel_axis``).
    """

    def __init__(self, axis: int) -> None:
        self.axis = axis
        self.nonfinite = 0
        self._min: F64 | None = None
        self._max: F64 | None = None

    def update(self, x: np.ndarray) -> None:
        arr = np.asarray(x, dtype=np.float64)
        axis = _normalize_axis(self.axis, arr.ndim)
        others = tuple(i for i in range(arr.ndim) if i != axis)
        ok = np.isfinite(arr)
        self.nonfinite += int(arr.size - np.count_nonzero(ok))
        mins = np.where(ok, arr, np.inf).min(axis=others, initial=np.inf)
        maxs = np.where(ok, arr, -np.inf).max(axis=others, initial=-np.inf)
        if self._min is None or self._max is None:
            self._min, self._max = mins, maxs
            return
        if mins.shape != self._min.shape:
            raise ValueError(f"channel count changed from {self._min.size} to {mins.size}")
        self._min = np.minimum(self._min, mins)
        self._max = np.maximum(self._max, maxs)

    def merge(self, other: ChannelRangeObserver) -> None:
        """Add another shard's per-channel ranges (`--workers`): minimum and maximum, so exact."""
        self.nonfinite += other.nonfinite
        if other._min is None or other._max is None:
            return
        if self._min is None or self._max is None:
            self._min, self._max = other._min.copy(), other._max.copy()
            return
        self._min = np.minimum(self._min, other._min)
        self._max = np.maximum(self._max, other._max)

    def ranges(self) -> tuple[F64, F64]:
        """Per-channel (min, max); NaN for a channel that never had a finite value."""
        if self._min is None or self._max is None:
            empty = np.zeros(0, dtype=np.float64)
            return empty, empty
        seen = self._min <= self._max
        return np.where(seen, self._min, np.nan), np.where(seen, self._max, np.nan)

    def widths(self) -> F64:
        """max - min per channel (0 for constant or never-seen channels)."""
        lo, hi = self.ranges()
        return np.nan_to_num(hi - lo, nan=0.0)

    def spread(self) -> float:
        """max/min over the non-zero channel widths; 1.0 when fewer than two channels are non-zero."""
        live = self.widths()
        live = live[live > 0]
        if live.size < 2:
            return 1.0
        return float(live.max() / live.min())

    def dead(self) -> int:
        """Channels whose range is zero (always the same value, typically a ReLU that never fires)."""
        return int(np.count_nonzero(self.widths() == 0))


def make_observer(
    method: str,
    *,
    symmetric: bool = False,
    percentile: float = 99.999,
    num_bins: int = 2048,
    num_quantized_bins: int = 128,
) -> Observer:
    """The observer for a ``--calib-method`` value: minmax, percentile, entropy or mse."""
    if method == "minmax":
        return MinMaxObserver(symmetric=symmetric)
    if method == "percentile":
        return PercentileObserver(percentile=percentile, symmetric=symmetric, num_bins=num_bins)
    if method == "entropy":
        return EntropyObserver(num_bins=num_bins, num_quantized_bins=num_quantized_bins)
    if method == "mse":
        return MseObserver(symmetric=symmetric, num_bins=num_bins)
    raise ValueError(f"unknown calibration method {method!r}; expected minmax, percentile, entropy or mse")
