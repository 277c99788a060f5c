"""The files a vendor driver leaves in its work folder, read back through the guarded readers.

Why checked: the driver runs in the vendor's interpreter and can be killed mid-write (a timeout, OOM,
Ctrl-C in the toolkit), run by the wrong interpreter, or be another version's; `result.json` may then
be truncated, a list, or hold other types. Each field quantscan uses is type-checked here, so a damaged
result is one line naming the file and its log, not a traceback in whatever reads the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from quantscan.errors import FileError
from quantscan.readers.arrays import numeric, read_npz
from quantscan.readers.jsonfile import field, read_json, read_json_object

RESULT_SCHEMA: dict[str, type | tuple[type, ...]] = {
    "stages": list, "error": (dict, type(None)), "times": dict, "version": (str, type(None)), "analysis": list,
    "qtable": (dict, type(None)), "stage": str,
}
"""result.json keys quantscan reads (rknn and tpu-mlir drivers), with their JSON types."""


def read_result(path: Path, log: Path) -> dict[str, Any]:
    """The driver's result.json, every field quantscan reads checked: stages and analysis lists of strings,
    times numbers, error an object with string stage and message."""
    what = f"vendor: the toolkit driver's {path.name} (see {log})"
    try:
        result = read_json_object(path, what)
    except FileError as exc:
        raise FileError(f"{exc}; was the toolkit killed while writing it?") from None
    for key, kind in RESULT_SCHEMA.items():
        field(result, key, kind, f"{what} {path}")
    for key in ("stages", "analysis"):
        if not all(isinstance(s, str) for s in result.get(key, [])):
            raise FileError(f'{what}: expected "{key}" to be a list of strings, found another type in {path}')
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in result.get("times", {}).values()):
        raise FileError(f'{what}: expected "times" to hold numbers, found another type in {path}')
    error = result.get("error")
    if error is not None and not all(isinstance(error.get(k), str) for k in ("stage", "message")):
        raise FileError(f'{what}: expected "error" to hold a string stage and message, found another type in {path}')
    _check_qtable(result.get("qtable"), what, path)
    return result


def _check_qtable(qtable: dict[str, Any] | None, what: str, path: Path) -> None:
    """tpu-mlir's qtable record: a file name and per plan site its ops and what vanished."""
    if qtable is None:
        return
    field(qtable, "file", (str, type(None)), f"{what} qtable")
    field(qtable, "dropped", list, f"{what} qtable")
    sites = field(qtable, "sites", list, f"{what} qtable", [])
    if not all(isinstance(s, dict) and all(k in s for k in ("site", "ops", "vanished")) for s in sites):
        raise FileError(f'{what}: expected qtable "sites" to be objects with site, ops and vanished, found another '
                        f"type in {path}")


def read_sums(path: Path) -> dict[str, list[float]]:
    """entire_sums.json (per dumped tensor: sum xy, xx, yy, dd, n over every element), absent = {}."""
    if not path.exists():
        return {}
    sums = read_json(path, "vendor: the toolkit driver's entire_sums.json")
    ok = isinstance(sums, dict) and all(
        isinstance(v, list) and len(v) == 5 and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
        for v in sums.values())
    if not ok:
        raise FileError(f"vendor: expected {path.name} to map each tensor to five numbers (its pooled sums), found "
                        f"another shape in {path}")
    return {str(k): [float(x) for x in v] for k, v in sums.items()}



def read_simulated(path: Path) -> dict[str, np.ndarray]:
    """sim_outputs.npz (per `sample:output` key the simulator's output), absent = {}."""
    if not path.exists():
        return {}
    what = "vendor: the toolkit driver's sim_outputs.npz"
    return {key: numeric(array, key, what, path) for key, array in read_npz(path, what).items()}


def sample_sums(reference: list[list[np.ndarray]], simulated: dict[str, np.ndarray],
                output_names: list[str]) -> dict[str, list[list[float]]]:
    """Per graph output, per sample, the sums (xy, xx, yy) of FP32 `x` against the simulator's `y`
    (flattened; sim_outputs.npz keys `sample:output`). Why: the pooled cosine of any subset of samples is
    `pooled_cosine` of these rows summed, so a claim's held-out samples can be scored after the build
    (issue 38: claim and toolchain on the same samples). An output missing or mis-sized on a sample is
    left out, as `output_cosines` leaves it out."""
    sums: dict[str, list[list[float]]] = {name: [] for name in output_names}
    for i, ref in enumerate(reference):
        for k, name in enumerate(output_names):
            got = simulated.get(f"{i}:{k}")
            if name not in sums:
                continue
            if got is None or got.size != ref[k].size:
                sums.pop(name)
                continue
            x = ref[k].reshape(-1).astype(np.float64)
            y = got.reshape(-1).astype(np.float64)
            sums[name].append([float(x @ y), float(x @ x), float(y @ y)])
    return sums
