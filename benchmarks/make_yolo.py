"""Build a YOLOv8n-shaped 640x640 detector with seeded random weights, in numpy and onnx.helper only.

Why: issue 11's benchmark table needs the most common edge model there is, a 640x640 YOLO-family
detector, and the assets hold none at that size (ddddocr_common_det is a YOLOX at 416). The graph is
what an ultralytics YOLOv8n export looks like before folding: Conv + BatchNormalization + SiLU
(Sigmoid, Mul: opset 13 has no SiLU op), C2f blocks (Split, bottlenecks with residual Add, Concat),
SPPF (three chained MaxPools), a PAN neck (nearest Resize x2, Concat, strided Convs) and three
decoupled heads at strides 8/16/32 (box: 4x16 DFL bins, classes: 80) reshaped and concatenated to
[N, 144, 8400]; batch dim free. Weights are He-scaled, each residual's last BN damped (as
make_resnet.py does), so activations keep a realistic range.

Run: python benchmarks/make_yolo.py OUT.onnx [--seed N] [--size 640]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_resnet import INPUT, _Builder, builder_main, write_once  # noqa: E402  (benchmarks/ is not a package)

OUTPUT = "preds"
WIDTHS = (16, 32, 64, 128, 256)
"""YOLOv8n's channels: stem, then the four strided stages (P2..P5)."""
DEPTHS = (1, 2, 2, 1)
"""Bottlenecks per C2f block of stages P2..P5 (YOLOv8n)."""
BOX_BINS, CLASSES = 64, 80
STRIDES = (8, 16, 32)


