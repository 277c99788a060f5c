"""The image preprocessing contract: `preprocess.json` and the flags laid over it, validated.

Why its own module: every key is checked against the model input it names before any image is
decoded, and each error names where the bad value came from (the file's key or the flag), so a
long run never starts on a contract that cannot hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantscan.calib.checks import fixed_dim, fmt
from quantscan.calib.folder import PREPROCESS_NAME
from quantscan.errors import CalibrationError, FileError, QuantscanError, UsageError
from quantscan.readers.jsonfile import read_json
from quantscan.specs import InputSpec

LAYOUTS = ("NCHW", "NHWC")
CHANNEL_ORDERS = ("RGB", "BGR", "GRAY")
RESIZE_MODES = ("stretch", "keep_ratio_pad")
MAX_IMAGE_SIDE = 8192
"""Largest height or width an image is resized to (README, CONTRACT): a preprocess.json asking for a
100000x100000 resize would allocate ~120 GB per image; 8192² RGB float32 is 0.8 GB, already a lot."""
ASPECT_TOLERANCE = 0.10
"""A resize that changes an image's width/height ratio by more than this squashes what the model sees
(an OCR line 1365×64 stretched to 256×64 keeps 19% of its width): warned, with the worst file named."""
INTERPOLATION = "bilinear"
"""The resampling `preprocess_image` uses (Pillow BILINEAR), recorded in the contract."""
SIZES_RECORDED = 20
"""How many distinct source sizes run.json lists (with their image counts) before it only counts them."""


@dataclass(frozen=True)
class Preprocess:
    """A validated image preprocessing contract for one model input."""

    input: str
    layout: str
    channel_order: str
    channels: int
    height: int | None
    width: int | None
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize: str
    pad_value: tuple[float, ...]
    labels: tuple[str, ...] | None
    files: tuple[str, ...] | None


class PreprocessKeys:
    """Merged preprocessing keys that remember where each came from, so errors name the source."""

    def __init__(self, from_file: Mapping[str, Any], file_name: str | None, flags: Mapping[str, Any]) -> None:
        self.values: dict[str, Any] = dict(from_file)
        self.origin: dict[str, str] = {k: file_name or "preprocess" for k in from_file}
        for key, value in flags.items():
            if value is not None:
                self.values[key] = value
                self.origin[key] = "--" + key.replace("_", "-")

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def bad(self, key: str, expected: str, found: Any) -> QuantscanError:
        """The error to raise for a bad value: UsageError for a flag, CalibrationError for a file."""
        origin = self.origin.get(key, "preprocess")
        kind = UsageError if origin.startswith("--") else CalibrationError
        where = origin if origin.startswith("--") else f"{origin}: '{key}'"
        return kind(f"{where}: expected {expected}, found {found!r}")


def resized_size(width: int, height: int, pre: Preprocess) -> tuple[int, int]:
    """(W, H) an image of `width`×`height` is resized to before padding: the model's fixed sides for
    `stretch`, the largest size that fits them at the same ratio for `keep_ratio_pad`."""
    tw, th = pre.width, pre.height
    if tw is None and th is None:
        return width, height
    if pre.resize == "stretch":
        return tw or width, th or height
    ratio = min(r for r in ((tw / width) if tw else None, (th / height) if th else None) if r is not None)
    size = (max(1, round(width * ratio)), max(1, round(height * ratio)))
    return min(size[0], tw or size[0]), min(size[1], th or size[1])


def aspect_change(width: int, height: int, pre: Preprocess) -> float:
    """Factor (≥ 1) by which resizing changes the width/height ratio: 1 when the ratio is kept."""
    w2, h2 = resized_size(width, height, pre)
    change = (w2 / h2) / (width / height)
    return max(change, 1 / change)


def aspect_warning(sizes: Mapping[str, tuple[int, int]], pre: Preprocess) -> str | None:
    """One warning when resizing changes some images' aspect ratio by more than 10%, naming the worst."""
    changed = {name: aspect_change(w, h, pre) for name, (w, h) in sizes.items()}
    bad = {name: c for name, c in changed.items() if c - 1 > ASPECT_TOLERANCE}
    if not bad:
        return None
    worst = max(bad, key=lambda n: bad[n])
    w, h = sizes[worst]
    w2, h2 = resized_size(w, h, pre)
    return (f"resize {pre.resize} changes the aspect ratio of {len(bad)} of {len(sizes)} image(s) by more than "
            f"{ASPECT_TOLERANCE:.0%} (worst {worst}: {w}x{h} -> {w2}x{h2}, ratio x{(w2 / h2) / (w / h):.2f}): "
            "the model sees squashed content; use resize keep_ratio_pad or an input size that fits the images, "
            "unless the model's own preprocessing stretches too (then this is what it was trained on)")


