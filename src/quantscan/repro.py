"""The real inputs of an extracted model, and the record of what it reproduces.

`save_inputs(result, calib, out, samples=[...])`: the subgraph's real input tensors for up to N samples
(the first ones, or a scan's worst ones), captured by running the full model with them exposed, written
beside the extracted model as `.npz` (with the full model's values of the subgraph outputs in
`.expected.npz`, so "reproduces" can be checked); `write_record` adds `<stem>.extract.json` saying which
kernel and which finding of a run the model reproduces. One of the three jobs of `quantscan extract`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantscan import graph as qgraph
from quantscan.calib import CalibSet, load_calibration
from quantscan.calib.npyfile import npz_bytes
from quantscan.calib.source import data_source
from quantscan.columns import Col
from quantscan.cut import ExtractResult, companion_paths
from quantscan.errors import UsageError
from quantscan.model import graph_inputs
from quantscan.runfolder import atomic_write_bytes as write_atomic
from quantscan.runner import Runner
from quantscan.shrink import ShrinkResult

DEFAULT_SAMPLES = 8
"""How many samples `save_inputs` keeps by default (`--samples`): a failure seen on one image only
may be noise; eight show whether it repeats, and stay small enough to mail."""

def capture(
    result: ExtractResult | ShrinkResult,
    calib: CalibSet | str | Path,
    *,
    sample: int = 0,
    consts: Mapping[str, float] | None = None,
    runner: Runner | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(inputs, expected outputs) of the subgraph on calibration sample `sample`, from one full run."""
    source = data_source(calib, graph_inputs(result.source), consts=consts)
    if sample < 0 or (source.count is not None and sample >= source.count):
        raise UsageError(f"sample: expected 0 <= sample < {source.count}, found {sample}")
    feeds = next(s for i, s in enumerate(source.samples()) if i == sample)
    produced = {o for n in result.source.graph.node for o in n.output}
    wanted = [n for n in [*result.inputs, *result.outputs] if n in produced]
    values = (runner or Runner()).session(qgraph.expose(result.source, wanted)).run(feeds, wanted)
    values.update(feeds)
    return {n: values[n] for n in result.inputs}, {n: values[n] for n in result.outputs}


def save_inputs(
    result: ExtractResult | ShrinkResult,
    calib: CalibSet | str | Path,
    model_path: str | Path,
    *,
    sample: int = 0,
    consts: Mapping[str, float] | None = None,
    runner: Runner | None = None,
) -> tuple[Path, Path]:
    """Write the subgraph's real inputs (`<stem>.inputs.npz`, keys = its input names, a valid tensor
    calibration file) and the full model's values of its outputs (`<stem>.expected.npz`) beside
    `model_path`, both atomically, for one sample (see `save_samples` for several)."""
    saved = save_samples(result, calib, model_path, samples=[sample], consts=consts, runner=runner)
    return saved.inputs_path, saved.expected_path


@dataclass(frozen=True)
class SavedSamples:
    """What `save_samples` wrote: the two .npz files and which calibration samples they hold."""

    inputs_path: Path
    expected_path: Path
    indices: tuple[int, ...]
    files: tuple[str | None, ...] = ()
    """The calibration file of each sample, when one file holds one sample."""
    note: str = ""


