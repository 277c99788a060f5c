"""`quantscan vendor rknn`: RKNN-Toolkit2 run out of process on quantscan's own samples, lined up.

Why this shape: the only fair comparison feeds both tools the same tensors. quantscan preprocesses
the calibration folder once (its own loader, its own preprocess.json), saves every sample as .npy,
and hands RKNN those files as its dataset (RKNN config mean 0 / std 1, so RKNN does no preprocessing
of its own). The toolkit runs in its own Python through `driver.py`; this module writes
the job, reads what the driver wrote, runs quantscan's scan with the chip's profile on the same
samples, and aligns the two (`quantscan.toolchains.align`).
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from quantscan.calib import load_calibration
from quantscan.errors import UsageError
from quantscan.metrics import pooled_cosine
from quantscan.model import LoadedModel, graph_inputs, load_model
from quantscan.readers.text import inside, read_text, read_text_lenient
from quantscan.toolchains import align
from quantscan.toolchains.driverfiles import read_simulated, read_sums, sample_sums
from quantscan.toolchains.driving import (
    TIMEOUT_S,
    SayProgress,
    fp32_outputs,
    graph_names,
    output_cosines,
    plan_held_out,
    read_plan,
    run_driver,
)
from quantscan.toolchains.folder import ScanSide
from quantscan.toolchains.interpreter import find_python
from quantscan.toolchains.result import VendorRun
from quantscan.toolchains.rknn import files as rknn_files
from quantscan.toolchains.rknn.hybrid import HybridRknn
from quantscan.toolchains.rknn.kit import PYTHON
from quantscan.toolchains.rknn.steps import DRIVER, driver_job, write_samples

__all__ = ["DRIVER", "TIMEOUT_S", "SayProgress", "apply_plan", "fp32_outputs", "graph_names", "output_cosines",
           "plan_held_out", "run_driver", "run_rknn", "vendor_layers", "write_samples"]


def vendor_layers(work: Path, analyses: list[str]) -> list[align.LayerFigures]:
    """Per layer over the analysed samples: RKNN's single-layer cosine averaged (it prints one per
    sample), the entire cosine pooled over every element of every sample from its golden/simulator
    dumps (entire_sums.json; the per-sample mean where a dump was missing)."""
    per_layer: dict[str, list[rknn_files.AnalysisRow]] = {}
    order: list[str] = []
    for name in analyses:
        for row in rknn_files.parse_error_analysis(read_text(inside(work, name, "vendor: result.json analysis"),
                                                             "vendor: error_analysis")):
            if row.layer not in per_layer:
                order.append(row.layer)
            per_layer.setdefault(row.layer, []).append(row)
    files = _layer_files(work / "map_name_to_file.txt")
    sums = read_sums(work / "entire_sums.json")
    out = []
    for layer in order:
        rows = per_layer[layer]
        single = _mean([r.single_cosine for r in rows])
        entire = _mean([r.entire_cosine for r in rows])
        pooled = sums.get(files.get(layer, ""))
        if pooled is not None and math.isfinite(entire):
            entire = pooled_cosine(pooled)
        out.append(align.LayerFigures(layer, rows[0].op_type, single, entire))
    return out


def _layer_files(path: Path) -> dict[str, str]:
    """map_name_to_file.txt: layer name -> dump file stem."""
    if not path.exists():
        return {}
    out = {}
    for line in read_text(path, "vendor: map_name_to_file.txt").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].endswith(".txt"):
            out[parts[0]] = parts[1][: -len(".txt")]
    return out


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def run_rknn(
    model: str | Path,
    calib: str | Path,
    *,
    target: str,
    out: Path,
    scan: ScanSide,
    python: str | Path | None = None,
    limit: int | None = None,
    analysis_samples: int | None = None,
    plan: str | Path | None = None,
    threads: int | None = None,
    progress: SayProgress | None = None,
) -> VendorRun:
    """Build, simulate and analyse with RKNN-Toolkit2; scan with quantscan (`scan`: api.scan); align into `out`."""
    say = progress or (lambda _msg: None)
    vendor_python = find_python(PYTHON, python)
    loaded = load_model(model)
    specs = graph_inputs(loaded.proto)
    cset = load_calibration(calib, specs, limit=limit)
    names = [s.name for s in specs]
    out.mkdir(parents=True, exist_ok=True)
    work = out / "rknn"
    times: dict[str, float] = {}

    say("writing the preprocessed samples for the toolkit")
    samples = write_samples(cset, names, work / "data")
    job = driver_job(loaded, cset, names, samples, target, work, analysis_samples)
    n_analysis = int(job["analysis"])

    say(f"quantscan scan --profile {target} on the same {len(samples)} samples")
    t0 = time.perf_counter()
    scanned = scan(loaded, calib, out=out / "quantscan", profile=target, limit=limit, gain_candidates=0,
                   no_report=True, threads=threads)
    times["quantscan_scan_s"] = time.perf_counter() - t0
    reference = fp32_outputs(loaded, samples, names, threads)
    output_names = [o.name for o in loaded.proto.graph.output]

    say(f"rknn-toolkit2 in {vendor_python}: build, simulator, accuracy_analysis on {n_analysis} samples")
    log = out / "rknn.log"
    t0 = time.perf_counter()
    result = run_driver(vendor_python, job, work, log, driver=DRIVER)
    times["vendor_wall_s"] = time.perf_counter() - t0
    times.update({f"vendor_{k}": float(v) for k, v in result.get("times", {}).items()})
    log_text = read_text_lenient(log, "vendor: the toolkit's log")

    simulated = read_simulated(work / "sim_outputs.npz")
    vendor_cos = output_cosines(reference, simulated, output_names) if simulated else {}
    tool = "rknn-toolkit2"
    table, (place_rows, unexplained, explained) = _aligned(loaded, scanned, work, result, log_text, tool, target)

    plan_result = None
    if plan is not None and "error" not in result:
        say("applying the plan through RKNN hybrid quantization")
        plan_result = apply_plan(Path(plan), vendor_python, job, work, reference, output_names, loaded,
                                 sample_sums(reference, simulated, output_names) if simulated else {})

    run = VendorRun(
        tool=tool,
        version=str(result.get("version") or rknn_files.toolkit_version(log_text) or "unknown"),
        target=target,
        model=str(loaded.path),
        python=str(vendor_python),
        stages=list(result.get("stages", [])),
        error=result.get("error"),
        log=str(log),
        times=times,
        samples=len(samples),
        analysis_samples=len(result.get("analysis", [])),
        qs_output_cosine={k: float(v.cosine) for k, v in scanned.output_metrics.items()},
        vendor_output_cosine=vendor_cos,
        table=table,
        findings=place_rows,
        unexplained_placements=unexplained,
        explained_placements=explained,
        plan=plan_result,
    )
    run.save(out)
    shutil.rmtree(work / "data", ignore_errors=True)
    return run



def _aligned(
    loaded: LoadedModel, scanned: Any, work: Path, result: dict[str, Any], log_text: str, tool: str, target: str,
) -> tuple[pd.DataFrame, tuple[pd.DataFrame, int, int]]:
    """vendor.csv's table (the toolkit's layers beside the scan's sites) and the placement findings."""
    layers = vendor_layers(work, list(result.get("analysis", [])))
    places = [align.VendorPlace(p.name, p.op_type, p.placement) for p in rknn_files.parse_layer_table(log_text)]
    graph = graph_names(loaded.proto)
    findings = scanned.compat.findings if scanned.compat is not None else None
    predicted = align.predicted_placements(findings) if findings is not None else {}
    table = align.align_layers(layers, graph, scanned.layers, scanned.tensors, places, predicted)
    return table, align.placement_findings(places, graph, predicted, tool, target)


