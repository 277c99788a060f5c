"""Plans applied by tpu-mlir itself: transform and calibrate once, then model_deploy with a qtable per set.

Why this shape: model_transform and run_calibration (the slow, plan-independent part) depend only on the
model and the samples, so `MixedTpuMlir` runs them once (`prepare`, the driver's `prepare` phase) and each
requested set of sites is one model_deploy with a quantize table (`<op> F32|F16` lines, written by the
driver from `run.qtable_sites`, as `quantscan vendor tpu-mlir --plan` writes it) plus the int8 final MLIR
on every sample (the driver's `judge` phase). The output is scored against FP32 (onnxruntime on the very
samples) with the pooled output cosine, the search's own metric. It shares RKNN's `HybridRknn` base
(`toolchains.judging.JudgingToolchain`, a `bisect.external.Toolchain`): `bisect --evaluator tpu-mlir`
judges every candidate this way, `--verify tpu-mlir` the plan and its Pareto points; each `apply` is one
independent job in its own folder (the prepared files are only read), so the executor seam can run several
side by side.
"""

from __future__ import annotations

import hashlib
import math
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from quantscan.calib import CalibSet
from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.model import LoadedModel
from quantscan.readers.jsonfile import read_json
from quantscan.readers.text import read_text_lenient
from quantscan.records import PlanSite
from quantscan.toolchains.driverfiles import read_result, read_simulated, sample_sums
from quantscan.toolchains.driving import output_cosines, run_driver
from quantscan.toolchains.judging import JudgingToolchain
from quantscan.toolchains.tpumlir import run as tpu_run
from quantscan.toolchains.tpumlir.log import log_version

_DTYPE_SUFFIX = re.compile(r"_(?:f32|f16|bf16|i8|u8|si8|ui8|i16|i32)$")
_OP_SUFFIX = re.compile(r"_[A-Z][A-Za-z0-9]*$")


def tensor_of(op_name: str) -> str:
    """The ONNX tensor a tpu-mlir op name stands for: `<tensor>[_<OpType>][_<dtype>]`, both stripped (the
    driver's own rule, which names the qtable's ops)."""
    return _OP_SUFFIX.sub("", _DTYPE_SUFFIX.sub("", op_name))


def ops_of(tensors: Sequence[str], ops: Sequence[str]) -> list[str]:
    """The top MLIR's ops standing for `tensors` (exact name, else `<tensor>_<OpType>`), in tensor order:
    the names the driver writes into the qtable for a site with those kernel tensors."""
    known = set(ops)
    by_tensor: dict[str, list[str]] = {}
    for name in ops:
        by_tensor.setdefault(tensor_of(name), []).append(name)
    found = [name for t in tensors for name in ([t] if t in known else by_tensor.get(t, []))]
    return list(dict.fromkeys(found))


