"""The bisection state machine: pure, no onnxruntime, onnx or pandas."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from bisect_helpers import SITES, additive, run

from quantscan.bisect.state import Bisector, Mark, SessionFileError, Target
from quantscan.errors import UsageError

HEAVY = ("onnx", "onnxruntime", "pandas")


def test_state_machine_imports_neither_onnx_nor_onnxruntime_nor_pandas() -> None:
    """A fresh interpreter: importing the machine must not load the heavy libraries (they take seconds)."""
    code = f"import quantscan.bisect.state, sys; print([m for m in {HEAVY!r} if m in sys.modules])"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout


def test_search_uses_log_evaluations_and_prunes_to_a_minimal_set() -> None:
    weights = {n: 0.001 for n in SITES} | {"s3": 0.05, "s7": 0.04}
    order = ["s3", "s7", *[n for n in SITES if n not in ("s3", "s7")]]
    machine = Bisector(order, Target("cosine", 0.985))
    steps = run(machine, additive(weights))
    assert machine.outcome is not None and machine.outcome.status == "reached"
    assert set(machine.outcome.sites) == {"s3", "s7"}
    before_prune = [s for s in steps if s.phase != "prune"]
    assert len(before_prune) <= 2 + math.ceil(math.log2(len(SITES)))
    assert len(before_prune) <= 2 * math.log2(len(SITES)) + 2
    assert [s.phase for s in steps[:2]] == ["all_float", "all_int8"]


def test_prune_drops_members_the_ordering_got_wrong_and_result_is_one_minimal() -> None:
    """Non-monotone metric: s0 and s1 float together hurt (short of all float), so every prefix that
    holds both fails, the search ends at the full set, and pruning must find {s5, s9}."""

    def value(s: frozenset[str]) -> float:
        v = 0.9 + 0.05 * ("s5" in s) + 0.05 * ("s9" in s) + 0.001 * len(s)
        return v - (0.2 if {"s0", "s1"} <= s and len(s) < len(SITES) else 0.0)

    machine = Bisector(SITES, Target("cosine", 0.99))
    run(machine, value)
    assert machine.outcome is not None and machine.outcome.status == "reached"
    plan = set(machine.outcome.sites)
    assert plan == {"s5", "s9"}
    assert value(frozenset(plan)) >= 0.99
    for m in plan:
        assert value(frozenset(plan - {m})) < 0.99, f"{m} could be dropped"


def test_unreachable_is_said_after_one_evaluation() -> None:
    machine = Bisector(SITES, Target("cosine", 0.99))
    steps = run(machine, lambda s: math.nan)  # a broken model: NaN everywhere
    assert len(steps) == 1 and steps[0].phase == "all_float"
    assert machine.outcome is not None and machine.outcome.status == "unreachable"


def test_all_int8_already_meeting_the_target_gives_an_empty_plan() -> None:
    machine = Bisector(SITES, Target("sqnr", 20.0))
    run(machine, lambda s: 30.0)
    assert machine.outcome is not None and machine.outcome.status == "already_met"
    assert machine.outcome.sites == ()


def test_known_sets_are_never_measured_twice() -> None:
    asked: list[tuple[str, ...]] = []

    def value(s: frozenset[str]) -> float:
        return 0.9 + 0.1 * ("s15" in s)

    machine = Bisector(SITES, Target("cosine", 0.95))
    while (cand := machine.next()) is not None:
        asked.append(cand.sites)
        machine.record(value(frozenset(cand.sites)))
    assert len(asked) == len(set(asked))
    assert machine.outcome is not None and machine.outcome.sites == ("s15",)


def test_replay_resumes_without_asking_again_and_refuses_foreign_events() -> None:
    value = additive({"s2": 0.05, "s4": 0.05})
    full = Bisector(SITES, Target("cosine", 0.99))
    run(full, value)
    half = full.events[: len(full.events) // 2]
    resumed = Bisector(SITES, Target("cosine", 0.99))
    resumed.replay(half)
    rest = run(resumed, value)
    assert [s.sites for s in rest] == [s.sites for s in full.steps[len(half) :]]
    assert resumed.outcome == full.outcome
    other = Bisector(list(reversed(SITES)), Target("cosine", 0.99))
    with pytest.raises(SessionFileError, match="do not follow"):
        other.replay(full.events)


def test_marks_pin_sites_and_restart_the_search() -> None:
    value = additive({"s2": 0.05, "s4": 0.05, "s6": 0.05})
    machine = Bisector(SITES, Target("cosine", 0.99))
    run(machine, value)
    measured = len(machine.steps)
    machine.mark(keep_float=["s10"], force_quant=["s2"])
    run(machine, value)
    assert machine.outcome is not None
    assert set(machine.outcome.sites) == {"s4", "s6", "s10"}
    assert isinstance(machine.events[measured], Mark)
    with pytest.raises(UsageError, match="expected site node names"):
        machine.mark(keep_float=["nope"])
    with pytest.raises(UsageError, match="both name"):
        machine.mark(keep_float=["s1"], force_quant=["s1"])


def test_force_quant_can_make_the_target_unreachable() -> None:
    machine = Bisector(SITES, Target("cosine", 0.99), force_quant=["s4"])
    run(machine, lambda s: 0.9 + 0.1 * ("s4" in s))
    assert machine.outcome is not None and machine.outcome.status == "unreachable"


def test_first_bad_layer_finds_a_measured_boundary() -> None:
    """Quantizing s11 (the 12th site in graph order) breaks the output."""
    machine = Bisector(SITES, Target("cosine", 0.99), mode="first_bad")
    steps = run(machine, lambda s: 1.0 if "s11" in s else 0.95)
    assert machine.outcome is not None and machine.outcome.first_bad == "s11"
    assert len(steps) <= 2 + math.ceil(math.log2(len(SITES)))


def test_pareto_keeps_only_improving_points() -> None:
    machine = Bisector(SITES, Target("cosine", 0.99))
    run(machine, additive({"s0": 0.05, "s1": 0.05}))
    rows = machine.pareto()
    assert [r.float_sites for r in rows] == sorted(r.float_sites for r in rows)
    values = [r.value for r in rows]
    assert values == sorted(values) and len(set(values)) == len(values)


def test_target_validation() -> None:
    with pytest.raises(UsageError):
        Target("psnr", 30.0)
    with pytest.raises(UsageError):
        Target("cosine", math.nan)
    assert not Target("cosine", 0.9).met(math.nan)


def test_stop_early_takes_the_smallest_measured_passing_set_and_replay_goes_on() -> None:
    """A time budget ends the search where it stands: the plan is the smallest set measured to meet the
    target (what the later phases would only shrink), and the same events replayed go on searching."""
    weights = {n: 0.001 for n in SITES} | {"s3": 0.05, "s7": 0.04}
    value = additive(weights)
    finished = Bisector(SITES, Target("cosine", 0.985))
    reference = run(finished, value)
    machine = Bisector(SITES, Target("cosine", 0.985))
    k = next(i for i, s in enumerate(reference) if s.phase in ("reduce", "prune"))
    for _ in range(k):
        cand = machine.next()
        assert cand is not None
        machine.record(value(frozenset(cand.sites)))
    outcome = machine.stop_early()
    passing = [s for s in reference[:k] if s.value >= 0.985]
    smallest = min(passing, key=lambda s: (len(s.sites), -s.value))
    assert outcome.status == "budget" and outcome.sites == smallest.sites and machine.next() is None
    assert value(frozenset(outcome.sites)) >= 0.985
    again = Bisector(SITES, Target("cosine", 0.985))
    again.replay(machine.events)
    assert again.next() is not None  # not an event: a resumed search continues
    run(again, value)
    assert again.outcome is not None and again.outcome.sites == finished.outcome.sites  # type: ignore[union-attr]


def test_stop_early_before_any_pass_has_no_plan() -> None:
    machine = Bisector(SITES, Target("cosine", 0.985))
    cand = machine.next()
    assert cand is not None and cand.phase == "all_float"
    outcome = machine.stop_early()
    assert outcome.status == "budget_no_plan" and outcome.sites == () and math.isnan(outcome.value)


MANY = [f"s{i}" for i in range(40)]
"""Enough sites for the early stop (EARLY_STOP_MIN)."""


def _needs_all_but_one(s: frozenset[str]) -> float:
    """Every site costs 0.01 alone-int8: the 0.99 target needs 39 of the 40 sites float."""
    return 0.6 + 0.01 * len(s)


def test_search_stops_early_when_the_target_needs_nearly_every_site_float() -> None:
    """Issue 38: a prefix search ending near the full set is not trimmed member by member; the plan is the
    measured passing prefix, and the outcome says why it stopped."""
    full = Bisector(MANY, Target("cosine", 0.99))
    full_steps = run(full, _needs_all_but_one)
    early = Bisector(MANY, Target("cosine", 0.99), early_stop=True)
    steps = run(early, _needs_all_but_one)
    assert early.outcome is not None and early.outcome.status == "reached"
    assert early.outcome.early_stop is not None and "39" in early.outcome.early_stop
    assert {s.phase for s in steps} <= {"all_float", "all_int8", "search"}
    plan = frozenset(early.outcome.sites)
    assert len(plan) == 39 and _needs_all_but_one(plan) >= 0.99
    failing = [s for s in steps if not s.passed and len(s.sites) > 0.75 * len(MANY)]
    assert failing, "the stop rests on a measured failing set above the share"
    assert len(steps) <= 2 + math.ceil(math.log2(len(MANY)))
    assert 3 * len(steps) < len(full_steps), (len(steps), len(full_steps))
    assert full.outcome is not None and full.outcome.early_stop is None


def test_small_searches_never_stop_early() -> None:
    """Under EARLY_STOP_MIN free sites the trimming is cheap and is what repairs the order: it always runs."""
    machine = Bisector(SITES, Target("cosine", 0.99), early_stop=True)
    steps = run(machine, lambda s: 0.84 + 0.01 * len(s))  # 15 of the 16 sites needed
    assert machine.outcome is not None and machine.outcome.early_stop is None
    assert {s.phase for s in steps} & {"reduce", "prune"}


def test_early_stop_changes_nothing_when_few_sites_are_needed() -> None:
    weights = {n: 0.001 for n in MANY} | {"s3": 0.05, "s7": 0.04}
    order = ["s3", "s7", *[n for n in MANY if n not in ("s3", "s7")]]
    runs = [run(Bisector(order, Target("cosine", 0.985), early_stop=flag), additive(weights))
            for flag in (False, True)]
    assert [(s.sites, s.phase) for s in runs[0]] == [(s.sites, s.phase) for s in runs[1]]
    assert "prune" in {s.phase for s in runs[0]}


def test_early_stop_is_kept_by_replay_and_fork() -> None:
    machine = Bisector(MANY, Target("cosine", 0.99), early_stop=True)
    for _ in range(3):
        cand = machine.next()
        assert cand is not None
        machine.record(_needs_all_but_one(frozenset(cand.sites)))
    twin = machine.fork()
    assert twin.early_stop and twin.next() == machine.next()
    run(twin, _needs_all_but_one)
    run(machine, _needs_all_but_one)
    assert twin.outcome == machine.outcome and twin.outcome is not None and twin.outcome.early_stop
