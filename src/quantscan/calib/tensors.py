"""Tensor folders: which .npy/.npz array feeds which input, split into samples and checked as read.

Why its own module: the contract's rules for tensor files (npz keys are input names, a .npy named
after an input wins, axis 0 is the sample axis) are decided from headers alone at load time; the
data is then streamed one array per input at a time, each checked for NaN/Inf and a lossless cast
as it is loaded, so memory stays flat on big sets.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from quantscan.calib.calibset import CalibSet, Sample
from quantscan.calib.checks import (
    batched_map,
    cast_checked,
    dims_fit,
    fmt,
    is_batch_axis,
    listing,
    missing_inputs_error,
)
from quantscan.calib.folder import PREPROCESS_NAME, TENSOR_SUFFIXES, other_files
from quantscan.calib.labels import labels_from_json
from quantscan.calib.npyfile import load_array, memory_budget, npy_header, npz_headers
from quantscan.errors import CalibrationError
from quantscan.readers.arrays import array_bytes
from quantscan.specs import InputSpec, Warnings

_CHECK_CHUNK = 1 << 20
"""Elements per chunk when scanning an array for NaN/Inf and castability (bounded temporaries)."""


@dataclass(frozen=True)
class _Segment:
    """The part of one input's sample stream that one array (a .npy, or an .npz key) provides."""

    path: Path
    key: str | None
    mode: str  # "split": arr[i:i+1]; "single": arr[None]; "whole": arr; "stack": arr[i]
    count: int
    sample_shape: tuple[int, ...]
    itemsize: int = 1

    @property
    def where(self) -> str:
        return f"{self.path}" if self.key is None else f"{self.path} (key '{self.key}')"


def load_tensors(
    folder: Path,
    files: list[Path],
    specs: Mapping[str, InputSpec],
    consts: dict[str, np.ndarray],
    limit: int | None,
    warnings: Warnings,
) -> CalibSet:
    """A tensor folder as a lazy `CalibSet`: arrays planned from headers, data read when iterated."""
    streams = _plan_streams(folder, files, specs, consts, warnings)
    total = _common_count(streams)
    n = total if limit is None else min(total, limit)
    _refuse_over_budget(streams, n, memory_budget())
    used = _files_used(streams, n)
    shapes = {name: segs[0].sample_shape for name, segs in streams.items()}
    shapes |= {name: tuple(a.shape) for name, a in consts.items()}
    ordered = {name: streams[name] for name in specs if name in streams}
    label_names, labels = _file_labels(folder, used, n)

    def read(count: int, start: int) -> Iterator[tuple[Sample, Path]]:
        return islice(_read_streams(ordered, specs, count), start, None)

    return CalibSet(
        source=folder,
        kind="tensors",
        files=used,
        n_samples=n,
        warnings=warnings.messages,
        labels=labels,
        label_names=label_names,
        _shapes=shapes,
        _batched=batched_map(specs),
        _consts=consts,
        _read=read,
        preprocessing={
            name: {"kind": "tensors", "dtype": str(specs[name].dtype), "sample_shape": list(shapes[name]),
                   "applied": "none: arrays fed as stored, cast to the input's dtype"}
            for name in ordered
        } | {name: {"kind": "const", "value_shape": list(a.shape)} for name, a in consts.items()},
    )


def _file_labels(folder: Path, used: list[Path], n: int) -> tuple[list[str] | None, list[int | None] | None]:
    """labels.json beside a folder of one file per sample (`{"classes": [...], "files": {NAME: LABEL}}`):
    what a sample's true answer is when it is not an image's class, e.g. a language model step's true
    next token (`--task lm`). None when there is no such file or files do not map one to one to samples."""
    found = labels_from_json(folder, [p.name for p in used]) if len(used) == n else None
    return (None, None) if found is None else (found[0], found[1])


def _plan_streams(
    folder: Path,
    files: list[Path],
    specs: Mapping[str, InputSpec],
    consts: Mapping[str, np.ndarray],
    warnings: Warnings,
) -> dict[str, list[_Segment]]:
    """Decide which array feeds which input (the contract's .npz/.npy rules), reading headers only."""
    wanted = [n for n in specs if n not in consts]
    streams: dict[str, list[_Segment]] = {n: [] for n in wanted}
    npz = [p for p in files if p.suffix.lower() == ".npz"]
    npy = [p for p in files if p.suffix.lower() == ".npy"]
    for p in other_files(files, TENSOR_SUFFIXES):
        warnings.add(f"ignored {p} (not a .npy/.npz file)")
    for p in npz:
        _plan_npz(p, specs, consts, streams, warnings)
    _plan_npy(npy, specs, consts, streams, warnings)
    if not any(streams.values()):
        found = listing([p.name for p in files if p.name != PREPROCESS_NAME])
        raise CalibrationError(
            f"nothing in {folder} matches a model input: expected .npz keys or .npy files named after "
            f"{', '.join(wanted) or '(every input is a --const)'}, found {found}"
        )
    missing = [name for name, segs in streams.items() if not segs]
    if missing:
        raise missing_inputs_error(missing, folder, "NAME.npy or an .npz key 'NAME'")
    return streams