class _YoloBuilder(_Builder):
    """make_resnet's builder plus the YOLOv8 blocks."""

    def _ints(self, name: str, value: list[int]) -> str:
        self.inits.append(numpy_helper.from_array(np.array(value, np.int64), name))
        return name

    def cbs(self, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1,
            gamma_scale: float = 1.0) -> str:
        """Conv, BatchNormalization, SiLU (x * sigmoid(x)), as ultralytics exports its `Conv`."""
        y = self.bn(self.conv(x, f"{name}.conv", cin, cout, k, stride), f"{name}.bn", cout, gamma_scale)
        return self.op("Mul", [y, self.op("Sigmoid", [y], f"{name}.sig")], f"{name}.silu")

    def c2f(self, x: str, name: str, cin: int, cout: int, n: int, shortcut: bool) -> str:
        """cv1 to 2c channels, split in halves, n bottlenecks on the second half, concat all, cv2."""
        c = cout // 2
        y = self.cbs(x, f"{name}.cv1", cin, 2 * c, 1)
        split = self._ints(f"{name}.split_sizes", [c, c])
        parts = [f"{name}.split.out0", f"{name}.split.out1"]
        self.nodes.append(onnx.helper.make_node("Split", [y, split], parts, name=f"{name}.split", axis=1))
        last = parts[1]
        for i in range(n):
            z = self.cbs(last, f"{name}.m{i}.cv1", c, c, 3)
            z = self.cbs(z, f"{name}.m{i}.cv2", c, c, 3, gamma_scale=0.3 if shortcut else 1.0)
            last = self.op("Add", [last, z], f"{name}.m{i}.add") if shortcut else z
            parts.append(last)
        cat = self.op("Concat", parts, f"{name}.cat", axis=1)
        return self.cbs(cat, f"{name}.cv2", (2 + n) * c, cout, 1)

    def sppf(self, x: str, name: str, c: int) -> str:
        h = c // 2
        y = self.cbs(x, f"{name}.cv1", c, h, 1)
        pools = [y]
        for i in range(3):
            pools.append(self.op("MaxPool", [pools[-1]], f"{name}.pool{i}", kernel_shape=[5, 5], pads=[2] * 4))
        return self.cbs(self.op("Concat", pools, f"{name}.cat", axis=1), f"{name}.cv2", 4 * h, c, 1)

    def up(self, x: str, name: str) -> str:
        scales = self._init(f"{name}.scales", np.array([1, 1, 2, 2], np.float32))
        return self.op("Resize", [x, "", scales], name, mode="nearest")

    def head(self, x: str, name: str, cin: int) -> str:
        """Decoupled box and class branches of one level, concatenated and flattened to [N, 144, H*W]."""
        cb, cc = max(16, WIDTHS[2] // 4, BOX_BINS), max(WIDTHS[2], min(CLASSES, 100))  # ultralytics' c2, c3
        box = self.cbs(self.cbs(x, f"{name}.box0", cin, cb, 3), f"{name}.box1", cb, cb, 3)
        box = self._conv_bias(box, f"{name}.box2", cb, BOX_BINS)
        cls = self.cbs(self.cbs(x, f"{name}.cls0", cin, cc, 3), f"{name}.cls1", cc, cc, 3)
        cls = self._conv_bias(cls, f"{name}.cls2", cc, CLASSES)
        both = self.op("Concat", [box, cls], f"{name}.cat", axis=1)
        shape = self._ints(f"{name}.shape", [0, BOX_BINS + CLASSES, -1])
        return self.op("Reshape", [both, shape], f"{name}.flat")

    def _conv_bias(self, x: str, name: str, cin: int, cout: int) -> str:
        w = self._init(f"{name}.weight", self.rng.normal(0.0, np.sqrt(1.0 / cin), (cout, cin, 1, 1)))
        b = self._init(f"{name}.bias", self.rng.normal(0.0, 0.1, cout))
        return self.op("Conv", [x, w, b], name, kernel_shape=[1, 1])


def build_yolo(seed: int = 0, size: int = 640) -> onnx.ModelProto:
    """Input [N,3,size,size] float32, output [N,144,anchors] (8400 at 640)."""
    b = _YoloBuilder(seed)
    x = b.cbs(INPUT, "stem", 3, WIDTHS[0], 3, 2)
    feats = []
    for s, n in enumerate(DEPTHS, start=1):
        x = b.cbs(x, f"down{s}", WIDTHS[s - 1], WIDTHS[s], 3, 2)
        x = b.c2f(x, f"stage{s}", WIDTHS[s], WIDTHS[s], n, shortcut=True)
        feats.append(x)
    p3, p4, p5 = feats[1], feats[2], b.sppf(feats[3], "sppf", WIDTHS[4])
    c3, c4, c5 = WIDTHS[2], WIDTHS[3], WIDTHS[4]
    t4 = b.c2f(b.op("Concat", [b.up(p5, "up5"), p4], "cat54", axis=1), "td4", c5 + c4, c4, 1, shortcut=False)
    o3 = b.c2f(b.op("Concat", [b.up(t4, "up4"), p3], "cat43", axis=1), "out3", c4 + c3, c3, 1, shortcut=False)
    d3 = b.cbs(o3, "pan3", c3, c3, 3, 2)
    o4 = b.c2f(b.op("Concat", [d3, t4], "cat34", axis=1), "out4", c3 + c4, c4, 1, shortcut=False)
    d4 = b.cbs(o4, "pan4", c4, c4, 3, 2)
    o5 = b.c2f(b.op("Concat", [d4, p5], "cat45", axis=1), "out5", c4 + c5, c5, 1, shortcut=False)
    levels = [b.head(o, f"head{i}", c) for i, (o, c) in enumerate(((o3, c3), (o4, c4), (o5, c5)))]
    b.nodes.append(onnx.helper.make_node("Concat", levels, [OUTPUT], name="head.cat", axis=2))
    anchors = sum((size // s) ** 2 for s in STRIDES)
    return b.model("yolov8n_random", ["N", 3, size, size], OUTPUT, ["N", BOX_BINS + CLASSES, anchors])


def write_yolo(path: Path, seed: int = 0, size: int = 640) -> Path:
    return write_once(path, lambda: build_yolo(seed, size))


def main() -> None:
    builder_main(__doc__ or "", build_yolo, size=640)


if __name__ == "__main__":
    main()
