"""quantscan.calib.source: compare and extract take their samples from the one source.

Why this matters: extract's saved inputs (`.inputs.npz`) are meant to reproduce what compare measured
on the same folder; that holds only if both see the same samples in the same order.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from builders import build
from quantscan.calib import load_calibration
from quantscan.calib import source as source_module
from quantscan.calib.source import data_source
from quantscan.compare import compare
from quantscan.extract import capture, extract
from quantscan.model import graph_inputs
from quantscan.runner import Runner

TWO_INPUTS = """<ir_version: 8, opset_import: ["" : 15]>
g (float[N,4] x, float[N,4] m) => (float[N,4] y) {
    a = Mul (x, m)
    y = Relu (a)
}"""


class _Recording:
    """A session that remembers every feed it ran on, then runs it."""

    def __init__(self, inner: Any, feeds: list[dict[str, np.ndarray]]) -> None:
        self._inner = inner
        self._feeds = feeds

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        self._feeds.append({k: np.array(v) for k, v in feeds.items()})
        return self._inner.run(feeds, outputs)


class RecordingRunner(Runner):
    """A runner whose sessions record their feeds (what compare actually ran on)."""

    def __init__(self) -> None:
        super().__init__()
        self.feeds: list[dict[str, np.ndarray]] = []

    def session(self, model: Any, *, opt_level: str | None = None) -> Any:
        return _Recording(super().session(model, opt_level=opt_level), self.feeds)


def tensor_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "calib"
    folder.mkdir()
    rng = np.random.default_rng(7)
    for i, n in enumerate([3, 2]):
        np.savez(
            folder / f"{i}.npz",
            x=rng.standard_normal((n, 4)).astype(np.float32),
            m=rng.standard_normal((n, 4)).astype(np.float32),
        )
    return folder


def test_compare_and_extract_use_the_one_sample_source() -> None:
    # import_module: `quantscan.compare` the attribute is the compare() function, not the module.
    compare_module = importlib.import_module("quantscan.compare")
    assert compare_module.data_source is source_module.data_source
    for extract_module in ("quantscan.cut", "quantscan.repro"):  # extract's cut and its saved inputs
        assert importlib.import_module(extract_module).data_source is source_module.data_source


def test_compare_and_extract_see_the_same_samples_for_the_same_folder(tmp_path: Path) -> None:
    model: onnx.ModelProto = build(TWO_INPUTS)
    folder = tensor_folder(tmp_path)
    truth = list(load_calibration(folder, graph_inputs(model)).samples())
    assert len(truth) == 5

    runner = RecordingRunner()
    result = compare(model, model, folder, runner=runner)
    assert result.samples == 5
    compared = runner.feeds[2:]  # after the two probe runs (A, B), one run per sample

    sub = extract(model, "a", context=0)
    assert sub.inputs == ["x", "m"]
    extracted = [capture(sub, folder, sample=i)[0] for i in range(5)]

    listed = [dict(s) for s in data_source(folder, graph_inputs(model)).samples()]
    for i, want in enumerate(truth):
        for name in ("x", "m"):
            np.testing.assert_array_equal(compared[i][name], want[name])
            np.testing.assert_array_equal(extracted[i][name], want[name])
            np.testing.assert_array_equal(listed[i][name], want[name])
