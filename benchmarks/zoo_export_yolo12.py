"""Export the YOLOv12 helmet detector shipped in `helmet-detector==2.1.0` to ONNX with ultralytics' exporter.

Why: issue 26 asks for a transformer detector in the zoo. No reachable registry ships DETR-family weights;
`helmet-detector` (MIT) ships `helmet_detector_pkg/weights/best.pt`, a YOLOv12-m checkpoint (2 classes,
imgsz 640) whose A2C2f blocks hold area-attention (ABlock/AAttn: 1x1 conv projections, then attention as
MatMul, softmax, MatMul over each of 4 areas of the map): transformer blocks inside a YOLO detector.

The checkpoint was trained with the YOLOv12 authors' fork of ultralytics (it says version 8.3.63). Its
AAttn keeps `qk` and `v` as two convs and a 5x5 depth-wise `pe` on v; upstream ultralytics (which has A2C2f
since 8.3.78 and is what PyPI offers) builds one `qkv` conv and a 7x7 `pe`, so its forward cannot run
these modules. `fork_area_attention` below is the fork's CPU forward, written out: q·k scaled by
head_dim^-0.5, softmax spelled as max / exp / sum / div (the fork's own spelling, so the ONNX graph holds
ReduceMax, Sub, Exp, ReduceSum, Div rather than one Softmax), v weighted, plus pe(v), then proj.
Everything else (C3k2, A2C2f, Detect, the exporter itself) is upstream's, unchanged.

Export: static [1, 3, 640, 640] `images`, output `output0` [1, 6, 8400] (4 box coordinates in pixels,
2 class scores, no objectness), opset 17, TorchScript exporter (ultralytics passes dynamo=False), no
simplifier, no NMS. ultralytics stamps `date` = now into the metadata: it is set to the checkpoint's own
training date so that two exports are byte-identical (checked here: the model is exported twice).

It runs in its own venv, never in quantscan's (torch 2.14.1 CPU + torchvision 0.29.1, ultralytics==8.3.253,
onnx; see benchmarks/RESULTS.md):
    /work/venvs/zoo-ultra/bin/python benchmarks/zoo_export_yolo12.py best.pt out.onnx [imgsz]
benchmarks/zoo.py calls it so when it fetches the `helmet_yolo12` entry (its `derive` field).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")  # no update checks, no downloads: everything is local
os.environ.setdefault("YOLO_AUTOINSTALL", "False")

import onnx  # noqa: E402
import torch  # noqa: E402
from ultralytics import YOLO  # noqa: E402
from ultralytics.nn.modules import block  # noqa: E402

UPSTREAM_FORWARD = block.AAttn.forward


def fork_area_attention(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The fork's AAttn forward (CPU path) for modules that carry its `qk`/`v` convs; upstream's otherwise."""
    if not hasattr(self, "qk"):
        return UPSTREAM_FORWARD(self, x)
    batch, channels, height, width = x.shape
    tokens = height * width
    qk = self.qk(x).flatten(2).transpose(1, 2)
    v = self.v(x)
    positional = self.pe(v)
    v = v.flatten(2).transpose(1, 2)
    if self.area > 1:  # each area is a batch item of its own: attention never crosses areas
        qk = qk.reshape(batch * self.area, tokens // self.area, channels * 2)
        v = v.reshape(batch * self.area, tokens // self.area, channels)
        batch, tokens, _ = qk.shape
    q, k = qk.split([channels, channels], dim=2)
    q = q.transpose(1, 2).view(batch, self.num_heads, self.head_dim, tokens)
    k = k.transpose(1, 2).view(batch, self.num_heads, self.head_dim, tokens)
    v = v.transpose(1, 2).view(batch, self.num_heads, self.head_dim, tokens)
    attn = (q.transpose(-2, -1) @ k) * (self.head_dim ** -0.5)
    exp_attn = torch.exp(attn - attn.max(dim=-1, keepdim=True).values)
    attn = exp_attn / exp_attn.sum(dim=-1, keepdim=True)
    out = (v @ attn.transpose(-2, -1)).permute(0, 3, 1, 2)
    if self.area > 1:
        out = out.reshape(batch // self.area, tokens * self.area, channels)
        batch, tokens, _ = out.shape
    out = out.reshape(batch, height, width, channels).permute(0, 3, 1, 2)
    return self.proj(out + positional)


def checkpoint_date(weights: Path) -> str:
    """The training date the checkpoint records (stands in for the export time in the metadata)."""
    return str(torch.load(weights, map_location="cpu", weights_only=False).get("date", ""))


def export_once(weights: Path, imgsz: int, folder: Path) -> bytes:
    """One export in `folder` (ultralytics writes beside the weights), metadata date pinned."""
    local = folder / "helmet_yolo12.pt"
    shutil.copyfile(weights, local)
    written = YOLO(str(local), task="detect").export(format="onnx", imgsz=imgsz, opset=17, simplify=False,
                                                     dynamic=False, half=False, nms=False, device="cpu")
    model = onnx.load(written)
    for prop in model.metadata_props:
        if prop.key == "date":
            prop.value = checkpoint_date(weights)
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def main(weights: str, out: str, imgsz: str = "640") -> None:
    torch.manual_seed(0)
    block.AAttn.forward = fork_area_attention
    digests, data = set(), b""
    for attempt in range(2):
        with tempfile.TemporaryDirectory() as tmp:
            data = export_once(Path(weights), int(imgsz), Path(tmp))
        digests.add(hashlib.sha256(data).hexdigest())
        print(f"export {attempt + 1}: sha256 {hashlib.sha256(data).hexdigest()}", file=sys.stderr)
    if len(digests) != 1:
        raise SystemExit(f"two exports differ: {sorted(digests)}")
    Path(out).write_bytes(data)


if __name__ == "__main__":
    main(*sys.argv[1:])
