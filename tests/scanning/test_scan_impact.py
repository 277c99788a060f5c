"""Rank by output impact (scanning.impact): the scan's rank follows the measured output gain.

Oracle: the gain of keeping site k float is measured here independently, by running the whole
mixed-precision model of each variant (`gain.Evaluator`, one full network per variant, no branch
sharing), and the scan's `gain_if_float` and rank must agree with it. The tiny model is a
MatMul+Add+Relu chain with one outlier bias channel, so the sites differ clearly.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import quantscan
from quantscan.cli import main
from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.metrics import SQNR_CAP_DB
from quantscan.scanning.evaluate import SampleError, largest_error_share_first
from quantscan.scanning.gain import Evaluator, mixed_builder
from quantscan.scanning.impact import cumulative_drop, gain_candidates, gain_sample_indices, rank_by_gain
from quantscan.scanning.prepare import prepare_scan
from quantscan.scanning.site_result import (
    ActivationFigures,
    ChipPlacement,
    CumulativeFigures,
    IsolatedFigures,
    SiteResult,
    WeightFigures,
    layers_frame,
)

WIDTH = 8


def _chain(tmp: Path, layers: int = 6, outlier: int = 3) -> tuple[Path, Path]:
    """x[N,8] -> (MatMul, Add, Relu) x layers -> MatMul -> y[N,5]. Layer `outlier`'s weights have a row
    of 20s on an input channel that is always 0: harmless in float, but its per-channel int8 scale
    rounds every other weight of that layer away, so keeping that site float helps the output most."""
    rng = np.random.default_rng(3)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        w = rng.normal(0, 0.5, (WIDTH, WIDTH)).astype(np.float32)
        b = rng.normal(0, 0.1, WIDTH).astype(np.float32)
        if i == outlier - 1:
            w[:, 0], b[0] = 0.0, 0.0  # channel 0 of this layer's output is always 0
        if i == outlier:
            w[0] = 20.0
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"add{i}"], name=f"add{i}"),
                  helper.make_node("Relu", [f"add{i}"], [f"h{i}"], name=f"relu{i}")]
        prev = f"h{i}"
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (WIDTH, 5)).astype(np.float32), "whead"))
    nodes.append(helper.make_node("MatMul", [prev, "whead"], ["y"], name="head"))
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", WIDTH])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 5])
    graph = helper.make_graph(nodes, "chain", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    path = tmp / "chain.onnx"
    onnx.save(model, path)
    calib = tmp / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(1).normal(0, 1, (24, WIDTH)).astype(np.float32))
    return path, calib


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _chain(tmp_path_factory.mktemp("impact"))


def _whole_variant_gains(model: Path, calib: Path) -> dict[str, float]:
    """The oracle: each variant run as a whole model, its headline cosine minus the all-int8 one."""
    ctx = prepare_scan(model, calib, threads=1)
    builder = mixed_builder(ctx)
    evaluator = Evaluator(ctx, builder, "cosine")
    base = evaluator.evaluate(builder.precisions([])).worst["cosine"]
    return {s.node: evaluator.evaluate(builder.precisions([s.node])).worst["cosine"] - base for s in ctx.graph.sites}


def test_ranks_follow_the_measured_gains(chain: tuple[Path, Path]) -> None:
    model, calib = chain
    result = quantscan.scan(model, calib, threads=1, gain_candidates=100, gain_samples=0)
    oracle = _whole_variant_gains(model, calib)
    layers = result.layers
    assert result.run_info.options["gain_measured"] == len(oracle) == len(layers)
    for r in layers.to_dict("records"):
        assert r["gain_if_float"] == pytest.approx(oracle[r["node"]], abs=1e-7)
    expected = sorted(oracle, key=lambda n: -oracle[n])
    assert max(oracle.values()) > 1e-3  # the chain really has a site worth keeping float
    assert list(layers["node"])[:3] == expected[:3]
    assert expected[0] == "mm3"
    gains = layers["gain_if_float"].to_numpy()
    assert np.all(np.diff(gains) <= 1e-12)  # rank 1..n: gains never increase
    assert list(layers["rank"]) == list(range(1, len(layers) + 1))


def _outputs(fp32: onnx.ModelProto, qdq: onnx.ModelProto, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The oracle for "which samples int8 hurts most": onnx's ReferenceEvaluator runs the FP32 model and
    the scan's all-int8 QDQ model; cosines are then written out in numpy."""
    def run(model: onnx.ModelProto) -> np.ndarray:
        raised = onnx.version_converter.convert_version(model, 21)  # the evaluator's QDQ kernels start at 19
        return np.asarray(ReferenceEvaluator(raised).run(None, {"x": x})[0], dtype=np.float64)

    return run(fp32), run(qdq)


