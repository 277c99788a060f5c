"""Build a ResNet-50-shaped ONNX model with seeded random weights, in numpy and onnx.helper only.

Why: the scan benchmark needs one model much larger than the asset set (25 M parameters, 53 convs,
16 bottleneck blocks at realistic channel counts) without downloading weights or needing torch. The
graph is what a torchvision ResNet-50 (v1.5: stride on the 3x3 conv) export looks like before any
folding: Conv, BatchNormalization, Relu, Add, MaxPool, GlobalAveragePool, Flatten, Gemm, batch dim
free. Weights are He-scaled and each block's last BatchNormalization has a small gamma so activations
stay in a realistic range through 16 residual additions instead of growing 2x per block.

Run: python benchmarks/make_resnet.py OUT.onnx [--seed N]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

STAGES: tuple[tuple[int, int, int], ...] = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))
EXPANSION = 4
OPSET = 13
INPUT = "input"
OUTPUT = "logits"


class _Builder:
    """Accumulates nodes and initializers; names are unique by construction (prefix + counter)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def _init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def conv(self, x: str, name: str, cin: int, cout: int, k: int, stride: int) -> str:
        """Conv without bias (as torchvision exports it: the following BN carries the shift)."""
        std = np.sqrt(2.0 / (cin * k * k))
        w = self._init(f"{name}.weight", self.rng.normal(0.0, std, (cout, cin, k, k)))
        self.nodes.append(helper.make_node(
            "Conv", [x, w], [f"{name}.out"], name=name, kernel_shape=[k, k], strides=[stride, stride],
            pads=[k // 2] * 4,
        ))
        return f"{name}.out"

    def bn(self, x: str, name: str, c: int, gamma_scale: float = 1.0) -> str:
        """BatchNormalization with per-channel spread, so per-channel ranges differ as in trained nets."""
        rng = self.rng
        params = [
            self._init(f"{name}.scale", rng.uniform(0.5, 1.5, c) * gamma_scale),
            self._init(f"{name}.bias", rng.normal(0.0, 0.1, c)),
            self._init(f"{name}.mean", rng.normal(0.0, 0.1, c)),
            self._init(f"{name}.var", rng.uniform(0.5, 2.0, c)),
        ]
        self.nodes.append(helper.make_node(
            "BatchNormalization", [x, *params], [f"{name}.out"], name=name, epsilon=1e-5
        ))
        return f"{name}.out"

    def op(self, op_type: str, inputs: list[str], name: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [f"{name}.out"], name=name, **attrs))
        return f"{name}.out"

    def conv_bn(self, x: str, name: str, cin: int, cout: int, k: int, stride: int, *, relu: bool,
                gamma_scale: float = 1.0) -> str:
        y = self.bn(self.conv(x, f"{name}.conv", cin, cout, k, stride), f"{name}.bn", cout, gamma_scale)
        return self.op("Relu", [y], f"{name}.relu") if relu else y

    def bottleneck(self, x: str, name: str, cin: int, width: int, stride: int) -> str:
        cout = width * EXPANSION
        y = self.conv_bn(x, f"{name}.a", cin, width, 1, 1, relu=True)
        y = self.conv_bn(y, f"{name}.b", width, width, 3, stride, relu=True)
        y = self.conv_bn(y, f"{name}.c", width, cout, 1, 1, relu=False, gamma_scale=0.2)
        short = x
        if stride != 1 or cin != cout:
            short = self.conv_bn(x, f"{name}.down", cin, cout, 1, stride, relu=False)
        return self.op("Relu", [self.op("Add", [y, short], f"{name}.add")], f"{name}.relu")

    def fc(self, x: str, cin: int, cout: int) -> str:
        w = self._init("fc.weight", self.rng.normal(0.0, np.sqrt(1.0 / cin), (cout, cin)))
        b = self._init("fc.bias", self.rng.normal(0.0, 0.01, cout))
        self.nodes.append(helper.make_node("Gemm", [x, w, b], [OUTPUT], name="fc", transB=1))
        return OUTPUT

    def model(self, name: str, input_shape: list[int | str], output: str,
              output_shape: list[int | str]) -> onnx.ModelProto:
        """The checked model of the nodes built so far: float input INPUT, one float output."""
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, input_shape)],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, output_shape)],
            initializer=self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="quantscan-benchmarks")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def build_resnet50(seed: int = 0, classes: int = 1000) -> onnx.ModelProto:
    """The whole network; input [N,3,224,224] float32, output [N,classes] logits."""
    b = _Builder(seed)
    x = b.conv_bn(INPUT, "stem", 3, 64, 7, 2, relu=True)
    x = b.op("MaxPool", [x], "stem.pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for s, (width, blocks, stride) in enumerate(STAGES, start=1):
        for i in range(blocks):
            x = b.bottleneck(x, f"layer{s}.{i}", cin, width, stride if i == 0 else 1)
            cin = width * EXPANSION
    x = b.op("GlobalAveragePool", [x], "pool")
    x = b.op("Flatten", [x], "flatten", axis=1)
    b.fc(x, cin, classes)
    return b.model("resnet50_random", ["N", 3, 224, 224], OUTPUT, ["N", classes])


def write_once(path: Path, build: Callable[[], onnx.ModelProto]) -> Path:
    """Write the model once; an existing file is reused (every seeded build here is deterministic)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(build(), str(path))
    return path


def write_resnet50(path: Path, seed: int = 0) -> Path:
    return write_once(path, lambda: build_resnet50(seed))


def builder_main(doc: str, build: Callable[..., onnx.ModelProto], size: int | None = None) -> None:
    """The command line every make_*.py shares: OUT, --seed, and --size where the model has one."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    if size is not None:
        ap.add_argument("--size", type=int, default=size)
    a = ap.parse_args()
    onnx.save(build(a.seed) if size is None else build(a.seed, a.size), str(a.out))
    print(f"wrote {a.out} ({a.out.stat().st_size / 1e6:.1f} MB)")


def main() -> None:
    builder_main(__doc__ or "", build_resnet50)


if __name__ == "__main__":
    main()
