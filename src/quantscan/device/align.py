"""Dump tensors to ONNX tensors: by name (the vendor renaming rules), else by value; layout per tensor.

Why both: a runtime that keeps ONNX names (the npy format, RKNN for most layers) is matched exactly or
through `vendorlog.mapping`'s renaming rules (`_int8`, `-rs_sw`, `_Conv`, ...); a name no rule explains
(a fused kernel named after one of its nodes' outputs, a runtime's own numbering) is matched by value:
the FP32 tensor of the same size, in a layout that fits, with the highest cosine on the first sample
(a "golden" match), at least `GOLDEN_MIN`. A name match is never overruled by value: a device that
really departs has low cosine exactly where it matters.

Layouts: `same` (equal shapes up to size-1 dims), `nhwc` (a 4-D NCHW tensor dumped channels-last), `flat`
(equal size, no shape in common: kept only when its values match). Equal sizes with several layouts that
fit (C == H == W) are decided by value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from quantscan.errors import UsageError
from quantscan.vendorlog.mapping import NameMapper

GOLDEN_MIN = 0.9
"""Lowest FP32 cosine at which a dump tensor with an unknown name is taken for an FP32 tensor."""
_TIE = 1e-6


@dataclass(frozen=True)
class Aligned:
    """One dump tensor lined up: the ONNX tensor it holds, its layout, how it was found."""

    dump: str
    tensor: str
    layout: str
    how: str
    """"name", "name; <renaming rules>" or "value (cosine 0.998)"."""


@dataclass
class Alignment:
    """The aligned dump tensors (one per ONNX tensor) and the dump names that matched nothing."""

    aligned: dict[str, Aligned]
    """ONNX tensor -> its dump."""
    unmatched: list[str]
    """Dump names with neither a name nor a value match (with the reason after ': ')."""


def _squeezed(shape: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape if d != 1)


def layouts(dump_shape: tuple[int, ...], ref_shape: tuple[int, ...]) -> list[str]:
    """The layouts in which a dump of `dump_shape` can hold a tensor of `ref_shape` (see module doc)."""
    if int(np.prod(dump_shape)) != int(np.prod(ref_shape)):
        return []
    out = []
    if _squeezed(dump_shape) == _squeezed(ref_shape):
        out.append("same")
    if len(ref_shape) == 4:
        n, c, h, w = ref_shape
        if c > 1 and h * w > 1 and _squeezed(dump_shape) == _squeezed((n, h, w, c)):
            out.append("nhwc")
    return out or ["flat"]


def to_reference(array: np.ndarray, layout: str, ref_shape: tuple[int, ...]) -> np.ndarray:
    """The dump array in the ONNX tensor's shape and layout."""
    if layout == "nhwc":
        n, c, h, w = ref_shape
        return np.ascontiguousarray(array.reshape(n, h, w, c).transpose(0, 3, 1, 2))
    return array.reshape(ref_shape)


def cosine(x: np.ndarray, y: np.ndarray) -> float:
    """The contract's cosine on two equally shaped arrays (1 when both are zero, 0 when one is)."""
    a, b = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    na, nb = float(a @ a), float(b @ b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b) / float(np.sqrt(na * nb))


def _best_layout(array: np.ndarray, ref: np.ndarray, options: list[str]) -> tuple[str, float]:
    scored = [(cosine(to_reference(array, lay, ref.shape), ref), lay) for lay in options]
    best = max(scored)
    return best[1], best[0]


def _by_name(name: str, fp32: Mapping[str, np.ndarray], mapper: NameMapper) -> tuple[str, str]:
    """(ONNX tensor, how) for a dump name, ("", "") when neither it nor a renaming names a tensor."""
    if name in fp32:
        return name, "name"
    match = mapper.match(name)
    if not match.mapped:
        return "", ""
    rules = match.mapped_by.split("; ", 1)[1] if "; " in match.mapped_by else ""
    how = "name" + (f"; {rules}" if rules else "")
    if match.tensor in fp32:
        return match.tensor, how
    if match.node:
        index = mapper.index
        position = mapper.node_at.get(match.node)
        outputs = [o for o in index.nodes[position].output if o] if position is not None else []
        if outputs and outputs[0] in fp32:
            return outputs[0], how
    return "", ""


def align(
    first: Mapping[str, np.ndarray], fp32: Mapping[str, np.ndarray], mapper: NameMapper, prefer: Iterable[str] = (),
    order: Iterable[str] = (),
) -> Alignment:
    """Line up the dump names of one sample (`first`) with the FP32 tensors of the same sample.

    `prefer`: tensors that win a value tie (site outputs: an Identity or Reshape copy holds the same
    values as the kernel output it copies). `order`: the dump names in execution order, where known.
    """
    preferred = set(prefer)
    names = list(dict.fromkeys([n for n in order if n in first] + list(first)))
    aligned: dict[str, Aligned] = {}
    unmatched: list[str] = []
    pending: list[str] = []
    for name in names:
        tensor, how = _by_name(name, fp32, mapper)
        if not tensor:
            pending.append(name)
            continue
        options = layouts(first[name].shape, fp32[tensor].shape)
        if not options and how == "name":
            raise UsageError(f"--dumps: expected '{name}' with the {fp32[tensor].size} values of the model's tensor "
                             f"{list(fp32[tensor].shape)} (NCHW, NHWC or flat), found shape {list(first[name].shape)}: "
                             f"unknown layout")
        if not options:
            unmatched.append(f"{name}: shape {list(first[name].shape)} does not fit {tensor} "
                             f"{list(fp32[tensor].shape)} in any layout")
            continue
        layout = options[0] if len(options) == 1 else _best_layout(first[name], fp32[tensor], options)[0]
        current = aligned.get(tensor)
        if current is None or (current.how != "name" and how == "name"):
            aligned[tensor] = Aligned(name, tensor, layout, how)
    by_size: dict[int, list[str]] = {}
    for tensor, value in fp32.items():
        by_size.setdefault(int(value.size), []).append(tensor)
    for name in pending:
        found = _by_value(name, first[name], fp32, by_size.get(int(first[name].size), []), aligned, preferred)
        if isinstance(found, Aligned):
            aligned[found.tensor] = found
        else:
            unmatched.append(f"{name}: {found}")
    return Alignment(aligned, unmatched)


def _by_value(
    name: str, array: np.ndarray, fp32: Mapping[str, np.ndarray], candidates: list[str],
    taken: Mapping[str, Aligned], preferred: set[str],
) -> Aligned | str:
    """The free FP32 tensor this dump's values match best, or why none does."""
    best: tuple[float, bool, str, str] | None = None
    for tensor in candidates:
        if tensor in taken:
            continue
        options = layouts(array.shape, fp32[tensor].shape)
        layout, cos = _best_layout(array, fp32[tensor], options)
        key = (round(cos / _TIE) * _TIE, tensor in preferred, tensor, layout)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None:
        return f"no free FP32 tensor has its {array.size} elements"
    if best[0] < GOLDEN_MIN:
        return f"no name rule applies and its best value match ({best[2]}) has cosine {best[0]:.3f} < {GOLDEN_MIN}"
    return Aligned(name, best[2], best[3], f"value (cosine {best[0]:.4f})")
