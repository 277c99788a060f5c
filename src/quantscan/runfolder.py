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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantscan.columns import Col
from quantscan.errors import FileError, QuantscanError, UsageError
from quantscan.readers.jsonfile import field, json_kind, parse_json, read_json

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
    for parent in (path.parent, *path.parent.parents):  # a file where a folder must be: the user's path
        if parent.exists() and not parent.is_dir():
            raise UsageError(f"expected a folder at {parent} (to write {path.name} in), found a file")
        if parent.exists():
            break
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:  # a failed write names no file: name ours
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
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


def refuse_inputs(targets: Iterable[Path], inputs: Iterable[str | Path | None], flag: str,
                  what: str = "input") -> None:
    """No command writes over one of its own inputs (the model, a run folder's table, a log it reads)."""
    given = {Path(p).resolve() for p in inputs if p}
    for target in targets:
        if Path(target).resolve() in given:
            raise UsageError(f"{flag}: expected an output path other than the {what} (a path that is not an "
                             f"input), found the {what} itself ({target})")


def is_quantscan_json(path: Path, keys: Iterable[str]) -> bool:
    """A JSON object quantscan wrote: every key of `keys` present (its own shape, e.g. a rewrite record)."""
    try:
        data = read_json(Path(path), "a file of quantscan's")
    except FileError:
        return False
    return isinstance(data, dict) and all(k in data for k in keys)


MANIFEST_MAX_BYTES = 1 << 20
"""The largest MANIFEST.json a bundle of ours has (a few KB: one line per file)."""


def is_quantscan_zip(path: Path) -> bool:
    """A bundle quantscan wrote: a zip whose MANIFEST.json says `"tool": "quantscan"`."""
    try:
        with zipfile.ZipFile(path) as zf:
            if zf.getinfo("MANIFEST.json").file_size > MANIFEST_MAX_BYTES:  # a bomb is not our manifest
                return False
            return bool(parse_json(zf.read("MANIFEST.json")).get("tool") == "quantscan")
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


OUT_MARKER = ".quantscan"
"""The hidden file that marks a folder as one quantscan writes into (and that it locks while it does)."""

RUN_NAMES = frozenset({
    "layers.csv", "tensors.csv", "ops.csv", "channels.csv", "hist.npz", "summary.md", RUN_JSON, "report.html",
    "compat.csv", "partitions.csv", "task.csv", "log_layers.csv", "plan.csv", "gain.csv", "plan.json",
    "session.json", "outputs.csv", "unmatched.csv", "compare.json", "vendor.csv", "vendor_findings.csv",
    "vendor.json", "rknn.log", "rknn_hybrid.log", "ort_quant_config.json", "rknn_hybrid_quant.cfg",
    "horizon_node_config.yaml", "tidl_16bit_options.json", "tidl_import_16bit.txt", "device.csv", "calib_advice.csv",
    "hailo_model_script.alls", "pulsar2_layer_configs.json", "qnn_quant_overrides.json", "amct_quant.cfg",
    "atc_keep_dtype.cfg", "prefixes.json",
    "cost.json", "cost.csv",
})
"""Every file name a command writes into its --out folder."""


def is_quantscan_folder(out: Path) -> bool:
    """A folder quantscan wrote into: it holds the marker, or a run.json quantscan wrote (older runs)."""
    if (out / OUT_MARKER).is_file():
        return True
    try:
        read_run_json(out / RUN_JSON)
    except QuantscanError:
        return False
    return True


@contextlib.contextmanager
def claim_out_dir(out: Path, *, force: bool = False) -> Iterator[Path]:
    """Create the run folder, refuse to write over files of ours it holds that we did not write, and lock it.

    A folder holding one of the names we write (RUN_NAMES) but neither our marker nor our run.json is
    the user's: refused without --force. The lock (flock on the marker, dropped by the kernel if the
    process dies) makes a second command into the same folder a one-line refusal, not a race whose
    last writer wins.
    A folder this call created is removed again when the command fails before writing anything into
    it (a refused model leaves no empty folder holding only the lock behind).
    """
    created = not Path(out).exists()
    out = ensure_out_dir(Path(out))
    if not force and not is_quantscan_folder(out):
        clash = sorted(p.name for p in out.iterdir() if p.name in RUN_NAMES)
        if clash:
            raise UsageError(f"--out: {out} holds {', '.join(clash[:3])} not written by quantscan; "
                             "choose another folder or add --force to replace them")
    import fcntl

    fd = os.open(out / OUT_MARKER, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"--out: another quantscan is writing into {out}; wait for it to finish or "
                             "choose another folder") from None
        yield out
    except BaseException:
        if created:
            _remove_if_only_marker(out)
        raise
    finally:
        os.close(fd)  # closing drops the lock


