"""Build the RKNN Model Zoo's architectures at the zoo's input shapes, seeded weights, as ONNX.

Latency depends on shapes and ops, not on weights, so the fit (benchmarks/cost_fit.py) needs the
architectures only. Runs in a venv with torch, torchvision and ultralytics (not quantscan's):

    python -m venv /work/venvs/cost
    /work/venvs/cost/bin/pip install torch==2.14.1 torchvision==0.29.1 ultralytics onnx
    /work/venvs/cost/bin/python -P benchmarks/cost_zoo_build.py OUT_DIR   (-P: benchmarks/bisect.py would
    shadow the standard library's bisect)

Heads are exported as the zoo exports them (examples/*/README.md of airockchip/rknn_model_zoo v2.3.2):
- yolov8/yolo11/yolov6/yolov10 and -seg/-pose/-obb (airockchip/ultralytics_yolov8): the DFL and the box
  decoding are moved out; per level the box conv ([1, 64, H, W]), the class conv with its sigmoid and a
  ReduceSum+Clip score sum; -seg adds the mask-coefficient convs and the proto branch, -pose the keypoint
  convs, -obb the angle convs; yolov10 exports its one-to-one head;
- yolov5 and yolov5-seg (airockchip/yolov5): the anchor-based head, one 1x1 conv per level to
  3 x (5 + 80) channels (seg: 3 x (5 + 80 + 32), plus the proto branch); ultralytics' yolov5.yaml
  backbone/neck (v6.0: 6x6 stem, C3, SPPF) is the same network;
- yolov5s_relu: yolov5s with every SiLU replaced by ReLU (the zoo's yolov5s_relu);
- mobilenetv2-12 and resnet50-v2-7: torchvision's mobilenet_v2 and resnet50 (resnet50-v2 is the
  pre-activation variant; torchvision has v1: same MACs, BN+ReLU placed differently).
Approximations said as such: yolov6 n/s/m come from ultralytics' yolov6.yaml (RepVGG blocks already
re-parameterised as plain 3x3 convs with ReLU), not meituan/YOLOv6's own export.
"""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import torch
from torch import nn

SEED = 0
ZOO = {
    # name: (builder, kwargs)
    "yolov5n": ("yolov5", {"scale": "n"}), "yolov5s": ("yolov5", {"scale": "s"}),
    "yolov5m": ("yolov5", {"scale": "m"}), "yolov5s_relu": ("yolov5", {"scale": "s", "relu": True}),
    "yolov5n-seg": ("yolov5", {"scale": "n", "seg": True}), "yolov5s-seg": ("yolov5", {"scale": "s", "seg": True}),
    "yolov5m-seg": ("yolov5", {"scale": "m", "seg": True}),
    "yolov6n": ("ultra", {"yaml": "yolov6n.yaml"}), "yolov6s": ("ultra", {"yaml": "yolov6s.yaml"}),
    "yolov6m": ("ultra", {"yaml": "yolov6m.yaml"}),
    "yolov8n": ("ultra", {"yaml": "yolov8n.yaml"}), "yolov8s": ("ultra", {"yaml": "yolov8s.yaml"}),
    "yolov8m": ("ultra", {"yaml": "yolov8m.yaml"}),
    "yolov8n-seg": ("ultra", {"yaml": "yolov8n-seg.yaml"}), "yolov8s-seg": ("ultra", {"yaml": "yolov8s-seg.yaml"}),
    "yolov8m-seg": ("ultra", {"yaml": "yolov8m-seg.yaml"}),
    "yolov8n-pose": ("ultra", {"yaml": "yolov8n-pose.yaml"}), "yolov8n-obb": ("ultra", {"yaml": "yolov8n-obb.yaml"}),
    "yolov10n": ("ultra", {"yaml": "yolov10n.yaml"}), "yolov10s": ("ultra", {"yaml": "yolov10s.yaml"}),
    "yolo11n": ("ultra", {"yaml": "yolo11n.yaml"}), "yolo11s": ("ultra", {"yaml": "yolo11s.yaml"}),
    "yolo11m": ("ultra", {"yaml": "yolo11m.yaml"}),
    "mobilenetv2-12": ("torchvision", {"name": "mobilenet_v2", "size": 224}),
    "resnet50-v2-7": ("torchvision", {"name": "resnet50", "size": 224}),
}


def rk_head_forward(self: nn.Module, x: list[torch.Tensor]) -> list[torch.Tensor]:
    """The zoo's head: raw box conv, sigmoid class conv and its clipped sum per level (+ task convs)."""
    one2one = getattr(self, "one2one_cv2", None) is not None
    cv2 = self.one2one_cv2 if one2one else self.cv2
    cv3 = self.one2one_cv3 if one2one else self.cv3
    cv4 = getattr(self, "one2one_cv4" if one2one else "cv4", None)
    outs: list[torch.Tensor] = []
    for i in range(self.nl):
        cls = cv3[i](x[i]).sigmoid()
        outs += [cv2[i](x[i]), cls, torch.clamp(cls.sum(1, keepdim=True), 0, 1)]
        if cv4 is not None:
            outs.append(cv4[i](x[i]))
    proto = getattr(self, "proto", None)
    if proto is not None:
        outs.append(proto(x[0]))
    return outs


