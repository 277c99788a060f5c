"""`quantscan vendor rknn`: RKNN-Toolkit2 run out of process on quantscan's own samples, lined up.

Why this shape: the only fair comparison feeds both tools the same tensors. quantscan preprocesses
the calibration folder once (its own loader, its own preprocess.json), saves every sample as .npy,
and hands RKNN those files as its dataset (RKNN config mean 0 / std 1, so RKNN does no preprocessing
of its own). The toolkit runs in its own Python through `driver.py`; this module writes
the job, reads what the driver wrote, runs quantscan's scan with the chip's profile on the same
samples, and aligns the two (`quantscan.toolchains.align`).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd

from quantscan.calib import CalibSet, load_calibration
from quantscan.errors import CalibrationError, FileError, UsageError
from quantscan.metrics import ErrorAccumulator
from quantscan.model import LoadedModel, graph_inputs, load_model
from quantscan.readers.arrays import read_npy
from quantscan.readers.jsonfile import read_json
from quantscan.readers.text import inside, read_text, read_text_lenient
from quantscan.records import Plan
from quantscan.toolchains import align
from quantscan.toolchains.driverfiles import pooled_cosine, read_result, read_simulated, read_sums
from quantscan.toolchains.result import VendorRun
from quantscan.toolchains.rknn import files as rknn_files

DRIVER = Path(__file__).parent / "driver.py"
TIMEOUT_S = 4 * 3600
"""A build plus accuracy_analysis of every sample of a large model is slow on a small PC, never hours."""
SayProgress = Callable[[str], None]


def graph_names(proto: onnx.ModelProto) -> align.GraphNames:
    """Tensor -> producer node (graph inputs -> ""), node -> op type, the graph outputs, tensor -> readers."""
    producer = {i.name: "" for i in proto.graph.input}
    op_type = {}
    readers: dict[str, list[tuple[str, str]]] = {}
    for node in proto.graph.node:
        op_type[node.name] = node.op_type
        for out in node.output:
            if out:
                producer[out] = node.name
        for name in dict.fromkeys(i for i in node.input if i):
            readers.setdefault(name, []).append((node.name, node.output[0] if node.output else ""))
    return align.GraphNames(producer, op_type, frozenset(o.name for o in proto.graph.output),
                            {t: tuple(r) for t, r in readers.items()})


def _fixed_shapes(cset: CalibSet) -> dict[str, tuple[int, ...]]:
    """RKNN builds one static shape: every sample must have the first sample's shape, batch 1."""
    shapes = cset.sample_shapes()
    return {name: (1, *shape[1:]) for name, shape in shapes.items()}


def write_samples(cset: CalibSet, names: list[str], folder: Path) -> list[list[str]]:
    """Every sample as one .npy per input (the tensors quantscan feeds); returns the paths per sample."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = _fixed_shapes(cset)
    paths = []
    for i, sample in enumerate(cset.samples()):
        row = []
        for name in names:
            array = np.ascontiguousarray(sample[name])
            if tuple(array.shape) != expected[name]:
                raise CalibrationError(
                    f"vendor rknn: expected every sample of input '{name}' shaped {list(expected[name])} "
                    f"(RKNN builds one static shape), found {list(array.shape)} in sample {i}"
                )
            path = folder / f"{i:04d}_{_safe(name)}.npy"
            np.save(path, array)
            row.append(str(path.resolve()))
        paths.append(row)
    return paths


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def fp32_outputs(
    model: LoadedModel, samples: list[list[str]], names: list[str], threads: int | None
) -> list[list[np.ndarray]]:
    """The FP32 model's outputs per sample: the reference both simulators are compared with."""
    from quantscan.runner import Runner

    session = Runner(threads=threads).session(model.proto)
    out = []
    for paths in samples:
        got = session.run({n: read_npy(Path(p), "vendor: a sample") for n, p in zip(names, paths, strict=True)})
        out.append([got[o] for o in session.output_names])
    return out