def _remove_if_only_marker(out: Path) -> None:
    """Remove a run folder that holds nothing but our marker (best effort: the error in flight matters)."""
    try:
        if [p.name for p in out.iterdir()] == [OUT_MARKER]:
            (out / OUT_MARKER).unlink()
            out.rmdir()
    except OSError:
        pass


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


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""What a spreadsheet reads as the start of a formula (OWASP's CSV injection list)."""


def _neutral(value: Any) -> Any:
    """A text cell a spreadsheet would run (`=HYPERLINK(...)` as a node name) gets a leading `'`, the
    spreadsheet's own "this is text" mark; a cell already starting with `'` gets one more, so
    `read_csv` can take exactly one off and give back the name as it was."""
    if isinstance(value, str) and value and (value[0] in FORMULA_START or value[0] == "'"):
        return "'" + value
    return value


def _restored(value: Any) -> Any:
    if isinstance(value, str) and len(value) > 1 and value[0] == "'" and (value[1] in FORMULA_START
                                                                          or value[1] == "'"):
        return value[1:]
    return value


def csv_text(frame: pd.DataFrame) -> str:
    """The CSV text of a table, text cells neutralised against spreadsheet formula injection (every
    CSV quantscan writes goes through here)."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    text_columns = [c for c in frame.columns if not is_numeric_dtype(frame[c]) or is_bool_dtype(frame[c])]
    if text_columns:
        frame = frame.copy()
        for c in text_columns:
            frame[c] = frame[c].astype(object).map(_neutral)
    return str(frame.to_csv(index=False))


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write_text(path, csv_text(frame))


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """A compressed .npz, written atomically (numpy would otherwise write in place)."""
    import numpy as np

    buf = io.BytesIO()
    named: dict[str, Any] = dict(arrays)
    np.savez_compressed(buf, **named)
    atomic_write_bytes(path, buf.getvalue())


def check_model_target(path: Path, *, flag: str, protect: Iterable[Path | None] = (), force: bool = False) -> None:
    """Before any work: the model path is not an input, and not a file quantscan did not write (unless force)."""
    refuse_inputs([path], protect, flag, "input model")
    refuse_foreign_overwrite(path, flag, is_quantscan_onnx, force)


def save_model(model: onnx.ModelProto, path: Path, *, protect: Iterable[Path | None] = (), flag: str = "-o",
               force: bool = False) -> Path:
    """Write a model quantscan made, atomically, marked as ours (producer_name), so a rerun may replace it;
    refuse a protected file (the user's input model) and a file we did not write (unless force)."""
    check_model_target(path, flag=flag, protect=protect, force=force)
    model.producer_name = PRODUCER
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
    device: pd.DataFrame | None = None
    """device.csv (`quantscan dumps` into the same folder)."""
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
    layers = read_table(run_dir / LAYERS_CSV, required=True)
    if layers is None or Col.NODE not in layers.columns:
        raise ReportError(f"expected {LAYERS_CSV} with a 'node' column, found none in {run_dir / LAYERS_CSV}")
    return RunFiles(
        path=run_dir,
        run=run,
        layers=layers,
        tensors=read_table(run_dir / "tensors.csv"),
        ops=read_table(run_dir / "ops.csv"),
        channels=read_table(run_dir / "channels.csv"),
        hist=read_hist(run_dir / "hist.npz"),
        summary=read_text(run_dir / "summary.md"),
        compat=read_table(run_dir / "compat.csv"),
        partitions=read_table(run_dir / "partitions.csv"),
        plan=read_plan(run_dir / "plan.json"),
        device=read_table(run_dir / "device.csv"),
        calib_advice=read_table(run_dir / "calib_advice.csv"),
    )


def read_run_json(path: Path) -> dict[str, Any]:
    """run.json as written by quantscan (any format up to SUPPORTED_FORMAT); ReportError otherwise."""
    try:
        run = read_json(Path(path), "run.json")
    except FileError as exc:
        raise ReportError(f"{exc} (expected run.json written by quantscan)") from None
    if not isinstance(run, dict) or run.get("tool", "quantscan") != "quantscan":
        raise ReportError(f"expected run.json written by quantscan, found another kind of JSON in {path}")
    _check_run_nesting(run, path)
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
    "input_contract": dict,
    "preprocessing": dict,
    "worst_samples": list,
    "calibration": dict,
    "evaluation": dict,
    "memory": dict,
    "deployed_metrics": dict,
    "runner": dict,
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


RUN_TABLES = ("output_metrics", "deployed_metrics", "preprocessing")
"""run.json objects whose every value is an object (one per output or input)."""
RUN_ROWS = ("inputs", "worst_samples")
"""run.json arrays whose every item is an object, with a string "name" where it has one."""


RUN_NESTED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "model": {"path": str, "sha256": str},
    "options": {"profile": (str, type(None))},
}
"""Values inside run.json objects that case save, the report and the bundle read, with their JSON types."""


def _check_run_nesting(run: Mapping[str, Any], path: Path) -> None:
    """One level down: the per-output/per-input objects and rows the readers index into."""
    for key, fields in RUN_NESTED.items():
        section = run.get(key)
        if isinstance(section, dict):
            try:
                for name, kind in fields.items():
                    field(section, name, kind, f"run.json {path}: {key}")
            except FileError as exc:
                raise ReportError(str(exc)) from None
    for key in RUN_TABLES:
        table = run.get(key)
        if isinstance(table, dict) and not all(isinstance(v, dict) for v in table.values()):
            raise ReportError(f'expected run.json "{key}" to hold one JSON object per entry, found another '
                              f"type in {path}")
    for key in RUN_ROWS:
        rows = run.get(key)
        if isinstance(rows, list) and not all(isinstance(r, dict) and isinstance(r.get("name", ""), str)
                                              for r in rows):
            raise ReportError(f'expected run.json "{key}" to be a list of JSON objects (with a string "name"), '
                              f"found another type in {path}")


def _json_kind(python_type: str) -> str:
    return {"dict": "object", "list": "array", "int": "integer", "str": "string"}.get(python_type, python_type)


def read_csv(path: Path) -> pd.DataFrame:
    """A table the run folder holds. Strings stay strings (a node called "NA" is not missing); only
    empty cells (how `write_csv` writes NaN) are NaN."""
    import pandas as pd
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    for c in frame.columns:
        if not is_numeric_dtype(frame[c]) and not is_bool_dtype(frame[c]):
            restored = frame[c].map(_restored)
            if not restored.equals(frame[c]):  # left as read (and typed) when no cell was marked
                frame[c] = restored
    return frame


def read_table(path: Path, required: bool = False) -> pd.DataFrame | None:
    """A CSV table of the run folder; absent or unreadable is None, or one ReportError line when `required`."""
    if not path.is_file():
        return None
    try:
        return read_csv(path)
    except (OSError, ValueError) as exc:
        if required:
            raise ReportError(f"expected {path.name} to be a CSV table, found unreadable {path} ({exc})") from None
        return None


def read_text(path: Path) -> str | None:
    """An optional text file of the run (summary.md); unreadable is absent (the report renders without it)."""
    from quantscan.readers.text import read_text as read_checked

    try:
        return read_checked(path, path.name) if path.is_file() else None
    except FileError:
        return None


def read_hist(path: Path) -> dict[str, np.ndarray] | None:
    """hist.npz, or None when absent or unreadable (the report draws no histograms). Sizes come from the
    headers first (readers.arrays): a hand-made hist.npz of 9 GB of zeros is not read."""
    from quantscan.readers.arrays import read_npz

    if not path.is_file():
        return None
    try:
        return read_npz(path, "hist.npz", budget=HIST_MAX_BYTES)
    except FileError:
        return None


HIST_MAX_BYTES = 1 << 28
"""The most hist.npz may hold to be read (a scan writes a few KB per site: 256 MB is ~10^5 sites)."""


PLAN_SCHEMA: dict[str, type | tuple[type, ...]] = {
    "format": int, "tool": str, "model": str, "model_sha256": str, "target": dict, "status": str, "mode": str,
    "sites": list, "pareto": list, "steps": list, "evaluations": int, "site_count": int, "keep_float": list,
    "force_quant": list, "calibration": dict, "phases": list,
}
"""The plan.json keys the report, overlay and case library read, with their JSON types (any may be absent)."""


def check_plan(plan: Any, path: Path) -> dict[str, Any]:
    """plan.json's content checked before use: an object, its keys of the types above, every site an
    object with a string "node". One ReportError line naming the first wrong key otherwise."""
    if not isinstance(plan, dict):
        raise ReportError(f"expected plan.json to be a JSON object written by quantscan bisect, found a JSON "
                          f"{json_kind(plan)} in {path}")
    try:
        for key, kind in PLAN_SCHEMA.items():
            field(plan, key, kind, f"plan.json {path}")
    except FileError as exc:
        raise ReportError(str(exc)) from None
    for site in plan.get("sites", []):
        if not isinstance(site, dict) or not isinstance(site.get(Col.NODE, ""), str):
            raise ReportError(f'expected plan.json "sites" to be a list of JSON objects with a string "{Col.NODE}", '
                              f"found a JSON {json_kind(site)} in {path}")
    return plan


def read_plan(path: Path, *, strict: bool = False) -> dict[str, Any] | None:
    """plan.json, None when absent. Unreadable or of the wrong shape: None for the report (it renders
    without the plan), one ReportError line when `strict` (overlay and case save rely on it)."""
    if not path.is_file():
        return None
    try:
        return check_plan(read_json(path, "plan.json"), path)
    except FileError as exc:
        if strict:
            raise ReportError(str(exc)) from None
        return None
    except ReportError:
        if strict:
            raise
        return None


def run_members(run_dir: Path) -> list[Path]:
    """The files of a run folder, by name (temp files of an interrupted write are hidden, left out)."""
    return [p for p in sorted(Path(run_dir).iterdir()) if p.is_file() and not p.name.startswith(".")]
