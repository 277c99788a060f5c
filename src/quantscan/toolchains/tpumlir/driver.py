"""Run by the *vendor's* Python (the one that imports `tpu_mlir`), never imported by quantscan at run time.

Why a separate script: tpu_mlir 1.30.2 needs Python 3.10 and pins onnx 1.14 / onnxruntime 1.16, so it
lives in its own venv and quantscan drives it as a subprocess, like RKNN (`toolchains/rknn/driver.py`).
It needs only the standard library and numpy; the toolkit's own console scripts (model_transform,
run_calibration, model_deploy, model_runner) are run from the bin folder beside this Python, in the job's
`work` folder, in that order:

1. model_transform: the ONNX model (already saved at IR <= 9 by quantscan) to the float "top" MLIR;
2. run_calibration on the job's samples (one .npz per sample, keys = input names): the calibration table;
3. model_deploy --quantize INT8 (and `--quantize_table` when the job carries a plan): the lowered int8
   model for the target (`*_tpu.mlir`, `*_final.mlir`, the bmodel);
4. model_runner on every sample, on the float top MLIR and on the int8 final MLIR, `--dump_all_tensors`:
   the outputs (`sim_outputs.npz`, `i:k` keys as RKNN's) and per dumped tensor the pooled sums
   Σxy, Σx², Σy², Σ(x-y)², n of float (x) vs int8 (y) over all samples (`entire_sums.json`): tpu-mlir's
   own `npz_tool compare`, pooled.

A plan's sites (`qtable_sites`: per site the tensors of its kernel and the mode) are mapped to the op
names model_transform gave (`<tensor>_<OpType>`, read from the top MLIR's locations) before model_deploy;
sites with no op left are listed in result.json's `qtable.dropped`; `qtable.honoured` gives, per site,
the element type each of its ops has in the lowered `*_tpu.mlir`. A failure is recorded in result.json
(stage and message); the exit code is 0 unless even that could not be written.

A judge (`toolchains/tpumlir/judge.py`, `bisect --evaluator/--verify tpu-mlir`) splits the run by the job's
`phase`: `prepare` runs steps 1-2 once (and lists the top MLIR's op names), `judge` runs step 3 with a
qtable from the prepared top MLIR and calibration table, then the int8 final MLIR alone on every sample,
outputs only (`sim_outputs.npz`): a candidate needs no float run and no per-tensor sums. Its samples run in
one child process (this script again, started after `import tpu_mlir` set the library paths) through
tpu_mlir's own `final_mlir_inference` (what model_runner calls for a `*_final.mlir`) when this tpu_mlir has
it: one process instead of one per sample (~2 s of start-up each).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

STEP_TIMEOUT_S = 3600
_LOC = re.compile(r'^#(?P<id>loc\d+) = loc\("(?P<name>[^"]+)"\)')
_OP_LINE = re.compile(r'^\s*%\S+ = "(?P<op>(?:top|tpu)\.\w+)".*-> (?P<result>.+?) loc\(#(?P<id>loc\d+)\)\s*$')
_DTYPE_SUFFIX = re.compile(r"_(?:f32|f16|bf16|i8|u8|si8|ui8|i16|i32)$")
_OP_SUFFIX = re.compile(r"_[A-Z][A-Za-z0-9]*$")


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def tool(name: str) -> str:
    """A tpu-mlir console script beside this interpreter (the venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def run_step(args: list[str], work: Path, step: str) -> None:
    """One tpu-mlir script; its console output goes to our stdout (quantscan's log). Non-zero exit: failure."""
    sys.stdout.write(f"[quantscan driver] {step}: {' '.join(args)}\n")  # into quantscan's log, before the tool's
    sys.stdout.flush()
    done = subprocess.run(args, cwd=work, timeout=STEP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{step} exited {done.returncode} (a negative code is the signal that killed it)")


def loc_names(mlir_text: str) -> dict[str, str]:
    """`#locN = loc("name")` lines: location id -> op name."""
    return {m.group("id"): m.group("name") for line in mlir_text.splitlines() if (m := _LOC.match(line))}


def op_names(mlir_text: str) -> list[str]:
    """The names of the ops (not weights, not inputs) of an MLIR file, in file order."""
    locs = loc_names(mlir_text)
    out = []
    for line in mlir_text.splitlines():
        m = _OP_LINE.match(line)
        if m and m.group("op") not in ("top.Weight", "top.Input", "top.None") and m.group("id") in locs:
            out.append(locs[m.group("id")])
    return list(dict.fromkeys(out))


def tensor_of(op_name: str) -> str:
    """The ONNX tensor a tpu-mlir op name stands for: `<tensor>[_<OpType>][_<dtype>]` with both stripped."""
    return _OP_SUFFIX.sub("", _DTYPE_SUFFIX.sub("", op_name))


def map_sites(sites: list[dict[str, Any]], ops: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each plan site's kernel tensors -> the op names tpu-mlir knows (exact, else `<tensor>_<OpType>`).

    Returns (per site {site, mode, ops, vanished}, qtable lines). A tensor the converter folded away
    (a BatchNormalization's output inside Conv) vanishes; a site whose tensors all vanish is dropped.
    """
    by_tensor: dict[str, list[str]] = {}
    for name in ops:
        by_tensor.setdefault(tensor_of(name), []).append(name)
    known = set(ops)
    mapped, lines = [], []
    for site in sites:
        found: list[str] = []
        vanished: list[str] = []
        for tensor in site["tensors"]:
            names = [tensor] if tensor in known else by_tensor.get(tensor, [])
            if names:
                found.extend(names)
            else:
                vanished.append(tensor)
        found = list(dict.fromkeys(found))
        mapped.append({"site": site["site"], "mode": site["mode"], "ops": found, "vanished": vanished})
        lines += [f"{name} {site['mode']}" for name in found]
    return mapped, lines


def element_types(mlir_text: str) -> dict[str, str]:
    """Op name -> the element type of its (first) result in a lowered MLIR: int8, uint8, int16, float16,
    bfloat16, float32 (what the toolchain actually ran each op at)."""
    locs = loc_names(mlir_text)
    out: dict[str, str] = {}
    for line in mlir_text.splitlines():
        m = _OP_LINE.match(line)
        if m is None or m.group("id") not in locs:
            continue
        out.setdefault(locs[m.group("id")], _element_type(m.group("result")))
    return out


def _element_type(result: str) -> str:
    first = result.split("tensor<", 1)[-1]
    for word, kind in (("quant.uniform<i8", "int8"), ("quant.uniform<u8", "uint8"), ("quant.uniform<i16", "int16"),
                       ("quant.calibrated", "float32"), ("xbf16", "bfloat16"), ("xf16", "float16"),
                       ("xf32", "float32"), ("xi8", "int8"), ("xui8", "uint8")):
        if word in first.split(">>")[0] + ">":
            return kind
    return "unknown"


def add_sums(sums: dict[str, list[float]], reference: dict[str, np.ndarray], quantized: dict[str, np.ndarray]) -> None:
    """Accumulate Σxy, Σx², Σy², Σ(x-y)², n per tensor both dumps hold with the same number of values."""
    for name, ref in reference.items():
        got = quantized.get(name)
        if got is None or got.size != ref.size or not np.issubdtype(ref.dtype, np.floating):
            continue
        x = ref.astype(np.float64).ravel()
        y = got.astype(np.float64).ravel()
        acc = sums.setdefault(name, [0.0, 0.0, 0.0, 0.0, 0.0])
        acc[0] += float(x @ y)
        acc[1] += float(x @ x)
        acc[2] += float(y @ y)
        acc[3] += float(((x - y) ** 2).sum())
        acc[4] += float(x.size)


def output_key(dump: dict[str, np.ndarray], output: str) -> str:
    """The dump key holding graph output `output`: the name itself, else `<output>_<OpType>...`, the float
    (`_f32`) copy preferred, else the last such key (tpu-mlir dequantizes an int8 output at the end)."""
    if output in dump:
        return output
    keys = [k for k in dump if k.startswith(output + "_")]
    floats = [k for k in keys if k.endswith("_f32")]
    return (floats or keys or [""])[-1]


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: np.asarray(data[k]) for k in data.files}


def transform_and_calibrate(job: dict[str, Any], work: Path, result: dict[str, Any]) -> tuple[str, str]:
    """model_transform and run_calibration; returns (top MLIR, calibration table) file names."""
    name = job["name"]
    shapes = "[" + ",".join("[" + ",".join(str(d) for d in s) + "]" for s in job["input_shapes"]) + "]"
    result["stage"] = "model_transform"
    run_step([tool("model_transform"), "--model_name", name, "--model_def", job["model"], "--input_shapes", shapes,
              "--mlir", f"{name}.mlir"], work, "model_transform")
    result["stages"].append("model_transform")
    result["stage"] = "run_calibration"
    table = f"{name}_cali_table"
    args = [tool("run_calibration"), f"{name}.mlir", "--dataset", job["dataset"], "--input_num",
            str(len(job["samples"])), "-o", table]
    if job.get("cali_method"):
        args += ["--cali_method", job["cali_method"]]
    run_step(args, work, "run_calibration")
    result["stages"].append("run_calibration")
    return f"{name}.mlir", table


def deploy(job: dict[str, Any], work: Path, mlir: str, table: str, result: dict[str, Any]) -> str:
    """model_deploy INT8 (with the plan's qtable when given); returns the final MLIR's file name."""
    name = job["name"]
    args = [tool("model_deploy"), "--mlir", mlir, "--quantize", "INT8", "--calibration_table", table,
            "--processor", job["target"], "--model", f"{name}_int8.bmodel"]
    if job.get("qtable_sites") is not None:
        mapped, lines = map_sites(job["qtable_sites"], op_names((work / mlir).read_text(encoding="utf-8")))
        qtable = work / "applied.qtable"
        qtable.write_text("# op_name quantize_mode (quantscan plan, mapped to tpu-mlir op names)\n"
                          + "".join(line + "\n" for line in lines), encoding="utf-8")
        result["qtable"] = {"file": str(qtable), "sites": mapped,
                            "dropped": [m["site"] for m in mapped if not m["ops"]]}
        args += ["--quantize_table", str(qtable)]
    result["stage"] = "model_deploy"
    run_step(args, work, "model_deploy")
    result["stages"].append("model_deploy")
    finals = sorted(work.glob(f"{name}_{job['target']}_*_final.mlir"))
    if not finals:
        raise RuntimeError(f"model_deploy wrote no {name}_{job['target']}_*_final.mlir")
    lowered = sorted(work.glob(f"{name}_{job['target']}_*_tpu.mlir"))
    if "qtable" in result and lowered:
        types = element_types(lowered[0].read_text(encoding="utf-8"))
        for site in result["qtable"]["sites"]:
            site["honoured"] = {op: types.get(op, "missing") for op in site["ops"]}
    return finals[0].name


def run_samples(job: dict[str, Any], work: Path, mlir: str, final: str, result: dict[str, Any]) -> None:
    """model_runner on every sample, float top MLIR and int8 final MLIR: outputs and pooled per-tensor sums."""
    result["stage"] = "model_runner"
    outputs: dict[str, np.ndarray] = {}
    sums: dict[str, list[float]] = {}
    keys: dict[str, str] = {}
    for i, sample in enumerate(job["samples"]):
        dumps = {}
        for kind, model in (("f32", mlir), ("int8", final)):
            path = work / f"dump_{kind}.npz"
            run_step([tool("model_runner"), "--input", sample, "--model", model, "--output", path.name,
                      "--dump_all_tensors"], work, f"model_runner {kind} sample {i}")
            dumps[kind] = _load(path)
            path.unlink()
        add_sums(sums, dumps["f32"], dumps["int8"])
        for k, output in enumerate(job["outputs"]):
            key = output_key(dumps["int8"], output)
            if key:
                outputs[f"{i}:{k}"] = dumps["int8"][key]
                keys[output] = key
    np.savez(work / "sim_outputs.npz", **outputs)  # type: ignore[arg-type]
    _write_json(work / "entire_sums.json", sums)
    result["output_keys"] = keys
    result["stages"].append("model_runner")


def run(job: dict[str, Any]) -> dict[str, Any]:
    """The four steps; a failure stops at its stage and is recorded, not raised."""
    work = Path(job["work"])
    result: dict[str, Any] = {"tool": "tpu-mlir", "stages": [], "times": {}, "stage": ""}
    try:
        from importlib.metadata import version

        result["version"] = version("tpu_mlir")
    except Exception:  # the version is a label, not a reason to stop
        result["version"] = None
    t0 = time.perf_counter()
    if job.get("phase") in PHASES:
        return PHASES[job["phase"]](job, work, result, t0)
    try:
        mlir, table = transform_and_calibrate(job, work, result)
        result["times"]["calibrate_s"] = time.perf_counter() - t0
        final = deploy(job, work, mlir, table, result)
        result["times"]["deploy_s"] = time.perf_counter() - t0 - result["times"]["calibrate_s"]
        t1 = time.perf_counter()
        run_samples(job, work, mlir, final, result)
        result["times"]["runner_s"] = time.perf_counter() - t1
    except Exception as exc:  # recorded for quantscan to report, the stage says where it stopped
        result["error"] = {"stage": result["stage"], "message": " ".join(str(exc).split())[:500],
                           "traceback": traceback.format_exc()[-4000:]}
    result["times"]["total_s"] = time.perf_counter() - t0
    return result


def prepare_phase(job: dict[str, Any], work: Path, result: dict[str, Any], t0: float) -> dict[str, Any]:
    """Steps 1-2 once for a judge: the top MLIR, the calibration table, and the op names the qtables map to."""
    try:
        mlir, table = transform_and_calibrate(job, work, result)
        result["top_mlir"], result["cali_table"] = str(work / mlir), str(work / table)
        result["ops"] = op_names((work / mlir).read_text(encoding="utf-8"))
    except Exception as exc:  # recorded for quantscan to report, the stage says where it stopped
        _record(result, exc)
    result["times"]["calibrate_s"] = result["times"]["total_s"] = time.perf_counter() - t0
    return result


def judge_phase(job: dict[str, Any], work: Path, result: dict[str, Any], t0: float) -> dict[str, Any]:
    """Step 3 from the prepared top MLIR and table with the job's qtable, then the int8 model's outputs on
    every sample (`sim_outputs.npz`)."""
    try:
        _link_weights(Path(job["top_mlir"]), work)
        final = deploy(job, work, job["top_mlir"], job["cali_table"], result)
        result["times"]["deploy_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        result["stage"] = "model_runner"
        outputs, keys = run_outputs(job, work, final)
        np.savez(work / "sim_outputs.npz", **outputs)  # type: ignore[arg-type]
        (work / "output_keys.json").unlink(missing_ok=True)
        result["output_keys"] = keys
        result["stages"].append("model_runner")
        result["times"]["runner_s"] = time.perf_counter() - t1
    except Exception as exc:  # recorded for quantscan to report, the stage says where it stopped
        _record(result, exc)
    result["times"]["total_s"] = time.perf_counter() - t0
    return result


PHASES = {"prepare": prepare_phase, "judge": judge_phase}


def _record(result: dict[str, Any], exc: Exception) -> None:
    result["error"] = {"stage": result["stage"], "message": " ".join(str(exc).split())[:500],
                       "traceback": traceback.format_exc()[-4000:]}


def _link_weights(top: Path, work: Path) -> None:
    """The prepared folder's weight files, linked into this build's folder: the top MLIR names its weight
    file relative to the folder tpu-mlir runs in (`module.weight_file`)."""
    for weights in top.parent.glob("*_weight.npz"):
        link = work / weights.name
        if not link.exists():
            link.symlink_to(weights)


def run_outputs(job: dict[str, Any], work: Path, final: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The final MLIR's outputs on every sample (`i:k` keys) and the dump key each graph output came from:
    all samples in one child process when this tpu_mlir has model_runner's `final_mlir_inference`, else
    model_runner once per sample."""
    if _has_final_inference():
        args = [sys.executable, str(Path(__file__).resolve()), "--final-outputs", str(work / "job.json"), final]
        run_step(args, work, f"model_runner's final_mlir_inference on {len(job['samples'])} samples")
        outputs = _load(work / "sim_outputs.npz")
        return outputs, json.loads((work / "output_keys.json").read_text(encoding="utf-8"))
    dumps = []
    for i, sample in enumerate(job["samples"]):
        path = work / "dump_int8.npz"
        run_step([tool("model_runner"), "--input", sample, "--model", final, "--output", path.name,
                  "--dump_all_tensors"], work, f"model_runner int8 sample {i}")
        dumps.append(_load(path))
        path.unlink()
    return _outputs_of(job, dumps)


def _outputs_of(job: dict[str, Any], dumps: list[dict[str, np.ndarray]]
                ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Per sample the graph outputs' dump entries (`i:k` keys), and the dump key each output came from."""
    outputs: dict[str, np.ndarray] = {}
    keys: dict[str, str] = {}
    for i, dump in enumerate(dumps):
        for k, output in enumerate(job["outputs"]):
            key = output_key(dump, output)
            if key:
                outputs[f"{i}:{k}"] = dump[key]
                keys[output] = key
    return outputs, keys


def _has_final_inference() -> bool:
    """Whether this tpu_mlir ships model_runner as an importable module (importing `tpu_mlir` also puts its
    library and module paths into the environment, which a child started after it inherits)."""
    import importlib.util

    try:
        import tpu_mlir  # noqa: F401
        return importlib.util.find_spec("tpu_mlir.python.tools.model_runner") is not None
    except Exception:  # an older or stand-in tpu_mlir: the console script is the interface
        return False


def final_outputs(job_path: Path, final: str) -> None:
    """The child: every sample through `final_mlir_inference(inputs, mlir, dump_all=True)`, what
    `model_runner --model *_final.mlir --dump_all_tensors` computes, without one process per sample."""
    import tpu_mlir  # noqa: F401
    from tpu_mlir.python.tools.model_runner import final_mlir_inference

    job = json.loads(job_path.read_text(encoding="utf-8"))
    work = job_path.parent
    dumps = []
    for sample in job["samples"]:  # every tensor of one sample at a time: only the outputs are kept
        dump = final_mlir_inference(_load(Path(sample)), final, True)
        dumps.append({key: np.asarray(dump[key]) for key in _output_keys(job, dump)})
    outputs, keys = _outputs_of(job, dumps)
    np.savez(work / "sim_outputs.npz", **outputs)  # type: ignore[arg-type]
    _write_json(work / "output_keys.json", keys)


def _output_keys(job: dict[str, Any], dump: dict[str, np.ndarray]) -> list[str]:
    return [key for output in job["outputs"] if (key := output_key(dump, output))]


def main() -> int:
    if sys.argv[1] == "--final-outputs":
        final_outputs(Path(sys.argv[2]), sys.argv[3])
        return 0
    job = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    result = run(job)
    _write_json(Path(job["work"]) / "result.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