def output_cosines(reference: list[list[np.ndarray]], simulated: dict[str, np.ndarray],
                   output_names: list[str]) -> dict[str, float]:
    """Pooled cosine per graph output of the vendor simulator against FP32 (the contract's metric;
    layouts differ, e.g. RKNN returns [1,4,1,1] for [1,4], so values are compared flattened)."""
    accs = {name: ErrorAccumulator() for name in output_names}
    for i, ref in enumerate(reference):
        for k, name in enumerate(output_names):
            got = simulated.get(f"{i}:{k}")
            if got is None or got.size != ref[k].size:
                accs.pop(name, None)
                continue
            if name in accs:
                accs[name].update(ref[k].reshape(1, -1).astype(np.float64), got.reshape(1, -1).astype(np.float64))
    return {name: acc.cosine for name, acc in accs.items()}


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


def run_driver(
    python: Path, job: dict[str, Any], work: Path, log: Path, keep_build: bool = False, driver: Path = DRIVER,
) -> dict[str, Any]:
    """Run `driver` (RKNN's by default; tpu-mlir's uses the same file protocol) in the vendor's Python,
    its stdout/stderr (the toolkit's whole verbose log) to `log`.
    Paths are made absolute: the driver starts in `work`, so a relative `--out` would name the job file
    relative to the wrong folder. `keep_build` keeps the toolkit's `.model`/`.data` (hybrid step 1's
    output, which step 2 builds from)."""
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    job_path = work / "job.json"
    job_path.write_text(json.dumps(job, indent=1), encoding="utf-8")
    (work / "result.json").unlink(missing_ok=True)
    with log.open("w", encoding="utf-8") as fh:
        try:
            done = subprocess.run([str(Path(python).absolute()), str(driver), str(job_path)], stdout=fh,
                                  stderr=subprocess.STDOUT,
                                  timeout=TIMEOUT_S, check=False, cwd=work)
        except subprocess.TimeoutExpired:
            return {"stages": [], "error": {"stage": "timeout", "message": f"no result after {TIMEOUT_S} s"}}
    bulky = ["check*.onnx", "*.bmodel", "*_weight.npz", "*_weights.npz", "*.prototxt"]
    bulky += [] if keep_build else ["*.model", "*.data"]
    for copy in [p for pattern in bulky for p in work.glob(pattern)]:
        copy.unlink()  # the toolkit's model copies (MBs each); the log and the cfg say what they held
    result_path = work / "result.json"
    if not result_path.exists():
        return {"stages": [], "error": {"stage": "driver", "message": f"the driver exited {done.returncode} "
                                        f"without a result; see {log}"}}
    return read_result(result_path, log)


def run_rknn(
    model: str | Path,
    calib: str | Path,
    *,
    target: str,
    out: Path,
    python: str | Path | None = None,
    limit: int | None = None,
    analysis_samples: int | None = None,
    plan: str | Path | None = None,
    threads: int | None = None,
    progress: SayProgress | None = None,
) -> VendorRun:
    """Build, simulate and analyse with RKNN-Toolkit2; scan with quantscan; align. Writes into `out`."""
    from quantscan.toolchains.interpreter import find_python

    say = progress or (lambda _msg: None)
    vendor_python = find_python("rknn", python)
    loaded = load_model(model)
    specs = graph_inputs(loaded.proto)
    cset = load_calibration(calib, specs, limit=limit)
    names = [s.name for s in specs]
    out.mkdir(parents=True, exist_ok=True)
    work = out / "rknn"
    times: dict[str, float] = {}

    say("writing the preprocessed samples for the toolkit")
    samples = write_samples(cset, names, work / "data")
    job = _job(loaded, cset, names, samples, target, work, analysis_samples)
    n_analysis = int(job["analysis"])

    say(f"quantscan scan --profile {target} on the same {len(samples)} samples")
    t0 = time.perf_counter()
    scanned = _quantscan_side(loaded, calib, target, limit, threads, out)
    times["quantscan_scan_s"] = time.perf_counter() - t0
    reference = fp32_outputs(loaded, samples, names, threads)
    output_names = [o.name for o in loaded.proto.graph.output]

    say(f"rknn-toolkit2 in {vendor_python}: build, simulator, accuracy_analysis on {n_analysis} samples")
    log = out / "rknn.log"
    t0 = time.perf_counter()
    result = run_driver(vendor_python, job, work, log)
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
        plan_result = apply_plan(Path(plan), vendor_python, job, work, reference, output_names, loaded)

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