@dataclass
class MixedTpuMlir(JudgingToolchain):
    """One model and sample set in tpu-mlir mixed precision (module docstring); `builds` counts the
    model_deploy builds. Steps 1-2 run on the first build."""

    proto: onnx.ModelProto = field(init=False)
    """The converter's model copy (the job's `model`), whose node outputs the qtable's sites name."""
    prepared: dict[str, Any] = field(default_factory=dict)
    prepare_seconds: float = 0.0
    tool: str = "tpu-mlir"
    export: str = "tpu-mlir"

    def __post_init__(self) -> None:
        self.proto = onnx.load(str(self.job["model"]), load_external_data=False)

    @classmethod
    def _inputs(cls, loaded: LoadedModel, cset: CalibSet, names: list[str], target: str, work: Path,
                threads: int | None) -> tuple[dict[str, Any], list[list[str]]]:
        """One .npz per sample (run_calibration's dataset), the converter's model copy, and the .npy feeds
        the reference reads; the job's fingerprint lets a resumed search reuse steps 1-2."""
        samples = tpu_run.write_samples(cset, names, work / "data")
        job = tpu_run.driver_job(loaded, cset, names, samples, target, work, threads)
        job["fingerprint"] = _fingerprint([Path(job["model"]), *map(Path, samples)], target)
        return job, tpu_run.npy_feeds(samples, names, work / "feeds")

    @property
    def prepare_dir(self) -> Path:
        return self.work / "prepared"

    def prepare(self) -> None:
        """model_transform and run_calibration once (reused while their files and record exist)."""
        if self.prepared:
            return
        done = self._prepared_before()
        if done:
            self.prepared = done
            return
        t0 = time.perf_counter()
        job = {**self.job, "work": str(self.prepare_dir), "phase": "prepare"}
        done = run_driver(self.python, job, self.prepare_dir, self.work / "tpu-mlir_prepare.log",
                          driver=tpu_run.DRIVER, keep_weights=True)
        self.prepare_seconds = time.perf_counter() - t0
        if done.get("error") or not isinstance(done.get("ops"), list):
            message = (done.get("error") or {}).get("message", "no op names recorded")
            raise UsageError(f"tpu-mlir model_transform/run_calibration: expected a top MLIR and a calibration "
                             f"table, found it failed ({message}); see {self.work / 'tpu-mlir_prepare.log'}")
        self.prepared = done

    def _prepared_before(self) -> dict[str, Any]:
        """The record of steps 1-2 already run here (a resumed search) for this very model copy and these
        samples (the job's fingerprint), with its files still there; {} when there is none to reuse."""
        record, job = self.prepare_dir / "result.json", self.prepare_dir / "job.json"
        if not (record.exists() and job.exists()):
            return {}
        asked = read_json(job, "tpu-mlir's prepared job.json")
        if not isinstance(asked, dict) or asked.get("fingerprint") != self.job["fingerprint"]:
            return {}
        done = read_result(record, self.work / "tpu-mlir_prepare.log")
        files = [Path(str(done.get(k, ""))) for k in ("top_mlir", "cali_table")]
        kept = all(f.is_file() for f in files) and any(self.prepare_dir.glob("*_weight.npz"))
        return done if kept and not done.get("error") and isinstance(done.get("ops"), list) else {}

    def apply(self, sites: Sequence[PlanSite], label: str) -> dict[str, Any]:
        """model_deploy with `sites` in the qtable (float F32, int16 F16), then the int8 final MLIR on every
        sample: its output cosine per output, each site's ops and vanished tensors, what tpu-mlir lowered
        each op to."""
        self.prepare()
        folder = self.work / label
        folder.mkdir(parents=True, exist_ok=True)
        job = {**self.job, "work": str(folder), "phase": "judge", "top_mlir": self.prepared["top_mlir"],
               "cali_table": self.prepared["cali_table"], "qtable_sites": tpu_run.qtable_sites(sites, self.proto)}
        t0 = time.perf_counter()
        log = folder / "tpu-mlir.log"
        result = run_driver(self.python, job, folder, log, driver=tpu_run.DRIVER)
        self.builds += 1
        simulated = read_simulated(folder / "sim_outputs.npz")
        cosines = output_cosines(self.reference, simulated, self.output_names) if simulated else {}
        qtable = result.get("qtable") or {}
        mapped = {str(s["site"]): s for s in qtable.get("sites", [])}
        site_of = {s.output: s.node for s in sites}
        return {
            "float_sites": [s.node for s in sites],
            "vendor_output_cosine": cosines,
            "cosine": min(cosines.values()) if cosines else math.nan,
            "vendor_sample_sums": sample_sums(self.reference, simulated, self.output_names) if simulated else {},
            "names": {site_of.get(k, k): list(v["ops"]) for k, v in mapped.items()},
            "vanished": [site_of.get(k, k) for k in qtable.get("dropped", [])],
            "dropped": {site_of.get(k, k): list(v["vanished"]) for k, v in mapped.items() if v["vanished"]},
            "warning": _dropped_warning([site_of.get(k, k) for k in qtable.get("dropped", [])]),
            "honoured": [honoured(site_of.get(k, k), v) for k, v in mapped.items()],
            "qtable": qtable.get("file"),
            "version": result.get("version") or log_version(read_text_lenient(log, "tpu-mlir's log")) or None,
            "stages": result.get("stages", []),
            "error": result.get("error"),
            "times": result.get("times", {}),
            "seconds": round(time.perf_counter() - t0, 3),
        }

    def names_for(self, sites: Sequence[PlanSite]) -> dict[str, list[str]]:
        """Site node -> the top MLIR's op names its qtable lines carry (bisect's tpu_mlir.qtable export)."""
        self.prepare()
        ops = [str(o) for o in self.prepared.get("ops", [])]
        return {s.node: ops_of(d["tensors"], ops)
                for s, d in zip(sites, tpu_run.qtable_sites(sites, self.proto), strict=True)}

    def close(self) -> None:
        """Drop what only builds need (the samples, the feeds, the model copy: MBs)."""
        for folder in ("data", "feeds"):
            shutil.rmtree(self.work / folder, ignore_errors=True)
        (self.work / "model.onnx").unlink(missing_ok=True)


