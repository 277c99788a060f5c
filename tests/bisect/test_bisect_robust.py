"""Issue 32 part 1: searched and held-out samples, rounding realisations, lower bounds and intervals.

Oracles: the split and the factors checked by their definitions; the interval against the jackknife
written out in numpy here; a planted noise-fitting site driven through the real state machine; plan.json
against its old keys and the held-out samples run in plain onnxruntime.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import write_chain
from quantscan.api import run_bisect
from quantscan.bisect import Bisector, Target
from quantscan.bisect.robust import (
    Rounding,
    SampleSums,
    pooled_cosine,
    scale_factors,
    spread_of,
)
from quantscan.errors import UsageError
from quantscan.heldout import split_indices
from quantscan.report.verdict import plan_lines
from quantscan.runner import Runner


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_chain(tmp_path_factory.mktemp("chain"))


@pytest.mark.parametrize("n", [2, 3, 16, 17])
def test_split_is_disjoint_complete_interleaved_and_deterministic(n: int) -> None:
    searched, held = split_indices(n)
    assert set(searched).isdisjoint(held) and sorted(searched + held) == list(range(n))
    assert all(i % 2 == 0 for i in searched) and all(i % 2 == 1 for i in held)
    assert split_indices(n) == (searched, held)


def test_split_refuses_one_sample() -> None:
    with pytest.raises(UsageError, match="at least 2 samples"):
        split_indices(1)


def test_scale_factors_are_seeded_and_order_free() -> None:
    names = [f"t{i}" for i in range(50)]
    assert set(scale_factors(names, 0, 7, 0.05).values()) == {1.0}
    one = scale_factors(names, 1, 7, 0.05)
    assert one == scale_factors(list(reversed(names)), 1, 7, 0.05)  # the tensors' order does not matter
    assert one != scale_factors(names, 2, 7, 0.05) and one != scale_factors(names, 1, 8, 0.05)
    logs = np.log(np.array(list(one.values())))
    assert 0.02 < logs.std() < 0.08  # log-normal with sigma 0.05, 50 draws


def _jackknife_interval(per_realisation: list[SampleSums], z: float) -> tuple[float, float, float]:
    """The interval written out: pooled cosine per realisation, leave-one-out replicates, their s.e."""
    lows, highs, values = [], [], []
    for sxy, sxx, syy in per_realisation:
        c = sxy.sum() / np.sqrt(sxx.sum() * syy.sum())
        n = sxy.size
        reps = np.array([
            (sxy.sum() - sxy[i]) / np.sqrt((sxx.sum() - sxx[i]) * (syy.sum() - syy[i])) for i in range(n)
        ])
        se = np.sqrt((n - 1) / n * np.sum((reps - reps.mean()) ** 2))
        values.append(c)
        lows.append(c - z * se)
        highs.append(c + z * se)
    return values[0], min(lows), min(1.0, max(highs))


def test_interval_is_the_jackknife_bound_over_realisations() -> None:
    rng = np.random.default_rng(3)
    sums = []
    for _ in range(4):
        x = rng.standard_normal((8, 100))
        y = x + 0.1 * rng.standard_normal((8, 100))
        sums.append(((x * y).sum(1), (x * x).sum(1), (y * y).sum(1)))
    got = spread_of(sums, z=1.5)
    nominal, low, high = _jackknife_interval(sums, 1.5)
    assert got.nominal == pytest.approx(nominal, abs=1e-12)
    assert got.low == pytest.approx(low, abs=1e-12) and got.high == pytest.approx(high, abs=1e-12)
    assert got.low < got.nominal < got.high
    assert pooled_cosine(sums[2]) == pytest.approx(got.values[2], abs=1e-15)


def _planted(realisations: int) -> Callable[[frozenset[str]], float]:
    """Per realisation and sample, cosine = 0.975 + gains (per-sample sums x·y = c, x² = y² = 1, so the
    pooled cosine is the samples' mean). `broad` helps by 0.016 everywhere; `noise` by 0.02 in
    quantscan's own rounding (realisation 0) only: the kind of set a search fits to one rounding."""
    wobble = np.linspace(-0.0005, 0.0005, 8)

    def value(float_set: frozenset[str]) -> float:
        per_realisation = []
        for r in range(realisations):
            c = 0.975 + wobble + (0.016 if "broad" in float_set else 0.0)
            c = c + (0.02 if "noise" in float_set and r == 0 else 0.0)
            if len(float_set) >= 6:  # every site float: the float model
                c = np.ones(8)
            per_realisation.append((c, np.ones(8), np.ones(8)))
        spread = spread_of(per_realisation)
        return spread.low if realisations > 1 else spread.nominal

    return value


def _search(realisations: int) -> tuple[str, ...]:
    order = ["noise", "broad", "a", "b", "c", "d"]  # the noisy site's nominal gain ranks it first
    machine = Bisector(order, Target("cosine", 0.99))
    value = _planted(realisations)
    while (cand := machine.next()) is not None:
        machine.record(value(frozenset(cand.sites)))
    assert machine.outcome is not None and machine.outcome.status == "reached"
    return machine.outcome.sites


def test_lower_bound_rejects_a_noise_fitting_site() -> None:
    assert _search(1) == ("noise",)  # one rounding: the site that fits it wins
    assert _search(4) == ("broad",)  # its gain does not hold in the lower bound over realisations


def test_rounding_refuses_bad_settings() -> None:
    for kwargs in ({"realisations": 0}, {"spread": -0.1}, {"holdout": "halves"}):
        with pytest.raises(UsageError):
            Rounding(**kwargs)  # type: ignore[arg-type]


def test_plan_json_keeps_old_keys_and_claims_held_out_figures(chain: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = chain
    out = tmp_path / "run"
    result = run_bisect(model, calib, target_cosine=0.9999, out=out, save_qdq=out / "mixed.onnx", threads=1)
    raw = json.loads((out / "plan.json").read_text())
    old = ("format", "tool", "model", "model_sha256", "target", "fallback", "mode", "status", "reached",
           "all_int8", "all_float", "achieved", "sites", "pareto", "evaluations", "steps")
    assert all(k in raw for k in old)
    held = raw["held_out"]
    x = np.load(calib / "x.npy")
    assert held["search_samples"] + held["held_out_samples"] == len(x) and held["realisations"] == 4
    assert raw["interval"]["low"] <= raw["achieved"]["cosine"] <= raw["interval"]["high"]
    for point in raw["pareto"]:
        assert point["interval"]["low"] <= point["value"] <= point["interval"]["high"] + 1e-12
        assert "search_value" in point
    # the claim is the held-out samples' pooled cosine (odd samples), run here in plain onnxruntime
    runner = Runner(threads=1)
    ref = runner.session(onnx.load(model)).run({"x": x[1::2]})["y"].astype(np.float64)
    got = runner.session(onnx.load(out / "mixed.onnx")).run({"x": x[1::2]})["y"].astype(np.float64)
    cosine = float((ref * got).sum() / math.sqrt((ref**2).sum() * (got**2).sum()))
    assert cosine == pytest.approx(raw["achieved"]["cosine"], abs=2e-6)
    line = " ".join(plan_lines(result.plan.to_json()))
    assert f"interval [{raw['interval']['low']:.5g}, {raw['interval']['high']:.5g}]" in line


def test_one_realisation_without_holdout_is_the_old_search(chain: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = chain
    plan = run_bisect(model, calib, target_cosine=0.9999, realisations=1, holdout="none", threads=1).plan
    steps = {frozenset(s.sites): s for s in plan.steps}
    achieved = steps[frozenset(s.node for s in plan.sites)] if plan.sites else None
    assert plan.held_out is not None and plan.held_out["held_out_samples"] == plan.held_out["search_samples"]
    if achieved is not None:  # the claim is the search's own figure again
        assert plan.achieved is not None and plan.achieved["cosine"] == pytest.approx(achieved.value, abs=1e-12)


def test_realised_builder_scales_activations_only(chain: tuple[Path, Path]) -> None:
    """A realisation multiplies each activation scale by its factor; zero points and weights stay."""
    from quantscan.scanning.gain import mixed_builder, realised_builder
    from quantscan.scanning.prepare import prepare_scan

    model, calib = chain
    builder = mixed_builder(prepare_scan(model, calib, threads=1))
    acts = builder.base_plan.activations
    factors = {t: 1.0 + 0.1 * k for k, t in enumerate(sorted(acts))}
    twin = realised_builder(builder, factors)
    for t, qp in acts.items():
        got = twin.base_plan.activations[t]
        np.testing.assert_allclose(got.scale, qp.scale * np.float32(factors[t]), rtol=1e-6)
        assert np.array_equal(got.zero_point, qp.zero_point)
    assert twin.base_plan.weights is builder.base_plan.weights and builder.base_plan.activations is acts


def test_explicit_eval_folder_is_the_held_out_set(chain: tuple[Path, Path], tmp_path: Path) -> None:
    """`--eval DIR`: the search runs on --calib, every claim on DIR (no interleaving of either)."""
    model, calib = chain
    held = tmp_path / "eval"
    held.mkdir()
    x = np.random.default_rng(5).normal(0, 1, (10, np.load(calib / "x.npy").shape[1])).astype(np.float32)
    np.save(held / "x.npy", x)
    plan = run_bisect(model, calib, target_cosine=0.9999, eval=str(held), threads=1).plan
    assert plan.held_out is not None and plan.held_out["split"].startswith("--eval")
    assert plan.held_out["held_out_samples"] == 10 and plan.held_out["search_samples"] == len(np.load(calib / "x.npy"))


JUDGING_ORDER = (1, 2, 3, 0)
"""The order the search's judge measures 4 realisations in, written out: perturbed first, quantscan's own last."""


def test_judging_order_puts_realisation_0_last_and_covers_every_realisation() -> None:
    from quantscan.bisect.robust import judging_order

    assert judging_order(4) == JUDGING_ORDER
    assert judging_order(1) == (0,) and judging_order(2) == (1, 0)
    for n in range(1, 9):
        assert sorted(judging_order(n)) == list(range(n)) and judging_order(n)[-1] == 0


def _judges(chain: tuple[Path, Path], target: float) -> tuple[object, object, object]:
    """(builder, full judge, settled judge) on the chain's searched samples, 4 realisations of spread 0.05."""
    from quantscan.bisect.realise import RealisedEvaluator, split_context
    from quantscan.scanning.gain import mixed_builder
    from quantscan.scanning.prepare import prepare_scan

    model, calib = chain
    rounding = Rounding(4, 0.05)
    split = split_context(prepare_scan(model, calib, threads=1), rounding, False)
    builder = mixed_builder(split.search)
    aim = Target("cosine", target)
    return (builder, RealisedEvaluator(split.search, builder, aim, rounding),
            RealisedEvaluator(split.search, builder, aim, rounding, stop_early=True))


@pytest.mark.parametrize("target", [0.9, 0.999, 0.99999])
def test_settled_judge_gives_the_full_verdict_with_fewer_realisations(chain: tuple[Path, Path], target: float) -> None:
    """The search's judge measures the realisations in JUDGING_ORDER and stops a candidate at the first whose
    bound misses the target: the verdict is the one every realisation gives, a passing candidate is measured in
    full (same figures), and a settled one's bound is the minimum over the realisations it measured, which the
    full bound lies under; its figures are realisation 0's if measured, else the failing realisation's."""
    builder, full, settled = _judges(chain, target)
    aim = Target("cosine", target)
    names = [s.node for s in builder.sites]  # type: ignore[attr-defined]
    for sites in ([], names[:1], names[1:], names):
        prec = builder.precisions(sites)  # type: ignore[attr-defined]
        a, b = full.judge(prec), settled.judge(prec)  # type: ignore[attr-defined]
        assert aim.met(a.value) == aim.met(b.value)
        assert len(a.realisations) == 4 and not a.settled and "realisations_measured" not in a.metrics()
        bounds = [c - s for c, s in _bounds(a)]
        if aim.met(b.value):
            assert len(b.realisations) == 4 and b.value == a.value and b.metrics() == a.metrics()
            continue
        measured = len(b.realisations)
        taken = JUDGING_ORDER[:measured]
        assert b.settled == (measured < 4)
        assert b.value == pytest.approx(min(bounds[r] for r in taken), abs=1e-12)
        assert b.value >= a.value - 1e-12
        if measured > 1:  # it stopped at the first realisation that put the bound under the target
            assert aim.met(min(bounds[r] for r in taken[:-1]))
        shown = 0 if 0 in taken else taken[-1]
        assert b.nominal.worst["cosine"] == a.realisations[shown].worst["cosine"]
        assert b.metrics().get("figures_realisation", 0.0) == shown


def test_a_candidate_a_perturbed_realisation_fails_is_settled_by_one_sweep(chain: tuple[Path, Path]) -> None:
    """All-int8 at a target just above realisation 1's bound (so it fails, whatever realisation 0 gives): the
    search's judge runs one sweep, realisation 1's, and records its figures as realisation 1's."""
    builder, full, _ = _judges(chain, 0.9)
    prec = builder.precisions([])  # type: ignore[attr-defined]
    a = full.judge(prec)  # type: ignore[attr-defined]
    cos1, se1 = _bounds(a)[1]
    _, _, settled = _judges(chain, min(1.0, cos1 - se1 + 1e-9))
    swept: list[int] = []
    for r, evaluator in enumerate(settled.evaluators):  # type: ignore[attr-defined]
        evaluator.evaluate = _counted(evaluator.evaluate, r, swept)
    b = settled.judge(prec)  # type: ignore[attr-defined]
    assert swept == [1]
    assert b.metrics()["realisations_measured"] == 1 and b.metrics()["figures_realisation"] == 1
    assert b.nominal.worst["cosine"] == a.realisations[1].worst["cosine"]
    assert b.value == pytest.approx(cos1 - se1, abs=1e-12)


def _counted(evaluate: Callable[[object], object], realisation: int, swept: list[int]) -> Callable[[object], object]:
    """`evaluate`, noting `realisation` in `swept` at each call (one sweep of the searched samples)."""
    def counted(prec: object) -> object:
        swept.append(realisation)
        return evaluate(prec)
    return counted


def _bounds(judged: object) -> list[tuple[float, float]]:
    """Per realisation, (pooled cosine, 1 jackknife standard error), from its per-sample sums."""
    from quantscan.bisect.robust import pooled_cosine, pooled_stderr

    return [(pooled_cosine(m.sums[m.output]), pooled_stderr(m.sums[m.output]))
            for m in judged.realisations]  # type: ignore[attr-defined]
