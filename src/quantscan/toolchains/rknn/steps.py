"""The steps every RKNN run is made of: the samples as .npy files, the driver's job, the driver run in the
vendor's Python, the FP32 reference and the output cosines against it.

Why its own module: `vendor rknn` (run.py) and the hybrid quantization (hybrid.py) both take these
steps, and run.py's `apply_plan` drives the hybrid; with the steps in run.py the two imported each other.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantscan.calib import CalibSet
from quantscan.errors import CalibrationError, UsageError
from quantscan.metrics import ErrorAccumulator
from quantscan.model import LoadedModel
from quantscan.readers.arrays import read_npy
from quantscan.toolchains import align
from quantscan.toolchains.driverfiles import read_result

DRIVER = Path(__file__).parent / "driver.py"
TIMEOUT_S = 4 * 3600
"""A build plus accuracy_analysis of every sample of a large model is slow on a small PC, never hours."""


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


def fixed_shapes(cset: CalibSet) -> dict[str, tuple[int, ...]]:
    """RKNN builds one static shape: every sample must have the first sample's shape, batch 1."""
    shapes = cset.sample_shapes()
    return {name: (1, *shape[1:]) for name, shape in shapes.items()}


def write_samples(cset: CalibSet, names: list[str], folder: Path) -> list[list[str]]:
    """Every sample as one .npy per input (the tensors quantscan feeds); returns the paths per sample."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = fixed_shapes(cset)
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


def run_driver(
    python: Path, job: dict[str, Any], work: Path, log: Path, keep_build: bool = False, driver: Path = DRIVER,
    keep_weights: bool = False,
) -> dict[str, Any]:
    """Run `driver` (RKNN's by default; tpu-mlir's uses the same file protocol) in the vendor's Python,
    its stdout/stderr (the toolkit's whole verbose log) to `log`.
    Paths are made absolute: the driver starts in `work`, so a relative `--out` would name the job file
    relative to the wrong folder. `keep_build` keeps the toolkit's `.model`/`.data` (hybrid step 1's
    output, which step 2 builds from); `keep_weights` the weight .npz files (tpu-mlir's top MLIR reads its
    weights from one: a judge's prepared model is deployed again for every build)."""
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
    bulky = ["check*.onnx", "*.bmodel", "*.prototxt"] + ([] if keep_weights else ["*_weight.npz", "*_weights.npz"])
    bulky += [] if keep_build else ["*.model", "*.data"]
    for copy in [p for pattern in bulky for p in work.glob(pattern)]:
        copy.unlink()  # the toolkit's model copies (MBs each); the log and the cfg say what they held
    result_path = work / "result.json"
    if not result_path.exists():
        return {"stages": [], "error": {"stage": "driver", "message": f"the driver exited {done.returncode} "
                                        f"without a result; see {log}"}}
    return read_result(result_path, log)


def driver_job(
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
    shapes = fixed_shapes(cset)
    return {
        "model": str(loaded.path.resolve()), "target": target, "inputs": names,
        "input_shapes": [list(shapes[n]) for n in names], "dataset": str(dataset.resolve()),
        "samples": samples, "analysis": n_analysis, "work": str(work.resolve()), "log": None,
        "quantized_algorithm": "normal",
    }