def apply_plan(plan_path: Path, python: Path, job: dict[str, Any], work: Path,
               reference: list[list[np.ndarray]], output_names: list[str], loaded: LoadedModel,
               int8_sums: dict[str, list[list[float]]] | None = None) -> dict[str, Any]:
    """The bisect plan through RKNN hybrid quantization (float sites as float16, each site mapped onto
    the names hybrid step 1 kept: toolchains/rknn/names.py), its simulator's output cosine beside the
    cosine quantscan's plan claims, and per site what RKNN actually ran it at. `int8_sums` (the plain
    all-int8 build's per-sample sums) give `held_out`: both figures on the claim's own samples."""
    plan = read_plan(plan_path)
    hybrid = HybridRknn(loaded, python, str(job["target"]), (work / "hybrid").resolve(), dict(job), reference,
                        output_names)
    try:
        applied = hybrid.apply(plan.sites, "plan")
    except UsageError as exc:  # step 1 failed: the plain build's comparison still stands, said in vendor.json
        applied = {"cfg": None, "vendor_output_cosine": {}, "names": {}, "requantized": {}, "vanished": [],
                   "dropped": {}, "warning": None, "honoured": [], "stages": [],
                   "error": {"stage": "hybrid_step1", "message": str(exc)}, "seconds": 0.0}
    return {
        "plan": str(plan_path),
        "hybrid_cfg": applied["cfg"],
        "float_sites": [s.output for s in plan.sites],
        "quantscan_claimed_cosine": (plan.achieved or {}).get("cosine", math.nan),
        "target": {"metric": plan.target.metric, "value": plan.target.value},
        **{k: applied[k] for k in ("vendor_output_cosine", "names", "requantized", "vanished", "dropped", "warning",
                                   "honoured", "stages", "error", "seconds")},
        "seconds_step1": round(hybrid.step1_seconds, 3),
        **plan_held_out(plan, len(reference), applied.get("vendor_sample_sums") or {}, int8_sums or {}),
    }

