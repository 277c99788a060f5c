"""Calibration sets: image folders with a preprocessing contract, and .npy/.npz tensor folders.

The package's API is `load_calibration` and `CalibSet`; `quantscan.calib.source` streams samples
for compare and extract (a calibration set, else seeded random data).

Why this package exists on its own: every analysis runs on the same samples, so reading them must be
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

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quantscan.calib.calibset import CalibSet
from quantscan.calib.consts import const_arrays
from quantscan.calib.folder import folder_files, is_image_folder
from quantscan.calib.images import load_images
from quantscan.calib.tensors import load_tensors
from quantscan.errors import UsageError
from quantscan.specs import InputSpec

__all__ = ["CalibSet", "load_calibration"]


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
    arrays = const_arrays(consts or {}, specs)
    folder, files, warnings = folder_files(Path(path))
    if is_image_folder(files):
        return load_images(folder, files, specs, arrays, preprocess, overrides or {}, limit, warnings)
    if preprocess is not None or any(v is not None for v in (overrides or {}).values()):
        warnings.add(f"preprocessing options ignored: {folder} holds no images")
    return load_tensors(folder, files, specs, arrays, limit, warnings)
