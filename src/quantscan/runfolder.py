"""The run folder: the one module that writes files and reads a run folder back.

Writes are atomic (temp file in the target folder, fsync, os.replace), so an interrupted run never
leaves half a CSV, model or session file, and an existing file is replaced only by a complete one.
JSON has one encoder here (`jsonable`: inf/NaN as strings, numpy scalars as numbers), CSV one
writer and one reader (strings stay strings: a node called "NA" is not missing), models one saver
that refuses to overwrite the user's input. Reading a run folder back (`load_run`) serves
report.html, the bundle and bisection's layers.csv merge, so every reader sees the same tables.

Top-level imports are the standard library only: the pure modules (the bisection state machine)
use the atomic writers, and `quantscan --help` must not pay for pandas. numpy/pandas/onnx are
imported where a function needs them.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantscan.errors import QuantscanError, UsageError

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import pandas as pd

SUPPORTED_FORMAT = 1
"""Highest run.json "format" this reader understands; a newer folder is refused, not misread."""

RUN_JSON = "run.json"
LAYERS_CSV = "layers.csv"


class ReportError(QuantscanError):
    """The folder is not a quantscan run, or was written by a newer quantscan (CLI: one line, exit 2)."""


# ----------------------------------------------------------------------------------------- writing


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (/proc), else set-and-restore."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same folder, then os.replace.

    mkstemp creates the temp file 0600; the result gets 0666 minus the user's umask, as `open()` would
    give it (output files shared with a team or a vendor were unreadable to them).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def refuse_foreign_overwrite(path: Path, flag: str, ours: Callable[[Path], bool], force: bool) -> None:
    """An existing file quantscan did not write is the user's: never replaced without --force."""
    if force or not path.exists():
        return
    if path.is_dir():
        raise UsageError(f"{flag}: expected a file path, found a folder at {path}")
    if not ours(path):
        raise UsageError(f"{flag}: {path} exists and was not written by quantscan; "
                         "choose another path or add --force to replace it")


def is_quantscan_zip(path: Path) -> bool:
    """A bundle quantscan wrote: a zip whose MANIFEST.json says `"tool": "quantscan"`."""
    try:
        with zipfile.ZipFile(path) as zf:
            return bool(json.loads(zf.read("MANIFEST.json")).get("tool") == "quantscan")
    except Exception:  # not a zip, no manifest, not JSON: not ours
        return False


def is_quantscan_onnx(path: Path) -> bool:
    """A model quantscan wrote (extract marks its outputs with producer_name "quantscan")."""
    import onnx

    try:
        return bool(onnx.load(str(path), load_external_data=False).producer_name == PRODUCER)
    except Exception:  # not ONNX: not ours
        return False


PRODUCER = "quantscan"


def out_inside_data(out: Path, data: Path) -> bool:
    """True when the run folder `out` is the data folder or inside it (our files would mix with the data)."""
    o, d = out.resolve(), data.resolve()
    return d.is_dir() and (o == d or d in o.parents)


