"""Calibration sets: image folders with a preprocessing contract, and .npy/.npz tensor folders.

Why this module exists on its own: every analysis runs on the same samples, so reading them must be
deterministic, fail early on bad input (before a long run starts), and keep memory flat on big sets.
`load_calibration` therefore validates the file list, the preprocessing keys, array headers and the
first image eagerly, and `CalibSet.samples()` decodes one file at a time.

Rules (the contract's "Calibration folders", made precise):

* **Kind.** A folder holding any image (png, jpg, jpeg, bmp; any case) is an image folder, otherwise a
  tensor folder. A `preprocess.json` inside a tensor folder (e.g. `"kind": "tensors"` metadata) is not a
  preprocessing contract and is skipped silently.
* **Images.** Keys come from `preprocess.json` in the folder, or the file given by `preprocess=`, with
  `overrides` (the CLI flags, same key names; `None` values mean "not given") on top. Keys: `input`
  (default: the only input not given by `consts`), `shape` (default: the input's declared shape; `"W"`,
  `"H"`, `null` or -1 are free dims), `layout` NCHW|NHWC (default NCHW), `channel_order` RGB|BGR|GRAY
  (default RGB), `scale` (default 1, applied to 0-255 values), `mean`/`std` (per channel or one value,
  defaults 0/1, after scale), `resize` stretch|keep_ratio_pad (default stretch), `pad_value` (0-255
  units, default 0: the fill of `keep_ratio_pad`, image placed top-left), `labels`, `files`. Other keys
  are ignored. Images are decoded with Pillow (EXIF orientation applied, 16-bit scaled to 0-255),
  resized bilinearly to the fixed H/W; a free dim keeps the image's own size (with one dim fixed,
  `keep_ratio_pad` scales the other proportionally). The result is cast to the input's dtype
  (float32 for every real model).
* **Labels.** `labels` lists class names. A file's stem is split into tokens on `_`, `-` and spaces,
  a leading all-digit token (the running number `000_`) skipped. A token equal to a class name, or
  `rot<NAME>`, names that class; a file naming exactly one class gets it. A file naming none gets
  class "0" when "0" is a class name and the set uses `rot<NAME>` tokens but never `rot0` (unrotated
  files are implicitly 0, as in ppocr_mobile_v2_cls); otherwise its label is None.
* **Tensors.** `.npz` keys are input names. A `.npy` whose stem is an input name feeds that input and
  then every other `.npy` is ignored (warning); with no such file, when exactly one input is left
  without data or a const, every `.npy` feeds it. Axis 0 of an array is the sample axis: an array of
  the input's rank holds `shape[0]` samples, one of rank - 1 is a single sample. An input whose axis 0
  is a fixed size > 1 (a recurrent state [2,1,128]) is not batched: an array of exactly that shape is
  one sample, an array of rank + 1 holds `shape[0]` of them. Data is cast to the input's dtype when
  that loses nothing (float64 -> float32, int64 -> int32 in range, integral floats -> int); anything
  else is an error naming the file.
* **Consts.** An input in `consts` is filled with its value; its shape is the declared one with
  symbolic dims set to 1 (an unknown dim other than axis 0 is an error).
* **Errors.** Bad input raises `CalibrationError` (or `UsageError` for flag values), one line that
  names the file, what was expected and what was found. NaN/Inf is checked as each array is loaded.
"""

from __future__ import annotations

import json
import math
import re
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from quantscan.errors import CalibrationError, QuantscanError, UsageError
from quantscan.specs import Dim, InputSpec, Warnings

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp"})
TENSOR_SUFFIXES = frozenset({".npy", ".npz"})
PREPROCESS_NAME = "preprocess.json"
LAYOUTS = ("NCHW", "NHWC")
CHANNEL_ORDERS = ("RGB", "BGR", "GRAY")
RESIZE_MODES = ("stretch", "keep_ratio_pad")
_CHECK_CHUNK = 1 << 20
"""Elements per chunk when scanning an array for NaN/Inf and castability (bounded temporaries)."""

Sample = dict[str, np.ndarray]
_Reader = Callable[[int], Iterator[tuple[Sample, Path]]]
"""Yields (sample, file it came from) for the first n samples; the file names errors in `batches`."""


# --- the result --------------------------------------------------------------------------------------


