"""Run by the *vendor's* Python (the one that imports `rknn.api`), never imported by quantscan.

Why a separate script: RKNN-Toolkit2 pins its own numpy/torch/onnx, so it lives in its own venv and
quantscan drives it as a subprocess. This file needs only the standard library, numpy and rknn.api,
and talks through files: `python driver.py JOB.json` reads the job written by
`quantscan.toolchains.rknn.run`, writes `result.json` (stages reached, versions, times, error), the
simulator's outputs (`sim_outputs.npz`) and, per analysed sample, RKNN's `error_analysis.txt` plus
pooled per-layer sums of its golden/simulator dumps (`entire_sums.json`), all into the job's `work`
folder. A failure is recorded in result.json (stage and message); the exit code is 0 unless even
that could not be written.

Job keys: model, target, inputs (names), input_shapes, dataset (RKNN dataset.txt of .npy paths, one
line per sample, inputs space-separated), samples (per sample, one .npy path per input), analysis
(how many of the samples go through accuracy_analysis), work, log, quantized_algorithm,
hybrid_step1 (optional, true: load and run hybrid quantization step 1 only, its files left in `work`),
hybrid_step2 (optional, {model, data, cfg}: step 1's files and the cfg to build from by step 2, then
the simulator as for a plain build).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def _check(code: int, stage: str) -> None:
    """RKNN's API returns 0 or -1 rather than raising; make a -1 a failure of this stage."""
    if code != 0:
        raise RuntimeError(f"rknn {stage} returned {code}")


def _feeds(paths: list[str]) -> list[np.ndarray]:
    return [np.load(p) for p in paths]


def _data_format(arrays: list[np.ndarray]) -> list[str] | None:
    """quantscan feeds the model's own NCHW tensors; RKNN's default for 4-D inputs is NHWC."""
    return ["nchw" if a.ndim == 4 else "nhwc" for a in arrays]


def _add_sums(sums: dict[str, list[float]], snapshot: Path) -> None:
    """Accumulate Σxy, Σx², Σy², Σ(x-y)², n per dumped layer (golden = FP32, simulator = int8 model)."""
    golden, simulated = snapshot / "golden" / "npy", snapshot / "simulator" / "npy"
    for file in sorted(golden.glob("*.npy")):
        other = simulated / file.name
        if not other.exists():
            continue
        x = np.load(file).astype(np.float64).ravel()
        y = np.load(other).astype(np.float64).ravel()
        if x.size != y.size:
            continue
        acc = sums.setdefault(file.stem, [0.0, 0.0, 0.0, 0.0, 0.0])
        acc[0] += float(x @ y)
        acc[1] += float(x @ x)
        acc[2] += float(y @ y)
        acc[3] += float(((x - y) ** 2).sum())
        acc[4] += float(x.size)


def _config(rknn: Any, job: dict[str, Any]) -> None:
    _check(rknn.config(target_platform=job["target"], quantized_dtype="w8a8",
                       quantized_algorithm=job.get("quantized_algorithm", "normal")), "config")


def _hybrid_step1(rknn: Any, job: dict[str, Any], work: Path) -> None:
    """Hybrid quantization step 1 (RKNN-Toolkit2 User Guide, hybrid quantization): calibrates and writes
    `<model>.quantization.cfg` (every tensor the toolkit kept after its own rewrites), `<model>.model`
    and `<model>.data` into `work`. quantscan maps the plan onto the cfg's names itself
    (quantscan.toolchains.rknn.names) and runs step 2 as another job, as many times as it needs."""
    cwd = os.getcwd()
    os.chdir(work)
    try:
        _check(rknn.hybrid_quantization_step1(dataset=job["dataset"]), "hybrid_step1")
    finally:
        os.chdir(cwd)


