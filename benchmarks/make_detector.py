"""Build a DBNet-shaped 640x640 text detector with seeded random weights, in numpy and onnx.helper only.

Why: the memory budget has to hold on the model the issue was filed for (a 640x640 DBNet was killed
at batch 8 on 24 GB), and the assets hold no detector at that size. The graph is what a DBNet
export (ResNet-18 backbone, FPN neck, differentiable-binarization head) looks like before folding:
Conv, BatchNormalization, Relu, Add, MaxPool, Resize (nearest, x2), Concat, ConvTranspose, Sigmoid;
batch dim free. Weights are He-scaled (the blocks' last BN damped, as make_resnet.py does).

Run: python benchmarks/make_detector.py OUT.onnx [--seed N] [--size 640]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_resnet import INPUT, _Builder, builder_main, write_once  # noqa: E402  (benchmarks/ is not a package)

OUTPUT = "maps"
STAGES: tuple[tuple[int, int], ...] = ((64, 1), (128, 2), (256, 2), (512, 2))
"""(channels, stride) of the four ResNet-18 stages, two basic blocks each."""
NECK = 96


def _basic(b: _Builder, x: str, name: str, cin: int, cout: int, stride: int) -> str:
    y = b.conv_bn(x, f"{name}.a", cin, cout, 3, stride, relu=True)
    y = b.conv_bn(y, f"{name}.b", cout, cout, 3, 1, relu=False, gamma_scale=0.3)
    short = x if stride == 1 and cin == cout else b.conv_bn(x, f"{name}.down", cin, cout, 1, stride, relu=False)
    return b.op("Relu", [b.op("Add", [y, short], f"{name}.add")], f"{name}.relu")


def _upsample(b: _Builder, x: str, name: str, factor: int) -> str:
    scales = b._init(f"{name}.scales", np.array([1, 1, factor, factor], np.float32))
    return b.op("Resize", [x, "", scales], name, mode="nearest")


def _deconv(b: _Builder, x: str, name: str, cin: int, cout: int) -> str:
    w = b._init(f"{name}.weight", b.rng.normal(0.0, np.sqrt(2.0 / (cin * 4)), (cin, cout, 2, 2)))
    bias = b._init(f"{name}.bias", np.zeros(cout))
    return b.op("ConvTranspose", [x, w, bias], name, kernel_shape=[2, 2], strides=[2, 2])


def build_detector(seed: int = 0, size: int = 640) -> onnx.ModelProto:
    """Input [N,3,size,size] float32, output [N,1,size,size] probability map."""
    b = _Builder(seed)
    x = b.conv_bn(INPUT, "stem", 3, 64, 7, 2, relu=True)
    x = b.op("MaxPool", [x], "stem.pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin, features = 64, []
    for s, (cout, stride) in enumerate(STAGES, start=1):
        x = _basic(b, x, f"layer{s}.0", cin, cout, stride)
        x = _basic(b, x, f"layer{s}.1", cout, cout, 1)
        features.append((x, cout))
        cin = cout
    lateral = [b.conv(f, f"neck.in{i}", c, NECK, 1, 1) for i, (f, c) in enumerate(features)]
    top = lateral[3]
    merged = [top]
    for i in (2, 1, 0):
        top = b.op("Add", [lateral[i], _upsample(b, top, f"neck.up{i}", 2)], f"neck.add{i}")
        merged.insert(0, top)
    outs = [b.conv(m, f"neck.out{i}", NECK, NECK // 4, 3, 1) for i, m in enumerate(merged)]
    outs = [o if i == 0 else _upsample(b, o, f"neck.fuse{i}", 2 ** i) for i, o in enumerate(outs)]
    fused = b.op("Concat", outs, "neck.concat", axis=1)
    y = b.conv_bn(fused, "head.conv", NECK, NECK // 4, 3, 1, relu=True)
    y = b.op("Relu", [b.bn(_deconv(b, y, "head.up1", NECK // 4, NECK // 4), "head.bn1", NECK // 4)], "head.relu1")
    y = _deconv(b, y, "head.up2", NECK // 4, 1)
    b.nodes.append(helper.make_node("Sigmoid", [y], [OUTPUT], name="head.sigmoid"))
    return b.model("dbnet_random", ["N", 3, size, size], OUTPUT, ["N", 1, size, size])


def write_detector(path: Path, seed: int = 0, size: int = 640) -> Path:
    return write_once(path, lambda: build_detector(seed, size))


def main() -> None:
    builder_main(__doc__ or "", build_detector, size=640)


if __name__ == "__main__":
    main()