def _plan_npz(
    path: Path,
    specs: Mapping[str, InputSpec],
    consts: Mapping[str, np.ndarray],
    streams: dict[str, list[_Segment]],
    warnings: Warnings,
) -> None:
    headers = npz_headers(path)
    unused = [k for k in headers if k not in streams]
    if not set(headers) & set(streams):
        warnings.add(f"ignored {path}: its keys ({', '.join(headers) or 'none'}) match no input needing data")
        return
    for key in unused:
        why = "a --const is given for it" if key in consts else "no such input"
        warnings.add(f"ignored key '{key}' of {path} ({why})")
    counts: set[int] = set()
    for key, (shape, dtype) in headers.items():
        if key in streams:
            seg = _segment(path, key, shape, dtype, specs[key])
            streams[key].append(seg)
            counts.add(seg.count)
    if len(counts) > 1:
        raise CalibrationError(
            f"{path}: expected the same number of samples under every key, found {sorted(counts)}"
        )


def _plan_npy(
    npy: list[Path],
    specs: Mapping[str, InputSpec],
    consts: Mapping[str, np.ndarray],
    streams: dict[str, list[_Segment]],
    warnings: Warnings,
) -> None:
    named = [p for p in npy if p.stem in streams]
    if named:
        for p in npy:
            if p.stem in streams:
                streams[p.stem].append(_npy_segment(p, specs[p.stem]))
            else:
                why = "a --const is given for it" if p.stem in consts else "its name matches no input"
                warnings.add(f"ignored {p} ({why}; {', '.join(q.name for q in named)} feed inputs by name)")
        return
    if not npy:
        return
    left = [n for n, segs in streams.items() if not segs]
    if len(left) == 1:
        for p in npy:
            streams[left[0]].append(_npy_segment(p, specs[left[0]]))
    elif not left:
        for p in npy:
            warnings.add(f"ignored {p} (every input already has data)")
    else:
        raise CalibrationError(
            f"cannot tell which of inputs {', '.join(left)} the .npy files feed: expected files named after "
            f"an input (e.g. {left[0]}.npy), found {listing([p.name for p in npy])}"
        )


def _npy_segment(path: Path, spec: InputSpec) -> _Segment:
    shape, dtype = npy_header(path)
    return _segment(path, None, shape, dtype, spec)


def _segment(
    path: Path, key: str | None, shape: tuple[int, ...], dtype: np.dtype, spec: InputSpec
) -> _Segment:
    """Check an array's dtype and shape against the input and decide how it splits into samples."""
    where = f"{path}" if key is None else f"{path} (key '{key}')"
    if dtype.kind not in "biuf" or spec.dtype.kind not in "biuf":
        raise CalibrationError(f"{where}: input '{spec.name}' takes {spec.dtype}, found {dtype} data")
    decl = spec.shape
    batched = is_batch_axis(decl)
    r = len(decl)
    if batched and len(shape) == r and shape[0] >= 1 and dims_fit(shape[1:], decl[1:]):
        return _Segment(path, key, "split", shape[0], (1, *shape[1:]), dtype.itemsize)
    if batched and len(shape) == r - 1 and dims_fit(shape, decl[1:]):
        return _Segment(path, key, "single", 1, (1, *shape), dtype.itemsize)
    if not batched and len(shape) == r and dims_fit(shape, decl):
        return _Segment(path, key, "whole", 1, shape, dtype.itemsize)
    if not batched and len(shape) == r + 1 and shape[0] >= 1 and dims_fit(shape[1:], decl):
        return _Segment(path, key, "stack", shape[0], shape[1:], dtype.itemsize)
    expected = fmt(["N", *decl[1:]]) if batched else fmt(decl)
    raise CalibrationError(
        f"{where}: input '{spec.name}' expects shape {expected} (declared {fmt(decl)}), found {fmt(shape)}"
    )