def contract_record(pre: Preprocess, dtype: str, sizes: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """The preprocessing as applied, for run.json: what a deployment must reproduce to feed the model
    the same numbers (order of operations: decode, channel order, resize, pad, ×scale, −mean, ÷std,
    layout, dtype)."""
    counts: dict[tuple[int, int], int] = {}
    for size in sizes:
        counts[size] = counts.get(size, 0) + 1
    common = sorted(counts.items(), key=lambda kv: (-kv[1], kv))[:SIZES_RECORDED]
    changes = [aspect_change(w, h, pre) for w, h in counts]
    return {
        "kind": "images",
        "layout": pre.layout,
        "channel_order": pre.channel_order,
        "resize": pre.resize,
        "interpolation": INTERPOLATION,
        "size": {"height": pre.height, "width": pre.width},
        "pad_value": list(pre.pad_value) if pre.resize == "keep_ratio_pad" else None,
        "scale": pre.scale,
        "mean": list(pre.mean),
        "std": list(pre.std),
        "dtype": dtype,
        "source_sizes": [{"width": w, "height": h, "images": n} for (w, h), n in common],
        "distinct_source_sizes": len(counts),
        "max_aspect_change": round(max(changes), 4) if changes else 1.0,
        "formula": "((pixels in channel_order, resized, padded) * scale - mean) / std, laid out as layout",
    }


def preprocess_keys(folder: Path, preprocess: str | Path | None, overrides: Mapping[str, Any]) -> PreprocessKeys:
    """Read the preprocess file (given, else the folder's), then lay the flag values over it."""
    flags = {k: v for k, v in overrides.items() if v is not None}
    path = Path(preprocess) if preprocess is not None else folder / PREPROCESS_NAME
    if preprocess is not None and not path.is_file():
        raise CalibrationError(f"--preprocess: expected a JSON file, found nothing at {path}")
    if not path.is_file():
        if flags:
            return PreprocessKeys({}, None, flags)
        raise CalibrationError(
            f"{folder} holds images but no {PREPROCESS_NAME}: expected preprocessing keys "
            "(give --preprocess FILE, or the keys as flags: --layout, --channel-order, --scale, --mean, --std, "
            "--resize; the input and its shape come from the model, --input-shape NAME:D0,D1,... fixes free dims)"
        )
    return PreprocessKeys(_read_json_object(path), str(path), flags)


def _read_json_object(path: Path) -> dict[str, Any]:
    """The preprocessing keys of a preprocess.json (readers.jsonfile: every decode error and limit one line)."""
    try:
        data = read_json(path, PREPROCESS_NAME if path.name == PREPROCESS_NAME else "--preprocess")
    except FileError as exc:
        raise CalibrationError(str(exc)) from None
    if not isinstance(data, dict):
        raise CalibrationError(
            f"{path}: expected a JSON object of preprocessing keys, found {type(data).__name__}"
        )
    return data


def parse_preprocess(
    keys: PreprocessKeys, specs: Mapping[str, InputSpec], consts: Mapping[str, np.ndarray]
) -> Preprocess:
    """Validate the preprocessing keys against the model input they name."""
    name = _pick_input(keys, specs, consts)
    spec = specs[name]
    layout = _choice(keys, "layout", LAYOUTS, "NCHW")
    order = _choice(keys, "channel_order", CHANNEL_ORDERS, "RGB")
    dims = _image_dims(keys, spec)
    c_axis, h_axis, w_axis = (1, 2, 3) if layout == "NCHW" else (3, 1, 2)
    want_c = 1 if order == "GRAY" else 3
    channels = dims[c_axis]
    if channels is not None and channels not in (1, 3):
        raise keys.bad("layout", f"a layout whose channel axis holds 1 or 3 in {fmt(dims)}", layout)
    if channels is not None and channels != want_c:
        raise keys.bad(
            "channel_order",
            f"an order giving the {channels} channel(s) of input '{name}' "
            f"(shape {fmt(spec.shape)}, {layout})",
            order,
        )
    return Preprocess(
        input=name,
        layout=layout,
        channel_order=order,
        channels=want_c,
        height=dims[h_axis],
        width=dims[w_axis],
        scale=_number(keys, "scale", 1.0),
        mean=_per_channel(keys, "mean", want_c, 0.0),
        std=_nonzero(keys, _per_channel(keys, "std", want_c, 1.0)),
        resize=_choice(keys, "resize", RESIZE_MODES, "stretch", upper=False),
        pad_value=_per_channel(keys, "pad_value", want_c, 0.0),
        labels=_str_list(keys, "labels"),
        files=_str_list(keys, "files"),
    )


def _pick_input(keys: PreprocessKeys, specs: Mapping[str, InputSpec], consts: Mapping[str, np.ndarray]) -> str:
    name = keys.get("input")
    free = [n for n in specs if n not in consts]
    if name is None:
        if len(free) == 1:
            return free[0]
        raise CalibrationError(
            f"preprocessing key 'input' missing: expected one of {', '.join(free) or '(none)'}, "
            "found no 'input'"
        )
    if not isinstance(name, str) or name not in specs:
        raise keys.bad("input", f"a model input ({', '.join(specs)})", name)
    if name in consts:
        raise keys.bad("input", f"an input not given by --const {name}", name)
    return str(name)


def _choice(keys: PreprocessKeys, key: str, allowed: tuple[str, ...], default: str, *, upper: bool = True) -> str:
    value = keys.get(key, default)
    text = str(value).strip()
    text = text.upper() if upper else text.lower()
    if not isinstance(value, str) or text not in allowed:
        raise keys.bad(key, " or ".join(allowed), value)
    return text


def _image_dims(keys: PreprocessKeys, spec: InputSpec) -> list[int | None]:
    """Merge the preprocess `shape` with the declared shape: fixed wins, conflicts are errors."""
    raw = keys.get("shape", list(spec.shape))
    dims = _parse_shape(keys, raw)
    if len(spec.shape) != 4 or len(dims) != 4:
        raise keys.bad("shape", f"a 4-d image shape matching input '{spec.name}' {fmt(spec.shape)}", raw)
    merged: list[int | None] = [None]
    for own, declared in zip(dims[1:], spec.shape[1:], strict=True):
        fixed = fixed_dim(declared)
        if own is not None and fixed is not None and own != fixed:
            raise keys.bad("shape", f"a shape fitting input '{spec.name}' {fmt(spec.shape)}", raw)
        merged.append(own if own is not None else fixed)
    if any(d is not None and d > MAX_IMAGE_SIDE for d in merged[1:]):
        raise keys.bad("shape", f"image sides of at most {MAX_IMAGE_SIDE} pixels (the documented limit)", raw)
    return merged


def _parse_shape(keys: PreprocessKeys, raw: Any) -> list[int | None]:
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple):
        raise keys.bad("shape", "a list like [1,3,224,224]", raw)
    dims: list[int | None] = []
    for item in items:
        if isinstance(item, str) and item.strip().lstrip("-").isdigit():
            item = int(item)
        if isinstance(item, bool) or isinstance(item, float):
            raise keys.bad("shape", 'integer or free ("H", "W", null) dims', raw)
        if isinstance(item, int) and (item == 0 or item < -1):
            raise keys.bad("shape", 'positive dims (or free: "H", "W", null, -1)', raw)
        dims.append(item if isinstance(item, int) and item > 0 else None)
    return dims