def test_gain_is_measured_on_the_samples_with_most_of_the_error(chain: tuple[Path, Path], tmp_path: Path) -> None:
    """`gain_samples=N`: the gain is measured on the N evaluation samples with the largest ‖FP32 − int8‖²
    at the output (numpy, written out), and its figures are those of a scan whose evaluation set is
    exactly those samples (same calibration: `eval=` a folder holding them); rank 1 is re-measured on
    all samples."""
    model, calib = chain
    x = np.load(calib / "x.npy")
    k = 5
    capped = quantscan.scan(model, calib, threads=1, gain_candidates=100, gain_samples=k)
    ref, test = _outputs(onnx.load(model), capped.qdq_model, x)
    energy = np.sum((ref - test) ** 2, axis=1)
    order = np.argsort(-energy, kind="stable")
    assert energy[order[k - 1]] - energy[order[k]] > 1e-6 * energy[order[0]]  # not decided by rounding
    expected = sorted(int(i) for i in order[:k])
    assert expected != list(range(k))  # the first samples would be a different choice
    assert capped.run_info.evaluation.samples == 24 and capped.run_info.options["gain_samples"] == k
    assert capped.run_info.options["gain_sample_indices"] == expected
    chosen = tmp_path / "worst"
    chosen.mkdir()
    np.save(chosen / "x.npy", x[expected])
    oracle = quantscan.scan(model, calib, threads=1, gain_candidates=100, gain_samples=0, eval=chosen)
    mine = capped.layers.set_index("node")["gain_if_float"]
    theirs = oracle.layers.set_index("node")["gain_if_float"]
    assert len(theirs) == len(mine)
    assert max(abs(mine[n] - theirs[n]) for n in theirs.index) < 1e-9
    on_them = np.sum(ref[expected] * test[expected]) / (np.linalg.norm(ref[expected]) * np.linalg.norm(test[expected]))
    assert capped.run_info.options["gain_samples_cosine"] == pytest.approx(on_them, abs=1e-5)
    assert Col.GAIN_IF_FLOAT_WHOLE_SET not in capped.layers.columns  # the whole-set re-measure is opt-in (its cost)
    whole = quantscan.scan(model, calib, threads=1, gain_candidates=100, gain_samples=0).layers.set_index("node")
    again = quantscan.scan(model, calib, threads=1, gain_candidates=100, gain_samples=k, gain_whole_set=True)
    top = str(again.layers["node"].iloc[0])
    assert again.layers[Col.GAIN_IF_FLOAT_WHOLE_SET].iloc[0] == pytest.approx(whole.loc[top, "gain_if_float"], abs=1e-9)
    assert again.layers[Col.GAIN_IF_FLOAT_WHOLE_SET].iloc[1:].isna().all()
    assert Col.GAIN_IF_FLOAT_WHOLE_SET not in whole.columns  # all samples measured: nothing to re-measure


def test_samples_ordered_by_their_share_of_each_outputs_pooled_error() -> None:
    """A sample counts by its largest share Σd²_i / Σ_j Σx²_j over the headline outputs: output "b" is
    1000x smaller than "a", so its errors compare against its own total, not a's."""
    errors = [SampleError(0, "a", 1.0, 1000.0), SampleError(0, "b", 0.0, 1.0),
              SampleError(1, "a", 5.0, 1000.0), SampleError(1, "b", 0.001, 1.0),
              SampleError(2, "a", 0.0, 1000.0), SampleError(2, "b", 0.5, 1.0),
              SampleError(3, "a", 5.0, 1000.0), SampleError(3, "b", 0.0, 1.0)]
    # shares: 0 -> 1/3000, 1 -> max(5/3000, 0.001/3), 2 -> 0.5/3, 3 -> 5/3000 (ties by index)
    assert largest_error_share_first(errors) == [2, 1, 3, 0]
    assert largest_error_share_first([]) == []


