"""Builders the calibration tests share: input specs, synthetic images and folders, and the
independent numpy oracle for image preprocessing (not a test module: no tests here)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from quantscan.calib import CalibSet
from quantscan.specs import Dim, InputSpec

F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)


# --- helpers -----------------------------------------------------------------------------------------


def spec(name: str, shape: Sequence[Dim], dtype: np.dtype = F32) -> InputSpec:
    return InputSpec(name, dtype, tuple(shape))


def rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def write_png(path: Path, pixels: np.ndarray) -> Path:
    Image.fromarray(pixels).save(path)
    return path


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


IMG_SPEC = spec("x", ("batch", 3, 8, 12))
BASE_PRE: dict[str, Any] = {
    "input": "x",
    "shape": [1, 3, 8, 12],
    "layout": "NCHW",
    "channel_order": "RGB",
    "scale": 1.0,
    "mean": [0.0, 0.0, 0.0],
    "std": [1.0, 1.0, 1.0],
}


def image_folder(
    tmp_path: Path, n: int = 3, pre: dict[str, Any] | None = None, h: int = 8, w: int = 12
) -> Path:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(n):
        write_png(folder / f"{i:03d}_img.png", rgb(h, w, seed=i))
    if pre is not None:
        write_json(folder / "preprocess.json", pre)
    return folder


def oracle(
    pixels: np.ndarray, *, bgr: bool, scale: float, mean: Sequence[float], std: Sequence[float], nchw: bool
) -> np.ndarray:
    """Independent re-implementation: HWC uint8 -> normalised float32 with a batch dim of 1."""
    x = pixels.astype(np.float64)
    if bgr:
        x = x[..., [2, 1, 0]]
    x = (x * scale - np.array(mean)) / np.array(std)
    if nchw:
        x = np.moveaxis(x, -1, 0)
    return x[np.newaxis].astype(np.float32)


def all_samples(cs: CalibSet) -> list[dict[str, np.ndarray]]:
    return list(cs.samples())
