"""Dump tensors to ONNX tensors: by name (the vendor renaming rules), else by value; layout per tensor.

Why both: a runtime that keeps ONNX names (the npy format, RKNN for most layers) is matched exactly or
through `toolchains.renaming`'s renaming rules (`_int8`, `-rs_sw`, `_Conv`, ...); a name no rule explains
(a fused kernel named after one of its nodes' outputs, a runtime's own numbering) is matched by value:
the FP32 tensor of the same size, in a layout that fits, with the highest cosine on the first sample
(a "golden" match), at least `GOLDEN_MIN`. An exact name match is never overruled by value: a device
that really departs has low cosine exactly where it matters. A match through a renaming rule says where
a layer came from, not that it holds the same values (RKNN names the op it moved above a Reshape after
that Reshape's input, `_sw`), so one whose cosine is below `RENAMED_MIN` goes to the FP32 tensor its
values match (at least `GOLDEN_MIN`) when there is one, is left out when it holds its tensor's values in
an order no layout explains (`reordered`), and otherwise stays: a faulty layer matches no other tensor.

Layouts: `same` (equal shapes up to size-1 dims), `nhwc` (a 4-D NCHW tensor dumped channels-last),
`permA,B,..` (the dump's non-1 dims in another order: RKNN's `_tp`/`_rs` copies of [B,T,C] tensors), `flat`
(equal size, no shape in common: kept only when its values match). Where several layouts fit (C == H == W,
a transposed square) the values decide.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from quantscan.errors import UsageError
from quantscan.toolchains.renaming import NameMapper

GOLDEN_MIN = 0.9
"""Lowest FP32 cosine at which a dump tensor with an unknown name is taken for an FP32 tensor."""
RENAMED_MIN = 0.5
"""Lowest FP32 cosine at which a tensor found through a renaming rule is taken for that tensor (see `align`)."""
REORDERED_DB = 20.0
"""Sorted-value SQNR above which a dump is taken for the same values in an unknown order (`reordered`)."""
_TIE = 1e-6
_MAX_PERMUTED = 4
"""Dumps with up to this many non-1 dims are tried in every axis order (24 at most)."""


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
    dump, ref = _squeezed(dump_shape), _squeezed(ref_shape)
    out = []
    if dump == ref:
        out.append("same")
    if len(ref_shape) == 4:
        n, c, h, w = ref_shape
        if c > 1 and h * w > 1 and dump == _squeezed((n, h, w, c)):
            out.append("nhwc")
    if len(dump) <= _MAX_PERMUTED:
        for perm in itertools.permutations(range(len(dump))):
            if perm != tuple(range(len(dump))) and tuple(dump[i] for i in perm) == ref:
                name = "perm" + ",".join(map(str, perm))
                if not ("nhwc" in out and perm == _nhwc_perm(ref_shape)):
                    out.append(name)
    return out or ["flat"]


def _nhwc_perm(ref_shape: tuple[int, ...]) -> tuple[int, ...]:
    """`nhwc` as an order of the non-1 dims (listed once, under its familiar name)."""
    sizes = dict(zip("nchw", ref_shape, strict=True))
    dump = [d for d in "nhwc" if sizes[d] != 1]
    return tuple(dump.index(d) for d in "nchw" if sizes[d] != 1)


def to_reference(array: np.ndarray, layout: str, ref_shape: tuple[int, ...]) -> np.ndarray:
    """The dump array in the ONNX tensor's shape and layout."""
    if "|" in layout:  # a head-split channel order on top of a plain layout (`head_split`)
        base, split = layout.split("|", 1)
        return _unsplit(to_reference(array, base, ref_shape), split)
    if layout == "nhwc":
        n, c, h, w = ref_shape
        return np.ascontiguousarray(array.reshape(n, h, w, c).transpose(0, 3, 1, 2))
    if layout.startswith("perm"):
        perm = tuple(int(i) for i in layout[len("perm"):].split(","))
        squeezed = array.reshape(_squeezed(array.shape))
        return np.ascontiguousarray(squeezed.transpose(perm)).reshape(ref_shape)
    return array.reshape(ref_shape)