def save_samples(
    result: ExtractResult | ShrinkResult,
    calib: CalibSet | str | Path,
    model_path: str | Path,
    *,
    samples: Sequence[int] | None = None,
    count: int = DEFAULT_SAMPLES,
    consts: Mapping[str, float] | None = None,
    runner: Runner | None = None,
) -> SavedSamples:
    """The subgraph's real inputs and the full model's values of its outputs for several samples: the
    given indices (e.g. a scan's worst samples), else the first `count`. Samples are stacked on axis 0
    when every cut tensor has a batch axis of 1 (then the file is a tensor calibration file of N
    samples); a cut tensor without one (a [T, C] state, a scalar) keeps the first sample only, said in
    `note`."""
    if count <= 0:
        raise UsageError(f"--samples: expected a positive number, found {count}")
    cset = calib if isinstance(calib, CalibSet) else load_calibration(calib, graph_inputs(result.source),
                                                                       consts=consts)
    source = data_source(cset, graph_inputs(result.source), consts=consts)
    total = source.count if source.count is not None else count
    files = [f.name for f in cset.files] if len(cset.files) == cset.n_samples else []
    wanted = list(dict.fromkeys(samples)) if samples is not None else list(range(min(count, total)))
    bad = [i for i in wanted if i < 0 or i >= total]
    if bad:
        raise UsageError(f"sample: expected 0 <= sample < {total}, found {bad[0]}")
    produced = {o for n in result.source.graph.node for o in n.output}
    names = [n for n in [*result.inputs, *result.outputs] if n in produced]
    session = (runner or Runner()).session(qgraph.expose(result.source, names))
    picked = set(wanted[:count])
    captured: dict[int, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = {}
    for i, feeds in enumerate(source.samples()):
        if i in picked:
            values = {**session.run(feeds, names), **feeds}
            captured[i] = ({n: values[n] for n in result.inputs}, {n: values[n] for n in result.outputs})
        if len(captured) == len(picked):
            break
    order = [i for i in wanted if i in captured]
    arrays = [a for i in order for part in captured[i] for a in part.values()]
    stackable = all(np.ndim(a) >= 1 and np.shape(a)[0] == 1 for a in arrays)
    note = ""
    if not stackable and len(order) > 1:
        note = "a cut tensor has no batch axis of 1: only the first sample is kept"
        order = order[:1]
    if len(order) == 1:  # one sample is kept as it is (a rank-0 cut tensor has no axis to concatenate on)
        feeds_out, expected_out = captured[order[0]]
    else:
        feeds_out = {n: np.concatenate([captured[i][0][n] for i in order]) for n in result.inputs}
        expected_out = {n: np.concatenate([captured[i][1][n] for i in order]) for n in result.outputs}
    inputs_path, expected_path = companion_paths(model_path)
    write_atomic(inputs_path, npz_bytes(feeds_out))
    write_atomic(expected_path, npz_bytes(expected_out))
    names_of = tuple(files[i] if i < len(files) else None for i in order)
    return SavedSamples(inputs_path, expected_path, tuple(order), names_of, note)


def worst_sample_indices(run_dir: str | Path) -> list[int]:
    """The sample indices a scan listed as worst by output cosine (run.json `worst_samples`)."""
    from quantscan.runfolder import read_run_json

    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise UsageError(f"--worst: expected a scan's run folder with run.json, found none at {run_dir}")
    samples = read_run_json(path).get("worst_samples") or []
    if not samples:
        raise UsageError(f"--worst: expected run.json worst_samples in {run_dir} (a scan's run folder), found none")
    return [int(w["index"]) for w in samples]


def finding_for(run_dir: str | Path, kernel: Sequence[str]) -> dict[str, object] | None:
    """The scan's layers.csv row of the kernel (rank, cause, diagnosis, errors), if the run has one."""

    path = Path(run_dir) / "layers.csv"
    if not path.is_file():
        return None
    from quantscan.runfolder import read_csv

    layers = read_csv(path)
    rows = layers[layers[Col.NODE].isin(list(kernel))] if Col.NODE in layers.columns else layers.iloc[0:0]
    if rows.empty:
        return None
    keep = [Col.NODE, Col.KERNEL, Col.RANK, Col.CAUSE, Col.REASON, Col.DIAGNOSIS, Col.ISOLATED_SQNR_DB,
            Col.CUMULATIVE_COSINE, Col.CUMULATIVE_SQNR_DB, Col.EVAL_CLIP_FRACTION, Col.COMPAT_RULE, Col.COMPAT_FIX,
            Col.GAIN_IF_FLOAT]
    row = rows.iloc[0].to_dict()
    return {k: (None if isinstance(row[k], float) and math.isnan(row[k]) else _plain(row[k]))
            for k in keep if k in row}


def _plain(value: object) -> object:
    """numpy scalars as Python numbers, for JSON."""
    return value.item() if isinstance(value, np.generic) else value


def write_record(
    result: ExtractResult,
    model_path: str | Path,
    saved: SavedSamples | None = None,
    *,
    run_dir: str | Path | None = None,
) -> Path:
    """`<stem>.extract.json` beside the model: which source, node and kernel it cuts out, the samples
    its inputs hold, and the finding of a run it reproduces (relative file names only, so a bundle
    carries it as it is)."""
    from quantscan.runfolder import write_json

    model_path = Path(model_path)
    stem = model_path.name[: -len(model_path.suffix)] if model_path.suffix else model_path.name
    record: dict[str, object] = {
        "model": model_path.name,
        "source": result.source_path.name if result.source_path is not None else None,
        "source_sha256": _sha256(result),
        Col.NODE: result.node,
        Col.KERNEL: {"name": result.kernel_name, "nodes": list(result.kernel)},
        "context": result.context,
        "nodes": list(result.nodes),
        "inputs": list(result.inputs),
        "outputs": list(result.outputs),
        "samples": None if saved is None else {
            "indices": list(saved.indices),
            "files": list(saved.files),
            "inputs": saved.inputs_path.name, "expected": saved.expected_path.name, "note": saved.note},
        "finding": finding_for(run_dir, result.kernel or [result.node]) if run_dir is not None else None,
    }
    path = model_path.with_name(f"{stem}.extract.json")
    write_json(path, record)
    return path


def _sha256(result: ExtractResult) -> str:
    """The source file's sha256 (as run.json records it), else the in-memory model's."""
    import hashlib

    if result.source_path is not None and result.source_path.is_file():
        return hashlib.sha256(result.source_path.read_bytes()).hexdigest()
    return hashlib.sha256(result.source.SerializeToString()).hexdigest()