def test_gain_sample_indices_take_the_order_then_unlisted_samples() -> None:
    assert gain_sample_indices([7, 2, 9, 0], 10, 3) == [2, 7, 9]
    assert gain_sample_indices([7, 2], 10, 4) == [0, 1, 2, 7]  # samples the order lacks (non-finite) fill up
    assert gain_sample_indices([7, 2], 10, 0) == [] and gain_sample_indices([7, 2], 10, 10) == []


def test_few_candidates_measured_first_then_the_old_order(chain: tuple[Path, Path]) -> None:
    model, calib = chain
    off = quantscan.scan(model, calib, threads=1, gain_candidates=0)
    some = quantscan.scan(model, calib, threads=1, gain_candidates=1)
    assert "gain_if_float" not in off.layers and off.run_info.options["gain_measured"] == 0
    measured = some.layers["gain_if_float"].notna()
    n = int(measured.sum())
    assert 1 <= n <= 4  # the top 1 of three orderings (possibly one site), and the head (writes y)
    assert "head" in set(some.layers["node"][:n])
    assert measured.iloc[:n].all() and not measured.iloc[n:].any()
    old_order = [x for x in off.layers["node"] if x not in set(some.layers["node"][:n])]
    assert list(some.layers["node"][n:]) == old_order
    # every other column is the same, except where the inherited-error rule (it needs measured gains)
    # named an upstream site: those rows' diagnosis and reason
    named = set(some.layers.loc[some.layers["diagnosis"].str.contains("inherited-error"), "node"])
    assert named  # the chain's mm4 inherits mm3's error
    diagnosis = ["reason", "diagnosis", "diagnosis_cause", "diagnosis_fix", "diagnosis_tier"]
    other = [c for c in off.layers.columns if c != "rank" and c != "node"]
    kept_rows = sorted(set(off.layers["node"]) - named)
    pd.testing.assert_frame_equal(off.layers.set_index("node").loc[kept_rows, other],
                                  some.layers.set_index("node").loc[kept_rows, other])
    unchanged = [c for c in other if c not in diagnosis]
    pd.testing.assert_frame_equal(off.layers.set_index("node").loc[sorted(named), unchanged],
                                  some.layers.set_index("node").loc[sorted(named), unchanged])


def _site(node: str, *, iso_sqnr: float = 30.0, iso_cos: float = 1.0, cum_cos: float = 1.0,
          worst_channel: float = 30.0, cum_sqnr: float = 30.0, input_sqnr: float = 30.0, rank: int = 0,
          severity: str | None = None) -> SiteResult:
    """A site record carrying just the figures the candidate choice and the rank read."""
    return SiteResult(
        node=node, op_type="Conv", kernel="Conv", order=0, output=f"{node}_out", inputs=("x",),
        isolated=IsolatedFigures(iso_cos, iso_sqnr), cumulative=CumulativeFigures(cum_cos, cum_sqnr),
        input_sqnr_db=input_sqnr, eval_clip_fraction=0.0, activation=ActivationFigures(worst_channel),
        weight=WeightFigures(), sensitive_op=False, rank=rank,
        chip=ChipPlacement("npu", severity=severity) if severity is not None else None,
    )


def test_candidates_take_each_ordering_and_non_finite_sites() -> None:
    iso = [10.0, 40.0, 30.0, math.nan, 50.0]
    iso_cos = [0.9, 0.99, 0.98, math.nan, 1.0]
    cum_cos = [0.9, 0.99, 0.98, 0.5, 1.0]
    worst = [30.0, 5.0, 30.0, 30.0, 30.0]
    cum = [10.0, 20.0, 30.0, 30.0, 12.0]
    inputs = [math.inf, 10.0, 20.0, 30.0, 50.0]
    results = [_site(n, iso_sqnr=iso[i], iso_cos=iso_cos[i], cum_cos=cum_cos[i], worst_channel=worst[i],
                     cum_sqnr=cum[i], input_sqnr=inputs[i]) for i, n in enumerate("abcde")]
    # the drop is min(input, cap) - min(output, cap): an unquantized (inf) input counts as the cap
    assert [cumulative_drop(r) for r in results] == [SQNR_CAP_DB - 10.0, -10.0, -10.0, 0.0, 38.0]
    nodes = [r.node for r in results]
    assert gain_candidates(results, 1, nodes) == ["a", "b", "d"]
    assert gain_candidates(results, 1, nodes, named=["c", "zz"]) == ["a", "b", "d", "c"]
    assert gain_candidates(results, 2, ["a", "b", "c", "e"]) == ["a", "c", "b", "e"]
    assert gain_candidates(results, 0, nodes) == []


