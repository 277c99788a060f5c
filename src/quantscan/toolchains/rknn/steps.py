"""The steps of an RKNN run that are RKNN's own: the samples as .npy files (one static shape) and the
driver's job (the toolkit's dataset file). The steps every toolchain takes are `toolchains.driving`.

Why its own module: `vendor rknn` (run.py) and the hybrid quantization (hybrid.py) both take these
steps, and run.py's `apply_plan` drives the hybrid; with the steps in run.py the two imported each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from quantscan.calib import CalibSet
from quantscan.errors import CalibrationError, UsageError
from quantscan.model import LoadedModel

DRIVER = Path(__file__).parent / "driver.py"


def fixed_shapes(cset: CalibSet) -> dict[str, tuple[int, ...]]:
    """RKNN builds one static shape: every sample must have the first sample's shape, batch 1."""
    shapes = cset.sample_shapes()
    return {name: (1, *shape[1:]) for name, shape in shapes.items()}


def write_samples(cset: CalibSet, names: list[str], folder: Path) -> list[list[str]]:
    """Every sample as one .npy per input (the tensors quantscan feeds); returns the paths per sample."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = fixed_shapes(cset)
    paths = []
    for i, sample in enumerate(cset.samples()):
        row = []
        for name in names:
            array = np.ascontiguousarray(sample[name])
            if tuple(array.shape) != expected[name]:
                raise CalibrationError(
                    f"vendor rknn: expected every sample of input '{name}' shaped {list(expected[name])} "
                    f"(RKNN builds one static shape), found {list(array.shape)} in sample {i}"
                )
            path = folder / f"{i:04d}_{_safe(name)}.npy"
            np.save(path, array)
            row.append(str(path.resolve()))
        paths.append(row)
    return paths


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def driver_job(
    loaded: LoadedModel, cset: CalibSet, names: list[str], samples: list[list[str]], target: str, work: Path,
    analysis_samples: int | None,
) -> dict[str, Any]:
    """The driver's job: the model, the target, the samples as the toolkit's dataset file, how many of them
    accuracy_analysis runs on."""
    if analysis_samples is not None and analysis_samples < 0:
        raise UsageError(f"--analysis-samples: expected a non-negative integer, found {analysis_samples}")
    n_analysis = len(samples) if analysis_samples is None else min(analysis_samples, len(samples))
    dataset = work / "dataset.txt"
    dataset.write_text("".join(" ".join(row) + "\n" for row in samples), encoding="utf-8")
    shapes = fixed_shapes(cset)
    return {
        "model": str(loaded.path.resolve()), "target": target, "inputs": names,
        "input_shapes": [list(shapes[n]) for n in names], "dataset": str(dataset.resolve()),
        "samples": samples, "analysis": n_analysis, "work": str(work.resolve()), "log": None,
        "quantized_algorithm": "normal",
    }