def _number(keys: PreprocessKeys, key: str, default: float) -> float:
    value = keys.get(key, default)
    number = _to_float(value)
    if number is None or not math.isfinite(number):
        raise keys.bad(key, "a finite number", value)
    return number


def _to_float(value: Any) -> float | None:
    """A number from JSON or a flag string ("0.5", "1/255")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        parts = value.split("/")
        try:
            nums = [float(p) for p in parts]
        except ValueError:
            return None
        if len(nums) == 2 and nums[1] != 0:
            return nums[0] / nums[1]
        return nums[0] if len(nums) == 1 else None
    return None


def _per_channel(keys: PreprocessKeys, key: str, channels: int, default: float) -> tuple[float, ...]:
    value = keys.get(key, default)
    items = value.split(",") if isinstance(value, str) else value
    items = items if isinstance(items, list | tuple) else [items]
    numbers = [_to_float(v) for v in items]
    if any(n is None or not math.isfinite(n) for n in numbers) or len(numbers) not in (1, channels):
        raise keys.bad(key, f"{channels} number(s), one per channel", value)
    floats = [float(n) for n in numbers if n is not None]
    return tuple(floats * channels) if len(floats) == 1 else tuple(floats)


def _nonzero(keys: PreprocessKeys, std: tuple[float, ...]) -> tuple[float, ...]:
    """A standard deviation is positive: 0 divides to Inf, a negative one silently flips the image."""
    if any(s <= 0 for s in std):
        raise keys.bad("std", "positive values (a standard deviation is > 0)", keys.get("std"))
    return std


def _str_list(keys: PreprocessKeys, key: str) -> tuple[str, ...] | None:
    value = keys.get(key)
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items or any(isinstance(v, dict | list) for v in items):
        raise keys.bad(key, "a non-empty list of names", value)
    return tuple(str(v).strip() for v in items)