def test_rank_by_gain_keeps_rejected_kernels_first() -> None:
    results = [_site(n, rank=i + 1, severity="error" if n == "d" else "") for i, n in enumerate("abcd")]
    ranked = rank_by_gain(results, {"c": 0.2, "b": 0.05, "a": math.nan})
    assert [r.node for r in ranked] == ["d", "c", "b", "a"]
    assert [r.rank for r in ranked] == [1, 2, 3, 4]
    frame = layers_frame(ranked)
    assert math.isnan(frame.loc[3, "gain_if_float"]) and frame.loc[1, "gain_if_float"] == 0.2


def test_gain_candidates_all_measures_every_site(chain: tuple[Path, Path], tmp_path: Path) -> None:
    """`--gain-candidates all`: every site's gain, equal to each variant run as a whole model
    (`_whole_variant_gains`); summary.md says every site was measured; a word is exit 2."""
    model, calib = chain
    out = tmp_path / "all"
    assert main(["scan", str(model), "--calib", str(calib), "--out", str(out), "--quiet", "--no-report",
                 "--gain-candidates", "all", "--gain-samples", "0"]) == 0
    info = json.loads((out / "run.json").read_text())
    layers = pd.read_csv(out / "layers.csv")
    assert info["options"]["gain_candidates"] == "all" and info["options"]["gain_measured"] == len(layers)
    oracle = _whole_variant_gains(*chain)
    for r in layers.to_dict("records"):
        assert r["gain_if_float"] == pytest.approx(oracle[r["node"]], abs=1e-7)
    assert f"measured for {len(layers)} of {len(layers)} sites: every site (`--gain-candidates all`)" in (
        out / "summary.md").read_text()
    assert main(["scan", str(model), "--calib", str(calib), "--out", str(tmp_path / "bad"), "--quiet",
                 "--gain-candidates", "many"]) == 2


def test_bad_gain_candidates_is_a_usage_error(chain: tuple[Path, Path]) -> None:
    with pytest.raises(UsageError, match="--gain-candidates"):
        quantscan.scan(*chain, gain_candidates=-1)


