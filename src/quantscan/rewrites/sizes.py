"""The sizes of a model's free input dims (H, W, a length) for `rewrite --all-for-profile`.

Why: a chip compiles one static shape. A detector exported with dynamic H/W (YOLOv8 `dynamic=True`)
got only `fix-dim batch=1` from its profile's findings, so its shape chains (the anchor grid built from
the feature maps' Shape) stayed dynamic and the errors stayed: 3 -> 3, even with a calibration set whose
images were all 320x320. The size is not the tool's to invent (a guessed 224 broke OCR lines and token
lengths before), but it is often known:

1. from the data: every calibration sample has the same size on that axis (`--calib`);
2. from the model's own metadata: ultralytics writes `imgsz` ("[640, 640]" or "640") into
   `metadata_props`, the size it was trained and exported at; it sizes an image input's two spatial axes;
3. otherwise the plan names the exact `--fix-dim INPUT:AXIS=V` to add.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from quantscan.rewrites.fix_dim import parse_dim_spec

METADATA_KEYS = ("imgsz", "img_size", "image_size")
"""metadata_props keys that hold an image model's [H, W] (ultralytics: imgsz)."""


@dataclass(frozen=True)
class OpenDim:
    """A symbolic non-batch axis of a graph input."""

    input: str
    axis: int
    param: str

    @property
    def label(self) -> str:
        return f"{self.input}:{self.axis}" + (f" ({self.param})" if self.param else "")


@dataclass
class SizePlan:
    """fix-dim settings found for the open dims, where each came from, and the dims still unsized."""

    settings: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """`INPUT:AXIS=V` settings the user must give (V: the size deployed)."""
    notes: list[str] = field(default_factory=list)


def open_dims(model: onnx.ModelProto) -> list[OpenDim]:
    """Every symbolic axis > 0 of the graph inputs (axis 0 is the batch: fix-dim batch=1 covers it)."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            if axis > 0 and not dim.dim_value:
                out.append(OpenDim(vi.name, axis, dim.dim_param))
    return out


def plan_sizes(model: onnx.ModelProto, samples: Iterable[dict[str, np.ndarray]] | None,
               given: Sequence[str] = ()) -> SizePlan:
    """Sizes for the open dims `given` (the user's --fix-dim settings) leaves open: data first, then the
    model's metadata; what neither sizes is listed in `missing`."""
    todo = [d for d in open_dims(model) if not _addressed(d, given)]
    plan = SizePlan()
    if not todo:
        return plan
    found = _from_data(todo, samples, plan) if samples is not None else {}
    if found:
        plan.sources.append("from the calibration data (one size on every sample): "
                            + ", ".join(f"{d.label}={v}" for d, v in found.items()))
    where, meta = _from_metadata(model, [d for d in todo if d not in found])
    if meta:
        plan.sources.append(f"from the model's metadata ({where}): "
                            + ", ".join(f"{d.label}={v}" for d, v in meta.items()))
    for d in todo:
        value = found.get(d) or meta.get(d)
        if value:
            plan.settings.append(f"{d.input}:{d.axis}={value}")
        else:
            plan.missing.append(f"{d.input}:{d.axis}=V" + (f" ({d.param})" if d.param else ""))
    return plan


def _addressed(dim: OpenDim, given: Sequence[str]) -> bool:
    for text in given:
        s = parse_dim_spec(text)
        if (s.input == dim.input and s.axis == dim.axis) or (s.param and s.param == dim.param):
            return True
    return False


def _from_data(todo: list[OpenDim], samples: Iterable[dict[str, np.ndarray]], plan: SizePlan) -> dict[OpenDim, int]:
    """The size of each open dim when every sample agrees on it (a sample carries batch dim 1)."""
    seen: dict[OpenDim, set[int]] = {d: set() for d in todo}
    for sample in samples:
        for d in todo:
            array = sample.get(d.input)
            if array is not None and np.ndim(array) > d.axis:
                seen[d].add(int(np.shape(array)[d.axis]))
    out: dict[OpenDim, int] = {}
    for d, values in seen.items():
        if len(values) == 1:
            out[d] = values.pop()
        elif len(values) > 1:
            shown = ", ".join(str(v) for v in sorted(values)[:5])
            plan.notes.append(f"{d.label}: the calibration samples have {len(values)} sizes ({shown}); "
                              "the deployed one is yours to give")
    return out


def _from_metadata(model: onnx.ModelProto, todo: list[OpenDim]) -> tuple[str, dict[OpenDim, int]]:
    """("imgsz=[640, 640]", sizes) from `imgsz`-like metadata, for a rank-4 input whose open axes are
    spatial (2, 3 in NCHW; 1, 2 in NHWC); ("", {}) when the model carries none."""
    props = {p.key: p.value for p in model.metadata_props}
    key = next((k for k in METADATA_KEYS if k in props), None)
    size = _parse_size(props[key]) if key else None
    if key is None or size is None:
        return "", {}
    out: dict[OpenDim, int] = {}
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in model.graph.input}
    for name in dict.fromkeys(d.input for d in todo):
        axes = sorted(d.axis for d in todo if d.input == name)
        if ranks.get(name) == 4 and axes in ([2, 3], [1, 2], [2], [3], [1]):
            spatial = [2, 3] if axes[0] >= 2 else [1, 2]
            out.update({d: size[spatial.index(d.axis)] for d in todo if d.input == name and d.axis in spatial})
    return f"{key}={props[key]}", out


def _parse_size(text: str) -> tuple[int, int] | None:
    """"[640, 640]", "(640, 480)", "640" -> (H, W); None for anything else."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return None
    if isinstance(value, int) and value > 0:
        return value, value
    if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
        return int(value[0]), int(value[1])
    return None