def head_split(array: np.ndarray, ref: np.ndarray) -> tuple[str, float] | None:
    """The best layout in which `array` holds `ref` with its last axis dumped in a head-split order.

    Why: RKNN dumps an attention block's QKV projection ([B, T, 3·H·D], reshaped to [B, T, 3, H, D] by
    the graph) with the channel axis in (H, D, 3) order, which no order of the dump's dims undoes. The
    candidates split the last axis into (3, H, D) for every H·D that divides it, in every order of the
    three; the best one is kept only when its cosine reaches GOLDEN_MIN, so a fault still shows. Tried
    only for a dump that holds its tensor's values in another order (`reordered`)."""
    channels = int(ref.shape[-1]) if ref.ndim else 0
    if channels % 3 or channels < 12:
        return None
    best: tuple[float, str] | None = None
    for base in layouts(array.shape, ref.shape):
        plain = to_reference(array, base, ref.shape)
        for heads in range(2, channels // 3):
            if (channels // 3) % heads:
                continue
            for order in itertools.permutations(range(3)):
                split = f"split3,{heads},{channels // 3 // heads}:" + ",".join(map(str, order))
                cos = cosine(_unsplit(plain, split), ref)
                if best is None or cos > best[0]:
                    best = (cos, f"{base}|{split}")
    if best is None or best[0] < GOLDEN_MIN:
        return None
    return best[1], best[0]


def _unsplit(array: np.ndarray, split: str) -> np.ndarray:
    """`array` (in the reference layout but its last axis in dump order) with the last axis put back: the
    dump's channel factors are the reference's (3, H, D) in `order` (dump factor i is reference factor
    order[i])."""
    sizes_text, order_text = split[len("split"):].split(":")
    sizes = [int(s) for s in sizes_text.split(",")]
    order = [int(i) for i in order_text.split(",")]
    lead = array.shape[:-1]
    dumped = array.reshape(*lead, *[sizes[i] for i in order])
    back = [len(lead) + order.index(j) for j in range(3)]
    return np.ascontiguousarray(dumped.transpose(*range(len(lead)), *back)).reshape(array.shape)


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
    order: Iterable[str] = (), kernel_output: Mapping[str, str] | None = None,
) -> Alignment:
    """Line up the dump names of one sample (`first`) with the FP32 tensors of the same sample.

    `prefer`: tensors that win a value tie (site outputs: an Identity or Reshape copy holds the same
    values as the kernel output it copies). `order`: the dump names in execution order, where known.
    `kernel_output`: a tensor inside a fused kernel -> the kernel's output. A vendor names a fused
    kernel after an inner tensor (RKNN's `p2o.MatMul.25_mm_tp_sw` is the MatMul+Add kernel, bias added):
    a renamed match on an inner tensor moves to the kernel output (by name and shape, not by value: a
    departing device must not move between the two).
    """
    preferred = set(prefer)
    names = list(dict.fromkeys([n for n in order if n in first] + list(first)))
    by_size: dict[int, list[str]] = {}
    for tensor, value in fp32.items():
        by_size.setdefault(int(value.size), []).append(tensor)
    aligned: dict[str, Aligned] = {}
    unmatched: list[str] = []
    pending: list[str] = []
    named = {name: _by_name(name, fp32, mapper) for name in names}
    exact_first = [n for n in names if named[n][1] == "name"] + [n for n in names if named[n][1] != "name"]
    for name in exact_first:  # an exact name claims its tensor before any renamed layer can
        tensor, how = named[name]
        if not tensor:
            pending.append(name)
            continue
        outer = (kernel_output or {}).get(tensor, "")
        if how != "name" and outer in fp32 and outer not in aligned and layouts(first[name].shape, fp32[outer].shape):
            tensor = outer
        placed = _place(name, first[name], fp32[tensor], tensor, how)
        if isinstance(placed, str):
            unmatched.append(placed)
            continue
        if how != "name" and placed[1] < RENAMED_MIN:
            other = _by_value(name, first[name], fp32, by_size.get(int(first[name].size), []), aligned, preferred)
            if isinstance(other, Aligned):  # another op's values under this name (RKNN's `_sw`)
                aligned.setdefault(other.tensor, other)
                continue
            if reordered(first[name], fp32[tensor]):
                split = head_split(first[name], fp32[tensor])
                if split is None:
                    unmatched.append(f"{name}: holds the values of {tensor} in an order no layout explains "
                                     f"(cosine {placed[1]:.3f}; sorted, they agree)")
                    continue
                placed = (Aligned(name, tensor, split[0], how), split[1])
        current = aligned.get(tensor)
        if current is None or (current.how != "name" and how == "name"):
            aligned[tensor] = placed[0]
    for name in pending:
        found = _by_value(name, first[name], fp32, by_size.get(int(first[name].size), []), aligned, preferred)
        if isinstance(found, Aligned):
            aligned[found.tensor] = found
        else:
            unmatched.append(f"{name}: {found}")
    return Alignment(aligned, unmatched)


def reordered(array: np.ndarray, ref: np.ndarray) -> bool:
    """Whether `array` holds `ref`'s values in another order: their sorted values agree within
    REORDERED_DB SQNR. Sorting forgives a layout we cannot undo (RKNN's head-split QKV projections) and
    rounding, not a fault: a scale, an offset or a zeroed channel changes the sorted values too."""
    x = np.sort(ref.astype(np.float64).ravel())
    y = np.sort(array.astype(np.float64).ravel())
    noise = float(np.square(x - y).sum())
    return noise == 0.0 or 10.0 * np.log10(max(float(np.square(x).sum()), 1e-300) / noise) >= REORDERED_DB


def _place(name: str, array: np.ndarray, ref: np.ndarray, tensor: str, how: str) -> tuple[Aligned, float] | str:
    """The dump in the layout that fits `ref` (by value when several do) and its cosine there; why not,
    when none fits. An exact name in no layout is bad input: the dump says it is that tensor."""
    options = layouts(array.shape, ref.shape)
    if not options and how == "name":
        raise UsageError(f"--dumps: expected '{name}' with the {ref.size} values of the model's tensor "
                         f"{list(ref.shape)} (NCHW, NHWC or flat), found shape {list(array.shape)}: unknown layout")
    if not options:
        return f"{name}: shape {list(array.shape)} does not fit {tensor} {list(ref.shape)} in any layout"
    layout, cos = _best_layout(array, ref, options)
    return Aligned(name, tensor, layout, how), cos


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