@dataclass
class CalibSet:
    """A validated calibration set; samples are decoded lazily, one file at a time."""

    source: Path
    kind: str
    files: list[Path]
    n_samples: int
    warnings: list[str]
    labels: list[int | None] | None
    label_names: list[str] | None
    _shapes: dict[str, tuple[int, ...]] = field(repr=False, compare=False)
    _batched: dict[str, bool] = field(repr=False, compare=False)
    _consts: dict[str, np.ndarray] = field(repr=False, compare=False)
    _read: _Reader = field(repr=False, compare=False)

    def sample_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of one sample per input (batch dim 1), consts included; images: the first one."""
        return dict(self._shapes)

    def samples(self) -> Iterator[Sample]:
        """One sample at a time (batch dim 1), every model input present, in file order."""
        for sample, _ in self._samples_with_files():
            yield sample

    def batches(self, batch_size: int) -> Iterator[Sample]:
        """Consecutive samples concatenated on axis 0; the last batch may be smaller.

        Consts whose axis 0 is fixed are passed once, not repeated; a data input whose axis 0 is not a
        batch axis cannot be batched (batch size 1 only).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise UsageError(f"expected a positive batch size, found {batch_size!r}")
        group: list[tuple[Sample, Path]] = []
        for item in self._samples_with_files():
            group.append(item)
            if len(group) == batch_size:
                yield self._stack(group)
                group = []
        if group:
            yield self._stack(group)

    def _samples_with_files(self) -> Iterator[tuple[Sample, Path]]:
        for sample, path in self._read(self.n_samples):
            for name, value in self._consts.items():
                sample[name] = value.copy()
            yield sample, path

    def _stack(self, group: list[tuple[Sample, Path]]) -> Sample:
        first, first_path = group[0]
        if len(group) == 1:
            return first
        out: Sample = {}
        for name, value in first.items():
            if name in self._consts and not self._batched[name]:
                out[name] = value
                continue
            if not self._batched[name]:
                raise CalibrationError(
                    f"input '{name}' has a fixed axis 0 of {value.shape[0] if value.ndim else 0}, so its "
                    f"samples cannot be batched: expected batch size 1, found {len(group)}"
                )
            for sample, path in group[1:]:
                if sample[name].shape != value.shape:
                    raise CalibrationError(
                        f"cannot batch {path} with {first_path}: input '{name}' shapes differ "
                        f"({_fmt(sample[name].shape)} vs {_fmt(value.shape)}); "
                        "use batch size 1 or a fixed shape"
                    )
            out[name] = np.concatenate([s[name] for s, _ in group], axis=0)
        return out


# --- entry point -------------------------------------------------------------------------------------