class AnchorHead(nn.Module):
    """yolov5's anchor-based head (airockchip/yolov5 export): a 1x1 conv per level, plus protos for -seg."""

    def __init__(self, old: nn.Module, seg: bool, width: float) -> None:
        super().__init__()
        from ultralytics.nn.modules import Proto

        self.f, self.i, self.type, self.np = old.f, old.i, "AnchorHead", 0
        ch = [seq[0].conv.in_channels for seq in old.cv2]
        per = 5 + 80 + (32 if seg else 0)
        self.m = nn.ModuleList(nn.Conv2d(c, 3 * per, 1) for c in ch)
        # yolov5-seg's Proto has 256 x width channels (its yaml: Segment [nc, anchors, 32, 256], scaled by width)
        self.proto = Proto(ch[0], int(math.ceil(256 * width / 8) * 8), 32) if seg else None
        self.stride = old.stride

    def forward(self, x: list[torch.Tensor]) -> list[torch.Tensor]:
        outs = [m(t) for m, t in zip(self.m, x, strict=True)]
        if self.proto is not None:
            outs.append(self.proto(x[0]))
        return outs


def build_ultra(yaml: str) -> nn.Module:
    from ultralytics.nn.tasks import DetectionModel, OBBModel, PoseModel, SegmentationModel, yaml_model_load

    cfg = yaml_model_load(yaml)
    kind = SegmentationModel if "-seg" in yaml else PoseModel if "-pose" in yaml else OBBModel if "-obb" in yaml \
        else DetectionModel
    model = kind(cfg, verbose=False)
    head = model.model[-1]
    head.forward = types.MethodType(rk_head_forward, head)
    return model


def build_yolov5(scale: str, relu: bool = False, seg: bool = False) -> nn.Module:
    from ultralytics.nn.modules import Conv
    from ultralytics.nn.tasks import DetectionModel, yaml_model_load

    cfg = yaml_model_load("yolov5.yaml")
    cfg["scale"] = scale
    if relu:
        cfg["activation"] = "nn.ReLU()"
    try:
        model = DetectionModel(cfg, verbose=False)
    finally:
        Conv.default_act = nn.SiLU()  # parse_model sets it on the class: later models must not inherit ReLU
    width = cfg["scales"][scale][1]
    model.model[-1] = AnchorHead(model.model[-1], seg, width)
    return model


def build_torchvision(name: str) -> nn.Module:
    import torchvision

    return getattr(torchvision.models, name)(weights=None)


def static_chunk(self: torch.Tensor, chunks: int, dim: int = 0) -> tuple[torch.Tensor, ...]:
    """`chunk` as a split with constant sizes: the tracer otherwise writes Shape/Gather/Div chains into the
    graph (a converter folds them; shape inference does not, and the kernels after them lose their sizes)."""
    size = int(self.shape[dim])
    return self.split(-(-size // chunks), dim)


def static_splits(model: nn.Module) -> None:
    """Modules with a split-based forward (C2f and kin) use it, as ultralytics' own ONNX export does."""
    for m in model.modules():
        if hasattr(m, "forward_split"):
            m.forward = m.forward_split


def export(name: str, out: Path) -> Path:
    builder, kw = ZOO[name]
    torch.manual_seed(SEED)
    size = kw.pop("size", 640) if builder == "torchvision" else 640
    model = {"ultra": lambda: build_ultra(**kw), "yolov5": lambda: build_yolov5(**kw),
             "torchvision": lambda: build_torchvision(**kw)}[builder]()
    model.eval()
    static_splits(model)
    if hasattr(model, "fuse") and builder != "torchvision":
        model.fuse(verbose=False) if "verbose" in model.fuse.__code__.co_varnames else model.fuse()
    path = out / f"{name}.onnx"
    dummy = torch.zeros(1, 3, size, size)
    with torch.no_grad():
        torch.onnx.export(model, (dummy,), str(path), opset_version=12, input_names=["images"], dynamo=False,
                          do_constant_folding=True)
    return path


def main(argv: list[str]) -> int:
    torch.Tensor.chunk = static_chunk  # type: ignore[method-assign]
    out = Path(argv[1] if len(argv) > 1 else "/tmp/cost_zoo")
    out.mkdir(parents=True, exist_ok=True)
    names = argv[2:] or list(ZOO)
    for name in names:
        if (out / f"{name}.onnx").is_file():
            continue
        path = export(name, out)
        print(f"{name}: {path} ({path.stat().st_size / 1e6:.1f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
