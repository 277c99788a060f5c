"""Which reader opens a dump folder, and which calibration sample each dump sample is. Every reader
returns one shape (`dumpset.DumpSet`): sample keys, and per sample {dump name: float array}.

Why a common shape: the alignment and the device table should not know where a tensor came from. A
reader (one file per format) only lists the samples it holds and loads one at a time (dumps of a real
network are tens of MB per sample), already dequantized to float32 where the format carries the scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from quantscan.device import npy
from quantscan.errors import UsageError
from quantscan.toolchains import TOOLCHAINS
from quantscan.toolchains.dumpset import DumpSet
from quantscan.toolchains.folder import DumpReader

__all__ = ["DumpSet", "detect_format", "open_dumps", "sample_indices"]

NPY = DumpReader(npy.read_folder, npy.looks_like)


def readers() -> dict[str, DumpReader]:
    """Dump format -> its reader: the generic npy format, then every toolchain folder's (`TOOLCHAINS`)."""
    return {"npy": NPY, **{name: tool.dumps for name, tool in TOOLCHAINS.items() if tool.dumps is not None}}


def detect_format(folder: Path) -> str:
    """A toolchain's format when its reader recognises the folder (rknn: accuracy_analysis folders), else
    npy when the folder holds .npz files; else bad input."""
    tools = {name: reader for name, reader in readers().items() if reader is not NPY}
    for name, reader in tools.items():
        if reader.looks_like is not None and reader.looks_like(folder):
            return name
    if npy.looks_like(folder):
        return "npy"
    shapes = " or ".join(["per-sample .npz files", *(r.looks for r in tools.values() if r.looks_like is not None)])
    raise UsageError(f"--dumps: expected a folder of {shapes}, found neither in {folder}; "
                     f"say --format {'|'.join([*tools, 'npy'])}")


def open_dumps(folder: str | Path, fmt: str | None = None) -> DumpSet:
    """The reader for `fmt` (detected when None) on `folder`."""
    path = Path(folder)
    if not path.is_dir():
        raise UsageError(f"--dumps: expected a folder of dumps, found {'a file' if path.exists() else 'nothing'} "
                         f"at {path}")
    fmt = fmt or detect_format(path)
    known = readers()
    if fmt not in known:
        raise UsageError(f"--format: expected one of {', '.join(known)}, found {fmt!r}")
    return known[fmt].read(path)


def sample_indices(keys: Sequence[str], stems: Sequence[str], n_samples: int) -> list[int]:
    """Calibration sample index per dump sample: by file stem, else by index in file order (`000`, `7`).

    A dump sample that names no calibration sample is bad input: comparing it with another sample's
    FP32 tensors would report a "departure" that is only a different image."""
    by_stem = {stem: i for i, stem in enumerate(stems)}
    out = []
    for key in keys:
        if key in by_stem:
            out.append(by_stem[key])
        elif key.isdigit() and int(key) < n_samples:
            out.append(int(key))
        else:
            some = ", ".join(list(stems[:3]) + (["..."] if len(stems) > 3 else []))
            raise UsageError(f"--dumps: expected every dump sample to name a calibration sample (file stem such "
                             f"as {some or '000'}, or index 000..{n_samples - 1:03d}), found '{key}'")
    return out