def ensure_out_dir(out: Path) -> Path:
    """Create the run folder; a path that exists as a file is bad input, never overwritten."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: expected a folder, found a file at {out}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def jsonable(value: Any) -> Any:
    """JSON has no inf/NaN: write them as strings ("inf", "-inf", "nan") rather than invalid JSON.

    Also: numpy scalars and arrays become numbers and lists, paths strings, sets lists.
    """
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, int):
        return value
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalars and arrays
        return jsonable(value.tolist())
    return value


def json_text(data: Any, *, indent: int = 2) -> str:
    """The JSON form of `data` (through `jsonable`), newline-terminated; never NaN/Infinity tokens."""
    return json.dumps(jsonable(data), indent=indent, allow_nan=False) + "\n"


def write_json(path: Path, data: Any, *, indent: int = 2) -> None:
    atomic_write_text(path, json_text(data, indent=indent))


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write_text(path, frame.to_csv(index=False))


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """A compressed .npz, written atomically (numpy would otherwise write in place)."""
    import numpy as np

    buf = io.BytesIO()
    named: dict[str, Any] = dict(arrays)
    np.savez_compressed(buf, **named)
    atomic_write_bytes(path, buf.getvalue())


def save_model(model: onnx.ModelProto, path: Path, *, protect: Iterable[Path] = ()) -> Path:
    """Write a model atomically; refuse to write over a protected file (the user's input model)."""
    for p in protect:
        if path.exists() and p.exists() and path.resolve() == p.resolve():
            raise UsageError(f"expected an output path other than the input model, found {path}")
    if path.exists() and path.is_dir():
        raise UsageError(f"expected a file path for the model, found a folder at {path}")
    atomic_write_bytes(path, model.SerializeToString())
    return path


# ----------------------------------------------------------------------------------------- reading


@dataclass
class RunFiles:
    """What a run folder holds; optional parts are None when their file is absent or unreadable."""

    path: Path
    run: dict[str, Any]
    layers: pd.DataFrame
    tensors: pd.DataFrame | None
    ops: pd.DataFrame | None
    channels: pd.DataFrame | None
    hist: dict[str, np.ndarray] | None
    summary: str | None
    compat: pd.DataFrame | None
    partitions: pd.DataFrame | None
    plan: dict[str, Any] | None
    calib_advice: pd.DataFrame | None = None
    """calib_advice.csv (`scan --calib-advice`)."""


def load_run(run_dir: Path) -> RunFiles:
    """Read a run folder; raise ReportError when it is not a run or is from a newer format."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(
            f"expected a quantscan run folder (with run.json and layers.csv), found no folder at {run_dir}"
        )
    missing = [n for n in (RUN_JSON, LAYERS_CSV) if not (run_dir / n).is_file()]
    if missing:
        raise ReportError(
            "expected a quantscan run folder (with run.json and layers.csv), "
            f"found no {' or '.join(missing)} "
            f"in {run_dir}"
        )
    run = read_run_json(run_dir / RUN_JSON)
    return RunFiles(
        path=run_dir,
        run=run,
        layers=_read_table(run_dir / LAYERS_CSV, required=True),  # type: ignore[arg-type]
        tensors=_read_table(run_dir / "tensors.csv"),
        ops=_read_table(run_dir / "ops.csv"),
        channels=_read_table(run_dir / "channels.csv"),
        hist=read_hist(run_dir / "hist.npz"),
        summary=read_text(run_dir / "summary.md"),
        compat=_read_table(run_dir / "compat.csv"),
        partitions=_read_table(run_dir / "partitions.csv"),
        plan=read_plan(run_dir / "plan.json"),
        calib_advice=_read_table(run_dir / "calib_advice.csv"),
    )


def read_run_json(path: Path) -> dict[str, Any]:
    """run.json as written by quantscan (any format up to SUPPORTED_FORMAT); ReportError otherwise."""
    try:
        run = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportError(
            f"expected run.json to be JSON written by quantscan, found unreadable {path} ({exc})"
        ) from None
    if not isinstance(run, dict) or run.get("tool", "quantscan") != "quantscan":
        raise ReportError(f"expected run.json written by quantscan, found another kind of JSON in {path}")
    fmt = run.get("format", 1)
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        raise ReportError(f'expected run.json "format" to be an integer, found {fmt!r} in {path}')
    if fmt > SUPPORTED_FORMAT:
        raise ReportError(
            f"expected a run folder of format <= {SUPPORTED_FORMAT}, found format {fmt} in {path}: "
            "it was written by a newer quantscan; upgrade quantscan to rebuild its report"
        )
    _check_run_schema(run, path)
    return run


RUN_SCHEMA: dict[str, type | tuple[type, ...]] = {
    "versions": dict,
    "model": dict,
    "inputs": list,
    "options": dict,
    "sites": int,
    "headline": dict,
    "output_metrics": dict,
    "times_s": dict,
    "warnings": list,
}
"""The run.json keys the report, bundle and overlay read, with their JSON types (others are free;
any of these may be absent)."""


def _check_run_schema(run: Mapping[str, Any], path: Path) -> None:
    """One line naming the first mistyped key a reader relies on (a hand-edited file).

    A missing key is allowed: the readers render what is there (older and partial run folders)."""
    for key, kind in RUN_SCHEMA.items():
        if key not in run:
            continue
        value = run[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise ReportError(
                f'expected run.json "{key}" to be a JSON {_json_kind(want)}, found {type(value).__name__} in {path}'
            )


def _json_kind(python_type: str) -> str:
    return {"dict": "object", "list": "array", "int": "integer", "str": "string"}.get(python_type, python_type)


def read_csv(path: Path) -> pd.DataFrame:
    """A table the run folder holds. Strings stay strings (a node called "NA" is not missing); only
    empty cells (how `write_csv` writes NaN) are NaN."""
    import pandas as pd

    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def _read_table(path: Path, required: bool = False) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    try:
        return read_csv(path)
    except (OSError, ValueError) as exc:
        if required:
            raise ReportError(f"expected {path.name} to be a CSV table, found unreadable {path} ({exc})") from None
        return None


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8") if path.is_file() else None
    except (OSError, UnicodeDecodeError):
        return None


def read_hist(path: Path) -> dict[str, np.ndarray] | None:
    import numpy as np

    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile):
        return None


def read_plan(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) else None


def run_members(run_dir: Path) -> list[Path]:
    """The files of a run folder, by name (temp files of an interrupted write are hidden, left out)."""
    return [p for p in sorted(Path(run_dir).iterdir()) if p.is_file() and not p.name.startswith(".")]
