"""silero-vad as its wheel ships it (If on `sr`): `scan --const sr=16000` against rewrite-then-scan.

Route A is one command: `scan silero_vad.onnx --const sr=16000 --state stateN=state --input-shape
state:1=1` (the scan folds the If itself, scanning/settings.py). Route B is the two-step workaround:
`rewrite --fix-dim input:0=1 --fix-dim input:1=576 --fix-dim state:1=1 --freeze-input sr=16000`,
then scan the frozen file with `--state stateN=state`. Printed per repeat, both routes back to back
in this one run: wall time of the CLI processes (fresh processes, imports included), their ratio,
the exit codes, the headline cosine of each, how many layers.csv rows and LSTM rows each has, and
the largest difference between the two layers.csv files over every numeric column. Nothing here is
asserted: the machine may be shared.

    python benchmarks/const_setting.py [--model silero_vad.onnx] [--limit 64] [--repeats 2]

The model defaults to the wheel's member as extracted under /work/scratch/compat13 (`pip download
--no-deps silero-vad==6.2.3` and read `silero_vad/data/silero_vad.onnx` out of the wheel elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ASSETS = Path(__file__).resolve().parents[2] / "shared" / "assets"
SHIPPED = Path("/work/scratch/compat13/silero_vad.onnx")


def quantscan(*args: str | Path) -> tuple[float, int]:
    """(wall seconds, exit code) of one `python -m quantscan ...` process."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "quantscan", *map(str, args)], capture_output=True, text=True)
    return time.perf_counter() - t0, proc.returncode


def scan_args(model: Path, calib: Path, out: Path, limit: int, *extra: str) -> list[str | Path]:
    return ["scan", model, "--calib", calib, "--out", out, "--limit", str(limit), "--state", "stateN=state",
            "--no-report", "--no-gain", "--quiet", *extra]


def layers_gap(a: Path, b: Path) -> float:
    """Largest |difference| between two layers.csv over their numeric columns (NaN where both are NaN: 0)."""
    left, right = pd.read_csv(a), pd.read_csv(b)
    if list(left["node"]) != list(right["node"]):
        return float("inf")
    num = left.select_dtypes("number").columns
    gap = (left[num] - right[num]).abs().to_numpy()
    return float(np.nanmax(gap)) if gap.size else 0.0


def summary(out: Path) -> tuple[float, int, int]:
    """(headline cosine, layers.csv rows, LSTM rows) of a run folder."""
    layers = pd.read_csv(out / "layers.csv")
    cosine = json.loads((out / "run.json").read_text())["headline"]["cosine"]
    return float(cosine), len(layers), int((layers["op_type"] == "LSTM").sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=SHIPPED)
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    calib = ASSETS / "calib" / "silero_vad_openvino_16k"
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}; limit {args.limit}; {args.model}")
    print("| repeat | A: scan --const (s) | B: rewrite + scan (s) | A/B | exit A, B | cosine A | cosine B "
          "| rows A/B | LSTM rows A/B | max abs layers.csv A-B |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for k in range(args.repeats):
            a_out, b_out, frozen = work / f"a{k}", work / f"b{k}", work / f"frozen{k}.onnx"
            wall_a, rc_a = quantscan(*scan_args(args.model, calib, a_out, args.limit, "--const", "sr=16000",
                                                "--input-shape", "state:1=1"))
            wall_r, rc_r = quantscan("rewrite", args.model, "--fix-dim", "input:0=1", "--fix-dim", "input:1=576",
                                     "--fix-dim", "state:1=1", "--freeze-input", "sr=16000", "-o", frozen)
            wall_s, rc_s = quantscan(*scan_args(frozen, calib, b_out, args.limit))
            wall_b, rc_b = wall_r + wall_s, max(rc_r, rc_s)
            if rc_a or rc_b:
                print(f"| {k + 1} | {wall_a:.1f} | {wall_b:.1f} | | {rc_a}, {rc_b} | | | | | |")
                continue
            cos_a, rows_a, lstm_a = summary(a_out)
            cos_b, rows_b, lstm_b = summary(b_out)
            gap = layers_gap(a_out / "layers.csv", b_out / "layers.csv")
            print(f"| {k + 1} | {wall_a:.1f} | {wall_b:.1f} | {wall_a / wall_b:.2f} | {rc_a}, {rc_b} | {cos_a:.5f} "
                  f"| {cos_b:.5f} | {rows_a}/{rows_b} | {lstm_a}/{lstm_b} | {gap:.3g} |")
    print(f"load average after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