def honoured(node: str, mapped: dict[str, Any]) -> dict[str, object]:
    """One site as tpu-mlir lowered it (the shape of RKNN's `names.honoured` rows): the element types its ops
    have in `*_tpu.mlir`, and whether each is the qtable's mode (F32 -> float32, F16 -> float16); None when
    no op of the site was found."""
    requested = {"F32": "float32", "F16": "float16"}.get(str(mapped.get("mode")), str(mapped.get("mode")))
    types = {str(op): str(t) for op, t in (mapped.get("honoured") or {}).items()}
    dtypes = sorted(set(types.values()))
    ran = dtypes[0] if len(dtypes) == 1 else ("mixed" if dtypes else "dropped (no op in the converted model)")
    return {Col.NODE: node, "requested": requested, "ran": ran, "dtypes": dtypes,
            "honoured": all(t == requested for t in types.values()) if types else None, "names": list(types)}


def _fingerprint(files: Sequence[Path], target: str) -> str:
    """What steps 1-2 depend on: the model copy, every sample's bytes and the target (a resumed search reuses
    them; a new one on other samples or another --limit in the same folder does not)."""
    digest = hashlib.sha256(target.encode())
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _dropped_warning(dropped: Sequence[str]) -> str | None:
    """model_deploy ignores a qtable name it does not know without a word: say which sites stayed int8."""
    if not dropped:
        return None
    return (f"tpu-mlir: {len(dropped)} plan site(s) have no op in the converted model and stayed int8 "
            f"({', '.join(dropped[:5])}{', ...' if len(dropped) > 5 else ''})")


def toolchain_factory(tool: str, python: str | Path | None, target: str | None, work: Path) -> Any:
    """The toolchain `bisect --verify/--evaluator tpu-mlir` builds with (`bisect.external.ToolchainFactory`),
    made once the bisection has loaded the model and samples (the signature of RKNN's
    `hybrid.toolchain_factory`). Its Python is checked now, before any work."""
    if tool != tpu_run.TOOL:
        raise UsageError(f"bisect --verify/--evaluator: expected {tpu_run.TOOL}, found {tool}")
    if not target:
        raise UsageError("bisect --verify/--evaluator tpu-mlir: expected --profile CHIP (e.g. bm1684x), found none")
    from quantscan.toolchains.interpreter import find_python

    vendor_python = find_python(tpu_run.TOOL, python)

    def make(loaded: LoadedModel, cset: CalibSet) -> MixedTpuMlir:
        return MixedTpuMlir.create(loaded, cset, vendor_python, str(target), work)

    return make
