"""Image folders: the file list, decoding, resizing, normalising and laying out one image at a time.

Why its own module: images are the one input kind that needs a decoder (Pillow) and a contract
(`preprocess.py`); this module turns that contract into a lazy `CalibSet`, probing every file's
header and decoding the first image eagerly so a bad file fails before the run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from quantscan.calib.calibset import CalibSet, Sample
from quantscan.calib.checks import batched_map, cast_checked, missing_inputs_error, short
from quantscan.calib.folder import IMAGE_SUFFIXES, other_files
from quantscan.calib.labels import derive_labels, labels_from_json
from quantscan.calib.preprocess import (
    Preprocess,
    aspect_warning,
    contract_record,
    parse_preprocess,
    preprocess_keys,
    resized_size,
)
from quantscan.errors import CalibrationError
from quantscan.specs import InputSpec, Warnings


def load_images(
    folder: Path,
    files: list[Path],
    specs: Mapping[str, InputSpec],
    consts: dict[str, np.ndarray],
    preprocess: str | Path | None,
    overrides: Mapping[str, Any],
    limit: int | None,
    warnings: Warnings,
) -> CalibSet:
    """An image folder as a lazy `CalibSet`: contract checked, every header probed, image 0 decoded."""
    keys = preprocess_keys(folder, preprocess, overrides)
    pre = parse_preprocess(keys, specs, consts)
    spec = specs[pre.input]
    _check_other_inputs_covered(specs, consts, {pre.input}, folder)
    images = _image_list(folder, files, pre, warnings)
    if limit is not None:
        images = images[:limit]
    sizes = {image.name: _probe_image(image) for image in images}
    squashed = aspect_warning(sizes, pre)
    if squashed is not None:
        warnings.add(squashed)
    first = preprocess_image(images[0], pre, spec)
    label_names = list(pre.labels) if pre.labels is not None else None
    labels = derive_labels([p.name for p in images], label_names) if label_names else None
    beside = labels_from_json(folder, [p.name for p in images]) if label_names is None else None
    if beside is not None:
        label_names, labels = beside
    shapes = {pre.input: tuple(first.shape)} | {n: tuple(a.shape) for n, a in consts.items()}

    def read(n: int, start: int) -> Iterator[tuple[Sample, Path]]:
        for image in images[start:n]:
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
        _batched=batched_map(specs),
        _consts=consts,
        _read=read,
        preprocessing={pre.input: contract_record(pre, str(first.dtype), list(sizes.values()))},
    )


def _check_other_inputs_covered(
    specs: Mapping[str, InputSpec], consts: Mapping[str, np.ndarray], fed: set[str], folder: Path
) -> None:
    missing = [name for name in specs if name not in fed and name not in consts]
    if missing:
        raise missing_inputs_error(missing, folder, "a file feeding 'NAME' or a value")


def _image_list(folder: Path, files: list[Path], pre: Preprocess, warnings: Warnings) -> list[Path]:
    """The images to use, in order: `files` when listed, else every image sorted by name."""
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    for p in other_files(files, IMAGE_SUFFIXES):
        warnings.add(f"ignored {p} (not an image; {folder} is an image folder)")
    if pre.files is None:
        return images
    for name in pre.files:
        if Path(name).name != name or name in ("", ".", ".."):
            raise CalibrationError(f"preprocessing 'files': expected plain file names in {folder}, found "
                                   f"{name[:80]!r} (entries may not leave the folder)")
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


def _probe_image(path: Path) -> tuple[int, int]:
    """Read the header only: catches unreadable and non-image files before any long run; returns the
    (W, H) the image will have once upright (EXIF orientation 5-8 swaps the sides)."""
    try:
        with Image.open(path) as im:
            w, h = im.size
            return (h, w) if _turned(im) else (w, h)
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
        raise CalibrationError(f"{path}: expected a readable image, found {short(exc)}") from None


def _turned(im: Image.Image) -> bool:
    """EXIF orientation 5-8 (a quarter turn) as far as the header tells; a file truncated past its
    header is still reported when decoded, naming it, not here."""
    try:
        return im.getexif().get(0x0112, 1) in (5, 6, 7, 8)
    except (OSError, SyntaxError, ValueError):
        return False


def preprocess_image(path: Path, pre: Preprocess, spec: InputSpec) -> np.ndarray:
    """Decode, resize, scale, normalise and lay out one image as a batch-of-1 array."""
    try:
        with Image.open(path) as opened:
            im = _as_mode(ImageOps.exif_transpose(opened), pre.channel_order)
            im = _resize(im, pre)
            pixels = np.asarray(im, dtype=np.float32)
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise CalibrationError(f"{path}: expected a readable image, found {short(exc)}") from None
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
    return cast_checked(x, spec.dtype, str(path), spec.name, CalibrationError)


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
    size = resized_size(*im.size, pre)
    return im if size == im.size else im.resize(size, Image.Resampling.BILINEAR)


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