def _common_count(streams: Mapping[str, list[_Segment]]) -> int:
    counts = {name: sum(s.count for s in segs) for name, segs in streams.items()}
    if len(set(counts.values())) > 1:
        found = ", ".join(f"'{n}' {c}" for n, c in counts.items())
        raise CalibrationError(f"expected the same number of samples for every input, found {found}")
    total = next(iter(counts.values()))
    if total == 0:
        raise CalibrationError(
            f"expected at least one sample, found empty arrays in {_streams_files(streams)}"
        )
    return total


def _loaded_rows(seg: _Segment, needed: int) -> int | None:
    """Rows of axis 0 an .npz segment is read to when `needed` of its samples are used (None: all)."""
    return min(seg.count, needed) if seg.mode in ("split", "stack") else None


def _refuse_over_budget(streams: Mapping[str, list[_Segment]], n: int, budget: int) -> None:
    """Before any data is read: an .npz array loaded whole (or to the rows the first n samples need)
    that cannot fit the memory budget is refused from its header (a .npy is memory-mapped)."""
    for segs in streams.values():
        start = 0
        for seg in segs:
            if seg.key is not None and start < n:
                rows = _loaded_rows(seg, n - start)
                per_row = array_bytes(seg.sample_shape, np.dtype("u1")) * seg.itemsize
                nbytes = per_row * (rows if rows is not None else seg.count)
                if nbytes > budget:
                    raise CalibrationError(
                        f"{seg.where}: expected an array that fits the memory budget ({budget} bytes, half the "
                        f"available RAM), found {nbytes} bytes to load for {min(n - start, seg.count)} sample(s); "
                        "split it into smaller files or use --limit")
            start += seg.count


def _streams_files(streams: Mapping[str, list[_Segment]]) -> str:
    return ", ".join(sorted({s.path.name for segs in streams.values() for s in segs}))


def _files_used(streams: Mapping[str, list[_Segment]], n: int) -> list[Path]:
    """Files contributing to the first n samples, sorted by name (the folder order)."""
    used: set[Path] = set()
    for segs in streams.values():
        start = 0
        for seg in segs:
            if start < n:
                used.add(seg.path)
            start += seg.count
    return sorted(used, key=lambda p: p.name)


def _read_streams(
    streams: Mapping[str, list[_Segment]], specs: Mapping[str, InputSpec], n: int
) -> Iterator[tuple[Sample, Path]]:
    iters = {name: _iter_stream(segs, specs[name], n) for name, segs in streams.items()}
    for _ in range(n):
        sample: Sample = {}
        path: Path | None = None
        for name, it in iters.items():
            sample[name], p = next(it)
            path = path or p
        assert path is not None
        yield sample, path


def _iter_stream(segs: list[_Segment], spec: InputSpec, n: int) -> Iterator[tuple[np.ndarray, Path]]:
    """One input's first `n` samples, loading one array at a time (memory stays at one file per input),
    each .npz array only as far as those samples reach."""
    start = 0
    for seg in segs:
        if start >= n:
            return
        rows = _loaded_rows(seg, n - start)
        arr = load_array(seg.path, seg.key, seg.where, rows=rows)
        _check_values(arr, spec, seg)
        for i in range(seg.count if rows is None else min(rows, arr.shape[0])):
            yield _take(arr, seg.mode, i).astype(spec.dtype, copy=True), seg.path
        start += seg.count
        del arr


def _take(arr: np.ndarray, mode: str, i: int) -> np.ndarray:
    if mode == "split":
        return arr[i : i + 1]
    if mode == "single":
        return arr[None]
    if mode == "stack":  # an ndarray even for a rank-0 sample: arr[i] of a 1-D array is a numpy scalar
        return np.asarray(arr[i])
    return arr


def _check_values(arr: np.ndarray, spec: InputSpec, seg: _Segment) -> None:
    """NaN/Inf and lossless-cast checks, in chunks so a memory-mapped file is never copied whole."""
    flat = arr.reshape(-1)
    samples = arr.shape[0] if seg.mode in ("split", "stack") and arr.ndim else 1
    per_sample = max(1, flat.size // max(1, samples))
    for start in range(0, flat.size, _CHECK_CHUNK):
        chunk = np.asarray(flat[start : start + _CHECK_CHUNK])
        bad = _first_nonfinite(chunk)
        if bad is not None:
            raise CalibrationError(
                f"{seg.where}: expected finite values, found NaN/Inf (sample {(start + bad) // per_sample})"
            )
        cast_checked(chunk, spec.dtype, seg.where, spec.name, CalibrationError)


def _first_nonfinite(chunk: np.ndarray) -> int | None:
    if chunk.dtype.kind != "f":
        return None
    finite = np.isfinite(chunk)
    return None if finite.all() else int(np.argmin(finite))

