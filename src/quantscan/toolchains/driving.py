"""The steps every toolchain's run takes, whatever the tool: its driver script run in the vendor's Python,
the FP32 reference on quantscan's samples, the simulated outputs scored against it, a plan's figures on the
claim's own samples, and the ONNX graph's names for lining layers up.

Why toolchain-neutral: `vendor tpu-mlir` and its judge took these from `rknn/run.py` and `rknn/steps.py`,
so a tpu-mlir change read RKNN's modules and an RKNN refactor could break tpu-mlir. Each folder keeps
what is its own (how samples are written, what its driver's job holds).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantscan.errors import FileError, UsageError
from quantscan.heldout import claimed_samples, held_out_figures
from quantscan.metrics import ErrorAccumulator
from quantscan.model import LoadedModel
from quantscan.readers.arrays import read_npy
from quantscan.readers.jsonfile import read_json
from quantscan.records import Plan
from quantscan.toolchains import align
from quantscan.toolchains.driverfiles import read_result

TIMEOUT_S = 4 * 3600
"""A build plus accuracy_analysis of every sample of a large model is slow on a small PC, never hours."""

SayProgress = Callable[[str], None]
"""How a vendor run says what it is doing (the CLI prints it; the API default says nothing)."""


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


def fp32_outputs(
    model: LoadedModel, samples: list[list[str]], names: list[str], threads: int | None
) -> list[list[np.ndarray]]:
    """The FP32 model's outputs per sample: the reference every toolchain's simulator is compared with."""
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
    python: Path, job: dict[str, Any], work: Path, log: Path, *, driver: Path, keep_build: bool = False,
    keep_weights: bool = False,
) -> dict[str, Any]:
    """Run a toolchain's `driver` script (every driver speaks the same file protocol: job.json in,
    result.json out) in the vendor's Python, its stdout/stderr (the toolkit's whole verbose log) to `log`.
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



def read_plan(path: Path) -> Plan:
    """`vendor TOOL --plan plan.json` as `records.Plan`; a file that is not one is bad input, said in one line."""
    try:
        return Plan.from_json(read_json(path, "--plan"))
    except (FileError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--plan: expected a quantscan plan.json, found {path} unreadable ({exc})") from exc


def plan_held_out(plan: Plan, n: int, plan_sums: dict[str, list[list[float]]],
                  int8_sums: dict[str, list[list[float]]]) -> dict[str, Any]:
    """vendor.json `plan.held_out` when the plan's claimed samples can be named among the `n` simulated
    (quantscan/heldout.py), else nothing: the all-samples figures stand alone as before."""
    samples = claimed_samples(plan.held_out, n)
    if samples is None or not plan_sums:
        return {}
    return {"held_out": held_out_figures(plan.to_json(), samples, plan_sums, int8_sums)}