def test_cli_gain_options_and_summary(chain: tuple[Path, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    model, calib = chain
    out = tmp_path / "run"
    assert main(["scan", str(model), "--calib", str(calib), "--out", str(out), "--quiet", "--no-report",
                 "--gain-candidates", "2", "--gain-samples", "4"]) == 0
    info = json.loads((out / "run.json").read_text())
    assert info["options"]["gain_candidates"] == 2 and 2 <= info["options"]["gain_measured"] <= 7
    assert info["options"]["gain_samples"] == 4 and info["options"]["gain_ort_level"] == "ORT_DISABLE_ALL"
    layers = pd.read_csv(out / "layers.csv")
    assert layers["gain_if_float"].notna().sum() == info["options"]["gain_measured"]
    summary = (out / "summary.md").read_text()
    assert summary.index("## Diagnosis") < summary.index("## Model output")
    indices = ", ".join(str(i) for i in info["options"]["gain_sample_indices"])
    assert len(info["options"]["gain_sample_indices"]) == 4
    assert (f"measured for {info['options']['gain_measured']} of {len(layers)} sites on the 4 of the 24 evaluation "
            f"samples that carry the most all-int8 output error (indices {indices})") in summary
    top = layers.iloc[0]
    assert f"**Where**: `{top['node']}`" in summary
    assert f"± {float(top['gain_if_float_stderr']):.2g} standard error, measured on the 4 of 24" in summary
    assert "on the 4 of 24 evaluation samples that carry the most all-int8 output error, where the cosine is" in summary
    off = tmp_path / "off"
    assert main(["scan", str(model), "--calib", str(calib), "--out", str(off), "--quiet", "--no-report",
                 "--no-gain"]) == 0
    assert json.loads((off / "run.json").read_text())["options"]["gain_measured"] == 0
    assert "gain_if_float" not in pd.read_csv(off / "layers.csv").columns
    assert "output gain not measured" in (off / "summary.md").read_text()
    capsys.readouterr()
    assert main(["scan", str(model), "--calib", str(calib), "--out", str(off), "--gain-candidates", "-3"]) == 2
    assert capsys.readouterr().err.strip().startswith("quantscan: error: --gain-candidates")
    assert main(["scan", str(model), "--calib", str(calib), "--out", str(off), "--gain-samples", "-1"]) == 2
    assert capsys.readouterr().err.strip().startswith("quantscan: error: --gain-samples")


def test_bisect_into_the_scan_folder_puts_its_plan_on_the_first_screen(
    chain: tuple[Path, Path], tmp_path: Path
) -> None:
    model, calib = chain
    out = tmp_path / "run"
    assert main(["scan", str(model), "--calib", str(calib), "--out", str(out), "--quiet", "--no-report"]) == 0
    before = (out / "summary.md").read_text()
    assert "**Bisect plan**" not in before
    assert main(["bisect", str(model), "--calib", str(calib), "--target-cosine", "0.9999", "--out", str(out),
                 "--quiet"]) == 0
    after = (out / "summary.md").read_text()
    plan = json.loads((out / "plan.json").read_text())
    assert "**Bisect plan**" in after and after.index("**Bisect plan**") < after.index("## Model output")
    for site in plan["sites"]:
        assert f"`{site['node']}`" in after.split("## Model output")[0]
    # a scan re-run into the folder keeps showing the plan
    assert main(["scan", str(model), "--calib", str(calib), "--out", str(out), "--quiet", "--no-report"]) == 0
    assert "**Bisect plan**" in (out / "summary.md").read_text()


def _jackknife(replicates: list[float]) -> float:
    """The jackknife standard error written out: √((n−1)/n · Σ(θ₋ᵢ − mean θ₋)²)."""
    n, mean = len(replicates), sum(replicates) / len(replicates)
    return math.sqrt((n - 1) / n * sum((r - mean) ** 2 for r in replicates))


def test_gain_standard_errors_equal_leave_one_out_whole_model_runs(chain: tuple[Path, Path]) -> None:
    """`gain_if_float_stderr` and `gain_if_float_gap_stderr` against an oracle that shares nothing with
    the gain graph: every variant run as a whole model (`gain.Evaluator`) on the gain samples with one
    left out, for each sample in turn, and the jackknife formula applied to those gains."""
    model, calib = chain
    result = quantscan.scan(model, calib, threads=1, gain_candidates="all", gain_samples=5)
    indices = list(result.run_info.options["gain_sample_indices"])
    assert len(indices) == 5
    ctx = prepare_scan(model, calib, threads=1)
    builder = mixed_builder(ctx)
    loo: dict[str, list[float]] = {s.node: [] for s in ctx.graph.sites}
    for left_out in indices:
        held = ctx.data.eval_set.select([i for i in indices if i != left_out])
        kept = replace(ctx, data=replace(ctx.data, eval_set=held))
        evaluator = Evaluator(kept, builder, "cosine")
        base = evaluator.evaluate(builder.precisions([])).worst["cosine"]
        for s in ctx.graph.sites:
            loo[s.node].append(evaluator.evaluate(builder.precisions([s.node])).worst["cosine"] - base)
    layers = result.layers.set_index("node")
    first = str(result.layers["node"].iloc[0])
    assert layers[Col.GAIN_IF_FLOAT_STDERR].gt(0).any()
    for node, gains in loo.items():
        assert layers.loc[node, Col.GAIN_IF_FLOAT_STDERR] == pytest.approx(_jackknife(gains), abs=1e-7), node
        gap = [a - b for a, b in zip(loo[first], gains, strict=True)]
        assert layers.loc[node, Col.GAIN_IF_FLOAT_GAP_STDERR] == pytest.approx(_jackknife(gap), abs=1e-7), node
    assert layers.loc[first, Col.GAIN_IF_FLOAT_GAP_STDERR] == 0.0
