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
hybrid_cfg (optional: `custom_quantize_layers` lines to apply through hybrid quantization).
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


def _hybrid_build(rknn: Any, job: dict[str, Any], work: Path) -> Any:
    """Hybrid quantization: step 1 writes <model>.quantization.cfg, our layers go into its
    custom_quantize_layers, step 2 builds from it (RKNN-Toolkit2 User Guide, hybrid quantization).
    Step 2 refuses an RKNN object that loaded a model ("Do not call 'load_onnx' before executing
    'hybrid_quantization_step2'", 2.5.0), so it runs on a fresh one, which is returned."""
    from rknn.api import RKNN

    cwd = os.getcwd()
    os.chdir(work)
    try:
        _check(rknn.hybrid_quantization_step1(dataset=job["dataset"]), "hybrid_quantization_step1")
        stem = Path(job["model"]).stem
        cfg = work / f"{stem}.quantization.cfg"
        text = cfg.read_text(encoding="utf-8")
        custom = Path(job["hybrid_cfg"]).read_text(encoding="utf-8")
        known = {ln.strip().rstrip(":") for ln in text.splitlines() if ln.startswith("    ") and ln.endswith(":")}
        lines = [ln for ln in custom.splitlines()
                 if ln.startswith("    ") and json.loads(ln.strip().rsplit(":", 1)[0]) in known]
        (work / "dropped_layers.txt").write_text(
            "\n".join(ln for ln in custom.splitlines() if ln.startswith("    ") and ln not in lines) + "\n",
            encoding="utf-8")
        if "custom_quantize_layers: {}" in text:
            text = text.replace("custom_quantize_layers: {}", "custom_quantize_layers:\n" + "\n".join(lines))
        else:
            text = text.replace("custom_quantize_layers:", "custom_quantize_layers:\n" + "\n".join(lines), 1)
        cfg.write_text(text, encoding="utf-8")
        shutil.copy(cfg, work / "applied.quantization.cfg")
        rknn.release()
        rknn = RKNN(verbose=True)
        _config(rknn, job)
        _check(rknn.hybrid_quantization_step2(
            model_input=f"{stem}.model", data_input=f"{stem}.data", model_quantization_cfg=str(cfg)
        ), "hybrid_quantization_step2")
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
    rknn = RKNN(verbose=True)  # stdout, which quantscan captures with the C++ layer table into the log
    stage = "config"
    try:
        t0 = time.perf_counter()
        _config(rknn, job)
        stage = "load_onnx"
        _check(rknn.load_onnx(job["model"], inputs=job["inputs"], input_size_list=job["input_shapes"]), stage)
        result["stages"].append(stage)
        stage = "build"
        t1 = time.perf_counter()
        if job.get("hybrid_cfg"):
            rknn = _hybrid_build(rknn, job, work)
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
        rknn.release()
    return result


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    result = run(job)
    _write_json(Path(job["work"]) / "result.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