def load_calibration(
    path: str | Path,
    inputs: Sequence[InputSpec],
    *,
    preprocess: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    consts: Mapping[str, float] | None = None,
    limit: int | None = None,
) -> CalibSet:
    """Validate a calibration folder against the model inputs and return a lazy `CalibSet`."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise UsageError(f"--limit: expected a positive integer, found {limit!r}")
    specs = {s.name: s for s in inputs}
    const_arrays = _const_arrays(consts or {}, specs)
    folder = _check_folder(Path(path))
    entries = sorted((p for p in folder.iterdir()), key=lambda p: p.name)
    warnings = Warnings()
    for p in entries:
        if p.is_dir():
            warnings.add(f"ignored folder {p} (calibration folders are not searched recursively)")
    files = [p for p in entries if p.is_file()]
    if not any(p.name != PREPROCESS_NAME for p in files):
        raise CalibrationError(
            f"calibration folder {folder} is empty: expected images (png, jpg, bmp) with {PREPROCESS_NAME}, "
            "or .npy/.npz files"
        )
    if any(p.suffix.lower() in IMAGE_SUFFIXES for p in files):
        return _load_images(folder, files, specs, const_arrays, preprocess, overrides or {}, limit, warnings)
    if preprocess is not None or any(v is not None for v in (overrides or {}).values()):
        warnings.add(f"preprocessing options ignored: {folder} holds no images")
    return _load_tensors(folder, files, specs, const_arrays, limit, warnings)


def _check_folder(folder: Path) -> Path:
    if not folder.exists():
        raise CalibrationError(f"expected a calibration folder, found nothing at {folder}")
    if not folder.is_dir():
        raise CalibrationError(
            f"expected a calibration folder (images or .npy/.npz files), found the file {folder}"
        )
    return folder


# --- consts ------------------------------------------------------------------------------------------


def _const_arrays(consts: Mapping[str, float], specs: Mapping[str, InputSpec]) -> dict[str, np.ndarray]:
    """Build one array per --const; the shape is the declared one with symbolic dims set to 1."""
    out: dict[str, np.ndarray] = {}
    for name, value in consts.items():
        if name not in specs:
            raise UsageError(
                f"--const {name}={value}: expected one of the model inputs ({', '.join(specs)}), "
                f"found '{name}'"
            )
        out[name] = _const_array(specs[name], value)
    return out


def _const_array(spec: InputSpec, value: float) -> np.ndarray:
    shape: list[int] = []
    for axis, dim in enumerate(spec.shape):
        fixed = _fixed(dim)
        if fixed is not None:
            shape.append(fixed)
        elif axis == 0 or isinstance(dim, str):
            shape.append(1)
        else:
            raise UsageError(
                f"--const {spec.name}: expected known sizes, found axis {axis} of input "
                f"'{spec.name}' unknown (shape {_fmt(spec.shape)}); "
                f"give it with --input-shape {spec.name}:{axis}=N"
            )
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"--const {spec.name}: expected a number, found {value!r}") from None
    if not math.isfinite(number):
        raise UsageError(f"--const {spec.name}: expected a finite number, found {value!r}")
    arr = np.full(shape, number, dtype=np.float64)
    return _cast_checked(arr, spec.dtype, f"--const {spec.name}={value}", spec.name, UsageError)


# --- images ------------------------------------------------------------------------------------------


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


class _Keys:
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


def _load_images(
    folder: Path,
    files: list[Path],
    specs: Mapping[str, InputSpec],
    consts: dict[str, np.ndarray],
    preprocess: str | Path | None,
    overrides: Mapping[str, Any],
    limit: int | None,
    warnings: Warnings,
) -> CalibSet:
    keys = _preprocess_keys(folder, preprocess, overrides)
    pre = parse_preprocess(keys, specs, consts)
    spec = specs[pre.input]
    _check_other_inputs_covered(specs, consts, {pre.input}, folder)
    images = _image_list(folder, files, pre, warnings)
    if limit is not None:
        images = images[:limit]
    for image in images:
        _probe_image(image)
    first = preprocess_image(images[0], pre, spec)
    label_names = list(pre.labels) if pre.labels is not None else None
    labels = derive_labels([p.name for p in images], label_names) if label_names else None
    shapes = {pre.input: tuple(first.shape)} | {n: tuple(a.shape) for n, a in consts.items()}

    def read(n: int) -> Iterator[tuple[Sample, Path]]:
        for image in images[:n]:
            yield {pre.input: preprocess_image(image, pre, spec)}, image

    return CalibSet(
        source=folder,
        kind="images",
        files=images,
        n_samples=len(images),
        warnings=warnings.messages,
        labels=labels,
        label_names=label_names,
        _shapes=shapes,
        _batched=_batched_map(specs),
        _consts=consts,
        _read=read,
    )


def _preprocess_keys(folder: Path, preprocess: str | Path | None, overrides: Mapping[str, Any]) -> _Keys:
    """Read the preprocess file (given, else the folder's), then lay the flag values over it."""
    flags = {k: v for k, v in overrides.items() if v is not None}
    path = Path(preprocess) if preprocess is not None else folder / PREPROCESS_NAME
    if preprocess is not None and not path.is_file():
        raise CalibrationError(f"--preprocess: expected a JSON file, found nothing at {path}")
    if not path.is_file():
        if flags:
            return _Keys({}, None, flags)
        raise CalibrationError(
            f"{folder} holds images but no {PREPROCESS_NAME}: expected preprocessing keys "
            "(give --preprocess FILE or the keys as flags: --input, --shape, --layout, --channel-order, "
            "--scale, --mean, --std)"
        )
    return _Keys(_read_json_object(path), str(path), flags)


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{path}: expected a readable JSON file, found {exc}") from None
    except json.JSONDecodeError as exc:
        raise CalibrationError(
            f"{path}: expected JSON, found a syntax error at line {exc.lineno}: {exc.msg}"
        ) from None
    if not isinstance(data, dict):
        raise CalibrationError(
            f"{path}: expected a JSON object of preprocessing keys, found {type(data).__name__}"
        )
    return data


def parse_preprocess(
    keys: _Keys, specs: Mapping[str, InputSpec], consts: Mapping[str, np.ndarray]
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
        raise keys.bad("layout", f"a layout whose channel axis holds 1 or 3 in {_fmt(dims)}", layout)
    if channels is not None and channels != want_c:
        raise keys.bad(
            "channel_order",
            f"an order giving the {channels} channel(s) of input '{name}' "
            f"(shape {_fmt(spec.shape)}, {layout})",
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


def _pick_input(keys: _Keys, specs: Mapping[str, InputSpec], consts: Mapping[str, np.ndarray]) -> str:
    name = keys.get("input")
    free = [n for n in specs if n not in consts]
    if name is None:
        if len(free) == 1:
            return free[0]
        raise CalibrationError(
            f"preprocessing key 'input' missing: expected one of {', '.join(free) or '(none)'}, "
            "found no 'input'"
        )
    if name not in specs:
        raise keys.bad("input", f"a model input ({', '.join(specs)})", name)
    if name in consts:
        raise keys.bad("input", f"an input not given by --const {name}", name)
    return str(name)


def _choice(keys: _Keys, key: str, allowed: tuple[str, ...], default: str, *, upper: bool = True) -> str:
    value = keys.get(key, default)
    text = str(value).strip()
    text = text.upper() if upper else text.lower()
    if not isinstance(value, str) or text not in allowed:
        raise keys.bad(key, " or ".join(allowed), value)
    return text


def _image_dims(keys: _Keys, spec: InputSpec) -> list[int | None]:
    """Merge the preprocess `shape` with the declared shape: fixed wins, conflicts are errors."""
    raw = keys.get("shape", list(spec.shape))
    dims = _parse_shape(keys, raw)
    if len(spec.shape) != 4 or len(dims) != 4:
        raise keys.bad("shape", f"a 4-d image shape matching input '{spec.name}' {_fmt(spec.shape)}", raw)
    merged: list[int | None] = [None]
    for own, declared in zip(dims[1:], spec.shape[1:], strict=True):
        fixed = _fixed(declared)
        if own is not None and fixed is not None and own != fixed:
            raise keys.bad("shape", f"a shape fitting input '{spec.name}' {_fmt(spec.shape)}", raw)
        merged.append(own if own is not None else fixed)
    return merged


def _parse_shape(keys: _Keys, raw: Any) -> list[int | None]:
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple):
        raise keys.bad("shape", "a list like [1,3,224,224]", raw)
    dims: list[int | None] = []
    for item in items:
        if isinstance(item, str) and item.strip().lstrip("-").isdigit():
            item = int(item)
        if isinstance(item, bool) or isinstance(item, float):
            raise keys.bad("shape", 'integer or free ("H", "W", null) dims', raw)
        dims.append(item if isinstance(item, int) and item > 0 else None)
    return dims


def _number(keys: _Keys, key: str, default: float) -> float:
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


def _per_channel(keys: _Keys, key: str, channels: int, default: float) -> tuple[float, ...]:
    value = keys.get(key, default)
    items = value.split(",") if isinstance(value, str) else value
    items = items if isinstance(items, list | tuple) else [items]
    numbers = [_to_float(v) for v in items]
    if any(n is None or not math.isfinite(n) for n in numbers) or len(numbers) not in (1, channels):
        raise keys.bad(key, f"{channels} number(s), one per channel", value)
    floats = [float(n) for n in numbers if n is not None]
    return tuple(floats * channels) if len(floats) == 1 else tuple(floats)


def _nonzero(keys: _Keys, std: tuple[float, ...]) -> tuple[float, ...]:
    if any(s == 0 for s in std):
        raise keys.bad("std", "non-zero values (dividing by 0 gives Inf)", keys.get("std"))
    return std


def _str_list(keys: _Keys, key: str) -> tuple[str, ...] | None:
    value = keys.get(key)
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items or any(isinstance(v, dict | list) for v in items):
        raise keys.bad(key, "a non-empty list of names", value)
    return tuple(str(v).strip() for v in items)


def _check_other_inputs_covered(
    specs: Mapping[str, InputSpec], consts: Mapping[str, np.ndarray], fed: set[str], folder: Path
) -> None:
    for name in specs:
        if name not in fed and name not in consts:
            raise CalibrationError(
                f"input '{name}' has no data in {folder}: expected a file feeding it or a value, "
                f"found none (give --const {name}=VALUE)"
            )


def _image_list(folder: Path, files: list[Path], pre: Preprocess, warnings: Warnings) -> list[Path]:
    """The images to use, in order: `files` when listed, else every image sorted by name."""
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    for p in files:
        if p.suffix.lower() not in IMAGE_SUFFIXES and p.name != PREPROCESS_NAME:
            warnings.add(f"ignored {p} (not an image; {folder} is an image folder)")
    if pre.files is None:
        return images
    chosen = [folder / name for name in pre.files]
    for p in chosen:
        if not p.is_file():
            raise CalibrationError(
                f"preprocessing 'files' lists {p.name}: expected it in {folder}, found nothing"
            )
    listed = {p.resolve() for p in chosen}
    for p in images:
        if p.resolve() not in listed:
            warnings.add(f"ignored {p} (not listed under 'files')")
    return chosen


def _probe_image(path: Path) -> None:
    """Read the header only: catches unreadable and non-image files before any long run."""
    try:
        with Image.open(path) as im:
            im.size  # noqa: B018 - touching the header is the point
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
        raise CalibrationError(f"{path}: expected a readable image, found {_short(exc)}") from None


def preprocess_image(path: Path, pre: Preprocess, spec: InputSpec) -> np.ndarray:
    """Decode, resize, scale, normalise and lay out one image as a batch-of-1 array."""
    try:
        with Image.open(path) as opened:
            im = _as_mode(ImageOps.exif_transpose(opened), pre.channel_order)
            im = _resize(im, pre)
            pixels = np.asarray(im, dtype=np.float32)
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise CalibrationError(f"{path}: expected a readable image, found {_short(exc)}") from None
    pixels = pixels.reshape(pixels.shape[0], pixels.shape[1], -1)
    if pre.channels == 3 and pixels.shape[2] == 1:
        pixels = np.repeat(pixels, 3, axis=2)
    pixels = _pad(pixels, pre)
    if pre.channel_order == "BGR":
        pixels = pixels[:, :, ::-1]
    mean = np.asarray(pre.mean, dtype=np.float32)
    std = np.asarray(pre.std, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        x = (pixels * np.float32(pre.scale) - mean) / std
    if pre.layout == "NCHW":
        x = x.transpose(2, 0, 1)
    x = np.ascontiguousarray(x[None])
    if not np.isfinite(x).all():
        raise CalibrationError(
            f"{path}: expected finite values after preprocessing, found NaN/Inf (check scale/mean/std)"
        )
    return _cast_checked(x, spec.dtype, str(path), spec.name, CalibrationError)


def _as_mode(im: Image.Image, order: str) -> Image.Image:
    """8-bit L or RGB (alpha dropped); 16/32-bit grey becomes float 0-255 ("F") so nothing clips."""
    if im.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        scale = 1 / 257 if im.mode.startswith("I;16") or np.asarray(im).max() > 255 else 1.0
        return Image.fromarray(np.asarray(im, dtype=np.float32) * np.float32(scale), mode="F")
    if im.mode == "F":
        return im
    return im.convert("L" if order == "GRAY" else "RGB")


def _resize(im: Image.Image, pre: Preprocess) -> Image.Image:
    """Bring the image to the fixed H/W: stretch, or keep the ratio (padding happens later)."""
    w, h = im.size
    tw, th = pre.width, pre.height
    if tw is None and th is None:
        return im
    if pre.resize == "stretch":
        size = (tw or w, th or h)
    else:
        ratio = min(r for r in ((tw / w) if tw else None, (th / h) if th else None) if r is not None)
        size = (max(1, round(w * ratio)), max(1, round(h * ratio)))
        size = (min(size[0], tw or size[0]), min(size[1], th or size[1]))
    return im if size == (w, h) else im.resize(size, Image.Resampling.BILINEAR)


def _pad(pixels: np.ndarray, pre: Preprocess) -> np.ndarray:
    """keep_ratio_pad: place the image top-left on a canvas filled with pad_value (0-255 units)."""
    h, w = pixels.shape[:2]
    th, tw = pre.height or h, pre.width or w
    if (h, w) == (th, tw):
        return pixels
    canvas = np.empty((th, tw, pixels.shape[2]), dtype=np.float32)
    canvas[:] = np.asarray(pre.pad_value, dtype=np.float32)
    canvas[:h, :w] = pixels
    return canvas


_TOKEN_SPLIT = re.compile(r"[_\-\s]+")


def derive_labels(names: Sequence[str], label_names: Sequence[str]) -> list[int | None] | None:
    """Class index per file name (rule in the module docstring); None when no file has one."""
    lookup = {n.lower(): i for i, n in enumerate(label_names)}
    named = [_named_classes(n, lookup) for n in names]
    rot_tokens = [_rot_tokens(n) for n in names]
    uses_rot = any(rot_tokens)
    spells_rot0 = any("0" in r for r in rot_tokens)
    implicit = lookup.get("0") if uses_rot and not spells_rot0 else None
    labels: list[int | None] = []
    for classes in named:
        if len(classes) == 1:
            labels.append(next(iter(classes)))
        else:
            labels.append(implicit if not classes else None)
    return labels if any(label is not None for label in labels) else None


def _tokens(file_name: str) -> list[str]:
    tokens = [t for t in _TOKEN_SPLIT.split(Path(file_name).stem.lower()) if t]
    return tokens[1:] if len(tokens) > 1 and tokens[0].isdigit() else tokens


def _named_classes(file_name: str, lookup: Mapping[str, int]) -> set[int]:
    found: set[int] = set()
    for token in _tokens(file_name):
        for candidate in (token, token[3:] if token.startswith("rot") else None):
            if candidate is not None and candidate in lookup:
                found.add(lookup[candidate])
    return found


def _rot_tokens(file_name: str) -> set[str]:
    return {t[3:] for t in _tokens(file_name) if t.startswith("rot") and len(t) > 3}


# --- tensors -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Segment:
    """The part of one input's sample stream that one array (a .npy, or an .npz key) provides."""

    path: Path
    key: str | None
    mode: str  # "split": arr[i:i+1]; "single": arr[None]; "whole": arr; "stack": arr[i]
    count: int
    sample_shape: tuple[int, ...]

    @property
    def where(self) -> str:
        return f"{self.path}" if self.key is None else f"{self.path} (key '{self.key}')"


def _load_tensors(
    folder: Path,
    files: list[Path],
    specs: Mapping[str, InputSpec],
    consts: dict[str, np.ndarray],
    limit: int | None,
    warnings: Warnings,
) -> CalibSet:
    streams = _plan_streams(folder, files, specs, consts, warnings)
    total = _common_count(streams)
    n = total if limit is None else min(total, limit)
    used = _files_used(streams, n)
    shapes = {name: segs[0].sample_shape for name, segs in streams.items()}
    shapes |= {name: tuple(a.shape) for name, a in consts.items()}
    ordered = {name: streams[name] for name in specs if name in streams}

    def read(count: int) -> Iterator[tuple[Sample, Path]]:
        return _read_streams(ordered, specs, count)

    return CalibSet(
        source=folder,
        kind="tensors",
        files=used,
        n_samples=n,
        warnings=warnings.messages,
        labels=None,
        label_names=None,
        _shapes=shapes,
        _batched=_batched_map(specs),
        _consts=consts,
        _read=read,
    )


def _plan_streams(
    folder: Path,
    files: list[Path],
    specs: Mapping[str, InputSpec],
    consts: Mapping[str, np.ndarray],
    warnings: Warnings,
) -> dict[str, list[_Segment]]:
    """Decide which array feeds which input (the contract's .npz/.npy rules), reading headers only."""
    wanted = [n for n in specs if n not in consts]
    streams: dict[str, list[_Segment]] = {n: [] for n in wanted}
    npz = [p for p in files if p.suffix.lower() == ".npz"]
    npy = [p for p in files if p.suffix.lower() == ".npy"]
    for p in files:
        if p.suffix.lower() not in TENSOR_SUFFIXES and p.name != PREPROCESS_NAME:
            warnings.add(f"ignored {p} (not a .npy/.npz file)")
    for p in npz:
        _plan_npz(p, specs, consts, streams, warnings)
    _plan_npy(npy, specs, consts, streams, warnings)
    if not any(streams.values()):
        found = ", ".join(p.name for p in files if p.name != PREPROCESS_NAME)
        raise CalibrationError(
            f"nothing in {folder} matches a model input: expected .npz keys or .npy files named after "
            f"{', '.join(wanted) or '(every input is a --const)'}, found {found}"
        )
    for name, segs in streams.items():
        if not segs:
            raise CalibrationError(
                f"input '{name}' has no data in {folder}: expected {name}.npy or an .npz key '{name}', "
                f"found none (give --const {name}=VALUE)"
            )
    return streams


def _plan_npz(
    path: Path,
    specs: Mapping[str, InputSpec],
    consts: Mapping[str, np.ndarray],
    streams: dict[str, list[_Segment]],
    warnings: Warnings,
) -> None:
    headers = _npz_headers(path)
    unused = [k for k in headers if k not in streams]
    if not set(headers) & set(streams):
        warnings.add(f"ignored {path}: its keys ({', '.join(headers) or 'none'}) match no input needing data")
        return
    for key in unused:
        why = "a --const is given for it" if key in consts else "no such input"
        warnings.add(f"ignored key '{key}' of {path} ({why})")
    counts: set[int] = set()
    for key, (shape, dtype) in headers.items():
        if key in streams:
            seg = _segment(path, key, shape, dtype, specs[key])
            streams[key].append(seg)
            counts.add(seg.count)
    if len(counts) > 1:
        raise CalibrationError(
            f"{path}: expected the same number of samples under every key, found {sorted(counts)}"
        )


def _plan_npy(
    npy: list[Path],
    specs: Mapping[str, InputSpec],
    consts: Mapping[str, np.ndarray],
    streams: dict[str, list[_Segment]],
    warnings: Warnings,
) -> None:
    named = [p for p in npy if p.stem in streams]
    if named:
        for p in npy:
            if p.stem in streams:
                streams[p.stem].append(_npy_segment(p, specs[p.stem]))
            else:
                why = "a --const is given for it" if p.stem in consts else "its name matches no input"
                warnings.add(f"ignored {p} ({why}; {', '.join(q.name for q in named)} feed inputs by name)")
        return
    if not npy:
        return
    left = [n for n, segs in streams.items() if not segs]
    if len(left) == 1:
        for p in npy:
            streams[left[0]].append(_npy_segment(p, specs[left[0]]))
    elif not left:
        for p in npy:
            warnings.add(f"ignored {p} (every input already has data)")
    else:
        raise CalibrationError(
            f"cannot tell which of inputs {', '.join(left)} the .npy files feed: expected files named after "
            f"an input (e.g. {left[0]}.npy), found {', '.join(p.name for p in npy)}"
        )


def _npy_segment(path: Path, spec: InputSpec) -> _Segment:
    shape, dtype = _npy_header(path)
    return _segment(path, None, shape, dtype, spec)


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    try:
        with path.open("rb") as f:
            return _read_header(f)
    except (OSError, ValueError, EOFError) as exc:
        raise CalibrationError(f"{path}: expected a readable .npy array, found {_short(exc)}") from None


def _npz_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array in an .npz, without decompressing the data."""
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if info.filename.endswith(".npy"):
                    with zf.open(info) as f:
                        out[info.filename[:-4]] = _read_header(f)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise CalibrationError(f"{path}: expected a readable .npz archive, found {_short(exc)}") from None
    return out


def _read_header(f: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unsupported .npy format version {version}")
    return tuple(int(d) for d in shape), np.dtype(dtype)


def _segment(
    path: Path, key: str | None, shape: tuple[int, ...], dtype: np.dtype, spec: InputSpec
) -> _Segment:
    """Check an array's dtype and shape against the input and decide how it splits into samples."""
    where = f"{path}" if key is None else f"{path} (key '{key}')"
    if dtype.kind not in "biuf" or spec.dtype.kind not in "biuf":
        raise CalibrationError(f"{where}: input '{spec.name}' takes {spec.dtype}, found {dtype} data")
    decl = spec.shape
    batched = _is_batch_axis(decl)
    r = len(decl)
    if batched and len(shape) == r and shape[0] >= 1 and _dims_fit(shape[1:], decl[1:]):
        return _Segment(path, key, "split", shape[0], (1, *shape[1:]))
    if batched and len(shape) == r - 1 and _dims_fit(shape, decl[1:]):
        return _Segment(path, key, "single", 1, (1, *shape))
    if not batched and len(shape) == r and _dims_fit(shape, decl):
        return _Segment(path, key, "whole", 1, shape)
    if not batched and len(shape) == r + 1 and shape[0] >= 1 and _dims_fit(shape[1:], decl):
        return _Segment(path, key, "stack", shape[0], shape[1:])
    expected = _fmt(["N", *decl[1:]]) if batched else _fmt(decl)
    raise CalibrationError(
        f"{where}: input '{spec.name}' expects shape {expected} (declared {_fmt(decl)}), found {_fmt(shape)}"
    )


def _common_count(streams: Mapping[str, list[_Segment]]) -> int:
    counts = {name: sum(s.count for s in segs) for name, segs in streams.items()}
    if len(set(counts.values())) > 1:
        found = ", ".join(f"'{n}' {c}" for n, c in counts.items())
        raise CalibrationError(f"expected the same number of samples for every input, found {found}")
    total = next(iter(counts.values()))
    if total == 0:
        raise CalibrationError(
            f"expected at least one sample, found empty arrays in {_streams_files(streams)}"
        )
    return total


def _streams_files(streams: Mapping[str, list[_Segment]]) -> str:
    return ", ".join(sorted({s.path.name for segs in streams.values() for s in segs}))


def _files_used(streams: Mapping[str, list[_Segment]], n: int) -> list[Path]:
    """Files contributing to the first n samples, sorted by name (the folder order)."""
    used: set[Path] = set()
    for segs in streams.values():
        start = 0
        for seg in segs:
            if start < n:
                used.add(seg.path)
            start += seg.count
    return sorted(used, key=lambda p: p.name)


def _read_streams(
    streams: Mapping[str, list[_Segment]], specs: Mapping[str, InputSpec], n: int
) -> Iterator[tuple[Sample, Path]]:
    iters = {name: _iter_stream(segs, specs[name]) for name, segs in streams.items()}
    for _ in range(n):
        sample: Sample = {}
        path: Path | None = None
        for name, it in iters.items():
            sample[name], p = next(it)
            path = path or p
        assert path is not None
        yield sample, path


def _iter_stream(segs: list[_Segment], spec: InputSpec) -> Iterator[tuple[np.ndarray, Path]]:
    """One input's samples, loading one array at a time (memory stays at one file per input)."""
    for seg in segs:
        arr = _load_array(seg)
        _check_values(arr, spec, seg)
        for i in range(seg.count):
            yield _take(arr, seg.mode, i).astype(spec.dtype, copy=True), seg.path
        del arr


def _load_array(seg: _Segment) -> np.ndarray:
    try:
        if seg.key is None:
            return np.asarray(np.load(seg.path, mmap_mode="r", allow_pickle=False))
        with np.load(seg.path, allow_pickle=False) as npz:
            return np.asarray(npz[seg.key])
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise CalibrationError(f"{seg.where}: expected a readable array, found {_short(exc)}") from None


def _take(arr: np.ndarray, mode: str, i: int) -> np.ndarray:
    if mode == "split":
        return arr[i : i + 1]
    if mode == "single":
        return arr[None]
    if mode == "stack":
        return arr[i]
    return arr


def _check_values(arr: np.ndarray, spec: InputSpec, seg: _Segment) -> None:
    """NaN/Inf and lossless-cast checks, in chunks so a memory-mapped file is never copied whole."""
    flat = arr.reshape(-1)
    per_sample = max(1, flat.size // max(1, seg.count))
    for start in range(0, flat.size, _CHECK_CHUNK):
        chunk = np.asarray(flat[start : start + _CHECK_CHUNK])
        bad = _first_nonfinite(chunk)
        if bad is not None:
            raise CalibrationError(
                f"{seg.where}: expected finite values, found NaN/Inf (sample {(start + bad) // per_sample})"
            )
        _cast_checked(chunk, spec.dtype, seg.where, spec.name, CalibrationError)


def _first_nonfinite(chunk: np.ndarray) -> int | None:
    if chunk.dtype.kind != "f":
        return None
    finite = np.isfinite(chunk)
    return None if finite.all() else int(np.argmin(finite))


def _cast_checked(
    arr: np.ndarray, dtype: np.dtype, where: str, name: str, error: type[CalibrationError] | type[UsageError]
) -> np.ndarray:
    """Cast to the input's dtype only when no value changes meaning (no overflow, no fraction lost)."""
    if arr.dtype == dtype:
        return arr
    if arr.dtype.kind not in "biuf" or dtype.kind not in "biuf":
        raise error(f"{where}: input '{name}' takes {dtype}, found {arr.dtype} data")
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            out = arr.astype(dtype)
        if not np.isfinite(out).all():
            raise error(f"{where}: input '{name}' takes {dtype}, found values that overflow it (Inf)")
        return out
    if arr.dtype.kind == "f" and arr.size and not np.all(np.mod(arr, 1) == 0):
        raise error(f"{where}: input '{name}' takes {dtype}, found non-integral {arr.dtype} values")
    if dtype.kind == "b":
        if arr.size and not np.isin(arr, (0, 1)).all():
            raise error(f"{where}: input '{name}' takes bool, found values other than 0/1")
        return arr.astype(dtype)
    info = np.iinfo(dtype)
    if arr.size and (arr.min() < info.min or arr.max() > info.max):
        raise error(
            f"{where}: input '{name}' takes {dtype} [{info.min}, {info.max}], "
            f"found values in [{arr.min()}, {arr.max()}]"
        )
    return arr.astype(dtype)


# --- small helpers -----------------------------------------------------------------------------------


def _fixed(dim: Dim) -> int | None:
    return dim if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0 else None


def _is_batch_axis(shape: tuple[Dim, ...]) -> bool:
    """Axis 0 is a batch axis unless it is a fixed size > 1 (e.g. an LSTM state [2,1,128])."""
    return bool(shape) and (_fixed(shape[0]) is None or shape[0] == 1)


def _batched_map(specs: Mapping[str, InputSpec]) -> dict[str, bool]:
    return {name: _is_batch_axis(spec.shape) for name, spec in specs.items()}


def _dims_fit(found: Sequence[int], declared: Sequence[Dim]) -> bool:
    if len(found) != len(declared):
        return False
    return all(_fixed(d) is None or f == d for f, d in zip(found, declared, strict=True))


def _fmt(shape: Sequence[Any]) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _short(exc: BaseException) -> str:
    """An exception as one short line (error messages must stay on one line)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]