def _hybrid_step2(job: dict[str, Any], work: Path) -> Any:
    """Step 2 from step 1's files and a cfg with `custom_quantize_layers` filled. It runs on a fresh RKNN
    object: 2.5.0 refuses one that loaded a model ("Do not call 'load_onnx' before executing
    'hybrid_quantization_step2'")."""
    from rknn.api import RKNN

    hybrid = job["hybrid_step2"]
    rknn = RKNN(verbose=True)
    cwd = os.getcwd()
    os.chdir(work)
    try:
        _config(rknn, job)
        _check(rknn.hybrid_quantization_step2(model_input=hybrid["model"], data_input=hybrid["data"],
                                              model_quantization_cfg=hybrid["cfg"]), "hybrid_step2")
    except Exception:
        rknn.release()
        raise
    finally:
        os.chdir(cwd)
    return rknn


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Load, build int8, run the simulator on every sample, accuracy_analysis on the first few."""
    from rknn.api import RKNN

    work = Path(job["work"])
    result: dict[str, Any] = {"tool": "rknn-toolkit2", "stages": [], "times": {}, "analysis": []}
    try:
        from importlib.metadata import version

        result["version"] = version("rknn-toolkit2")
    except Exception:  # the version is a label, not a reason to stop
        result["version"] = None  # quantscan reads it from the log instead
    step2 = bool(job.get("hybrid_step2"))
    rknn = None if step2 else RKNN(verbose=True)  # stdout: quantscan captures it (layer table) into the log
    stage = "config"
    try:
        t0 = time.perf_counter()
        if rknn is not None:
            _config(rknn, job)
            stage = "load_onnx"
            _check(rknn.load_onnx(job["model"], inputs=job["inputs"], input_size_list=job["input_shapes"]), stage)
            result["stages"].append(stage)
        stage = "hybrid_step1" if job.get("hybrid_step1") else ("hybrid_step2" if step2 else "build")
        t1 = time.perf_counter()
        if rknn is not None and job.get("hybrid_step1"):
            _hybrid_step1(rknn, job, work)
            result["stages"].append(stage)
            result["times"]["hybrid_step1_s"] = time.perf_counter() - t1
            return result
        if rknn is None:
            rknn = _hybrid_step2(job, work)
        else:
            _check(rknn.build(do_quantization=True, dataset=job["dataset"]), stage)
        result["times"]["build_s"] = time.perf_counter() - t1
        result["stages"].append(stage)
        stage = "init_runtime"
        _check(rknn.init_runtime(), stage)
        stage = "simulator"
        t1 = time.perf_counter()
        outputs: dict[str, np.ndarray] = {}
        for i, paths in enumerate(job["samples"]):
            arrays = _feeds(paths)
            got = rknn.inference(inputs=arrays, data_format=_data_format(arrays))
            if got is None:
                raise RuntimeError(f"rknn inference returned None on sample {i}")
            for k, value in enumerate(got):
                outputs[f"{i}:{k}"] = np.asarray(value)
        np.savez(work / "sim_outputs.npz", **outputs)  # type: ignore[arg-type]
        result["times"]["simulator_s"] = time.perf_counter() - t1
        result["stages"].append(stage)
        stage = "accuracy_analysis"
        t1 = time.perf_counter()
        sums: dict[str, list[float]] = {}
        for i, paths in enumerate(job["samples"][: int(job.get("analysis", 0))]):
            snapshot = work / "snapshot"
            shutil.rmtree(snapshot, ignore_errors=True)
            _check(rknn.accuracy_analysis(inputs=paths, output_dir=str(snapshot)), stage)
            kept = work / f"error_analysis_{i:03d}.txt"
            shutil.copy(snapshot / "error_analysis.txt", kept)
            result["analysis"].append(kept.name)
            if i == 0:
                shutil.copy(snapshot / "map_name_to_file.txt", work / "map_name_to_file.txt")
            _add_sums(sums, snapshot)
        shutil.rmtree(work / "snapshot", ignore_errors=True)
        _write_json(work / "entire_sums.json", sums)
        result["times"]["accuracy_analysis_s"] = time.perf_counter() - t1
        if result["analysis"]:
            result["stages"].append(stage)
        result["times"]["total_s"] = time.perf_counter() - t0
    except Exception as exc:  # recorded for quantscan to report, the stage says where it stopped
        result["error"] = {"stage": stage, "message": " ".join(str(exc).split())[:500],
                           "traceback": traceback.format_exc()[-4000:]}
    finally:
        if rknn is not None:
            rknn.release()
    return result


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    result = run(job)
    _write_json(Path(job["work"]) / "result.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