def _quantscan_side(
    loaded: LoadedModel, calib: str | Path, target: str, limit: int | None, threads: int | None, out: Path
) -> Any:
    """quantscan's scan of the same samples with the target's profile, its run folder in `out/quantscan`."""
    from quantscan.api import save_scan, scan

    scanned = scan(loaded, calib, profile=target, limit=limit, gain_candidates=0, no_report=True, threads=threads)
    save_scan(scanned, out / "quantscan")
    return scanned


def _job(
    loaded: LoadedModel, cset: CalibSet, names: list[str], samples: list[list[str]], target: str, work: Path,
    analysis_samples: int | None,
) -> dict[str, Any]:
    """The driver's job: the model, the target, the samples as the toolkit's dataset file, how many of them
    accuracy_analysis runs on."""
    if analysis_samples is not None and analysis_samples < 0:
        raise UsageError(f"--analysis-samples: expected a non-negative integer, found {analysis_samples}")
    n_analysis = len(samples) if analysis_samples is None else min(analysis_samples, len(samples))
    dataset = work / "dataset.txt"
    dataset.write_text("".join(" ".join(row) + "\n" for row in samples), encoding="utf-8")
    shapes = _fixed_shapes(cset)
    return {
        "model": str(loaded.path.resolve()), "target": target, "inputs": names,
        "input_shapes": [list(shapes[n]) for n in names], "dataset": str(dataset.resolve()),
        "samples": samples, "analysis": n_analysis, "work": str(work.resolve()), "log": None,
        "quantized_algorithm": "normal",
    }


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
               reference: list[list[np.ndarray]], output_names: list[str], loaded: LoadedModel) -> dict[str, Any]:
    """The bisect plan through RKNN hybrid quantization (float sites as float16, each site mapped onto
    the names hybrid step 1 kept: toolchains/rknn/names.py), its simulator's output cosine beside the
    cosine quantscan's plan claims, and per site what RKNN actually ran it at."""
    from quantscan.toolchains.rknn.hybrid import HybridRknn

    try:
        plan = Plan.from_json(read_json(plan_path, "--plan"))
    except (FileError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--plan: expected a quantscan plan.json, found {plan_path} unreadable ({exc})") from exc
    hybrid = HybridRknn(loaded, python, str(job["target"]), (work / "hybrid").resolve(), dict(job), reference,
                        output_names)
    try:
        applied = hybrid.apply(plan.sites, "plan")
    except UsageError as exc:  # step 1 failed: the plain build's comparison still stands, said in vendor.json
        applied = {"cfg": None, "vendor_output_cosine": {}, "names": {}, "vanished": [], "dropped": {},
                   "warning": None, "honoured": [], "stages": [], "error": {"stage": "hybrid_step1",
                                                                             "message": str(exc)}, "seconds": 0.0}
    return {
        "plan": str(plan_path),
        "hybrid_cfg": applied["cfg"],
        "float_sites": [s.output for s in plan.sites],
        "quantscan_claimed_cosine": (plan.achieved or {}).get("cosine", math.nan),
        "target": {"metric": plan.target.metric, "value": plan.target.value},
        **{k: applied[k] for k in ("vendor_output_cosine", "names", "vanished", "dropped", "warning", "honoured",
                                   "stages", "error", "seconds")},
        "seconds_step1": round(hybrid.step1_seconds, 3),
    }
