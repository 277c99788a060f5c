"""`bisect --objective latency` and `--max-extra-ms` (issue 39 part 5): the plan re-chosen among the sets the
search measured, by estimated board time, judged on the held-out samples like every plan claim.

Oracles: the estimated time of each set is recomputed with `quantscan cost --plan` (cost/plans.py's
pricing of a plan.json, a separate path from the re-choice's own); the held-out figure is plan.json's
`achieved`, which `build_plan` measures for whatever set the plan keeps; the choice rules are checked
against a brute force over every subset in the unit tests.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import onnx
import pytest

from builders import write_chain
from conftest import asset_calib, asset_model
from quantscan.api import run_bisect
from quantscan.bisect.objective import Candidate, Objective, candidates, choose, objective_line, rechoose

TARGET_SQNR = 44.0
"""The chain's all-int8 SQNR is ~39.5 dB (tests/bisect/test_bisect_driver.py): the search keeps a few sites."""


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_chain(tmp_path_factory.mktemp("chain"))


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quantscan", *map(str, args)], capture_output=True, text=True,
                          check=False)


def priced_extra_ms(model: Path, plan: dict, sites: list[str], out: Path) -> float:
    """The estimated extra ms of `sites` kept at the plan's fallback, by `quantscan cost --plan` (a model
    input kept float is the chip's input layer, not a kernel: cost refuses it, plan.json leaves it unpriced)."""
    out.mkdir(parents=True, exist_ok=True)
    inputs = {i.name for i in onnx.load(str(model), load_external_data=False).graph.input}
    sites = [s for s in sites if s not in inputs]
    one = {"fallback": plan["fallback"], "sites": [{"node": s, "precision": plan["fallback"]} for s in sites]}
    (out / "p.json").write_text(json.dumps(one))
    proc = cli("cost", model, "--profile", "rk3588", "--plan", out / "p.json", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    cost = json.loads((out / "cost.json").read_text())
    base = cli("cost", model, "--profile", "rk3588", "--out", out / "int8", "--quiet")
    assert base.returncode == 0, base.stderr
    return float(cost["total_ms"]) - float(json.loads((out / "int8" / "cost.json").read_text())["total_ms"])


def test_latency_picks_a_cheaper_measured_set_that_meets_the_target_held_out(
    chain: tuple[Path, Path], tmp_path: Path
) -> None:
    model, calib = chain
    sites = run_bisect(model, calib, target_sqnr=TARGET_SQNR, out=tmp_path / "s", threads=1, profile="rk3588")
    fast = run_bisect(model, calib, target_sqnr=TARGET_SQNR, out=tmp_path / "l", threads=1, profile="rk3588",
                      objective="latency")
    doc = json.loads((tmp_path / "l" / "plan.json").read_text())
    record = doc["objective"]
    assert record["objective"] == "latency"
    # the fewest-sites plan is what --objective sites writes; the record prices it as plan.json does
    sites_doc = json.loads((tmp_path / "s" / "plan.json").read_text())
    assert record["sites_plan"]["float_sites"] == len(sites.plan.sites)
    assert record["sites_plan"]["extra_ms"] == pytest.approx(sites_doc["extra_ms"], abs=1e-5)
    chosen = record["chosen"]
    assert chosen is not None, record  # on this chain, keeping the whole chain float drops every converter
    assert {s.node for s in fast.plan.sites} == set(chosen["sites"])
    extra = priced_extra_ms(model, doc, [s["node"] for s in doc["sites"]], tmp_path / "cost")
    assert extra == pytest.approx(doc["extra_ms"], abs=1e-4) and extra < sites_doc["extra_ms"]
    # chosen among the MEASURED sets that passed the search, and it meets the target on the held-out samples
    measured = {tuple(sorted(s["sites"])): s["passed"] for s in doc["steps"]}
    assert measured[tuple(sorted(chosen["sites"]))] is True
    assert fast.plan.achieved is not None and fast.plan.achieved["sqnr_db"] >= TARGET_SQNR
    assert fast.reached and doc["status"] == "reached"


def test_the_session_records_the_objective_and_resume_keeps_it(chain: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = chain
    session = tmp_path / "s.json"
    first = run_bisect(model, calib, target_sqnr=TARGET_SQNR, session=session, threads=1, profile="rk3588",
                       objective="latency")
    assert json.loads(session.read_text())["options"]["objective"] == "latency"
    resumed = run_bisect(resume=session, threads=1, out=tmp_path / "r")
    assert resumed.plan.objective is not None and resumed.plan.objective["objective"] == "latency"
    assert sorted(s.node for s in resumed.plan.sites) == sorted(s.node for s in first.plan.sites)


def test_a_budget_gives_the_best_held_out_set_within_it_and_says_when_the_target_is_missed(
    chain: tuple[Path, Path], tmp_path: Path
) -> None:
    model, calib = chain
    none = run_bisect(model, calib, target_sqnr=TARGET_SQNR, out=tmp_path / "z", threads=1, profile="rk3588",
                      max_extra_ms=0.0)
    # only all-int8 costs nothing extra: the plan is all-int8, below the target, and says so
    assert none.plan.sites == () and none.plan.all_int8 is not None
    assert none.plan.all_int8["sqnr_db"] < TARGET_SQNR
    assert none.plan.status == "missed_within_budget" and not none.reached
    assert none.plan.objective is not None and none.plan.objective["target_met"] is False
    # said as the budget's miss, not as a set that met the target on the searched samples only
    assert none.plan.verdict is not None and none.plan.verdict["kind"] == "missed_within_budget"
    assert not any("searched samples" in w for w in none.warnings)
    proc = cli("bisect", model, "--calib", calib, "--target-sqnr", TARGET_SQNR, "--profile", "rk3588",
               "--max-extra-ms", "0", "--out", tmp_path / "c", "--quiet", "--threads", "1")
    assert proc.returncode == 1, proc.stderr  # not reached within the budget
    budget = 0.05
    some = run_bisect(model, calib, target_sqnr=TARGET_SQNR, out=tmp_path / "b", threads=1, profile="rk3588",
                      max_extra_ms=budget)
    doc = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert doc["extra_ms"] <= budget
    assert some.plan.achieved is not None and some.plan.achieved["sqnr_db"] >= TARGET_SQNR and some.reached


def test_a_profile_without_a_cost_table_exits_2_before_searching(chain: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = chain
    for flags in (["--objective", "latency"], ["--max-extra-ms", "1"]):
        proc = cli("bisect", model, "--calib", calib, "--target-sqnr", TARGET_SQNR, "--profile", "horizon-x3",
                   *flags, "--out", tmp_path / "o", "--quiet")
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("quantscan: error: ") and "[cost] table" in lines[0]
        assert flags[0] in lines[0] and "horizon-x3" in lines[0]
        assert not (tmp_path / "o" / "session.json").exists()


def brute_force(pool: list[Candidate], held: dict[tuple[str, ...], float], target: float,
                budget: float | None, plan_extra: float) -> tuple[str, ...] | None:
    """Written out: latency = the cheapest set that meets the target; budget = the best figure within it."""
    if budget is None:
        ok = [c for c in pool if held[c.sites] >= target and c.extra_ms < plan_extra]
        return min(ok, key=lambda c: (c.extra_ms, len(c.sites))).sites if ok else None
    within = [c for c in pool if c.extra_ms <= budget]
    return max(within, key=lambda c: (held[c.sites], -c.extra_ms)).sites if within else None


@pytest.mark.parametrize("budget", [None, 0.0, 0.25, 0.6, 10.0])
def test_choice_rules_match_a_brute_force_over_every_subset(budget: float | None) -> None:
    names = ["a", "b", "c", "d"]
    cost = {"a": 0.1, "b": 0.3, "c": 0.2, "d": 0.05}
    figure = {"a": 0.4, "b": 0.25, "c": 0.2, "d": 0.1}
    subsets = [tuple(c) for k in range(5) for c in itertools.combinations(names, k)]
    extra = {s: sum(cost[n] for n in s) + (0.07 if 0 < len(s) < 4 else 0.0) for s in subsets}  # one converter
    held = {s: 0.2 + sum(figure[n] for n in s) for s in subsets}
    target, plan = 0.75, ("a", "b", "c")  # fewest... by the search's own order, not the cheapest
    objective = Objective("sites" if budget is not None else "latency", budget)
    measured = [(s, held[s] + 0.01, held[s] + 0.01 >= target) for s in subsets]
    pool = candidates(measured, lambda s: extra[tuple(sorted(s))], objective, plan)
    picked = choose(objective, pool, lambda s: held[tuple(sorted(s))], target, plan, extra[plan])
    universe = [Candidate(s, held[s] + 0.01, held[s] + 0.01 >= target, extra[s]) for s in subsets]
    if budget is None:
        universe = [c for c in universe if c.passed]
    expected = brute_force(universe, held, target, budget, extra[plan])
    assert (picked.sites if picked is not None else None) == expected
    if picked is not None and budget is not None:
        assert picked.record["target_met"] == (held[picked.sites] >= target)
    assert math.isfinite(extra[plan])


@pytest.mark.real
def test_latency_on_a_real_model_is_never_dearer_than_the_fewest_sites_plan(assets: Path, tmp_path: Path) -> None:
    name = "mtcnn_onet"
    model, calib = asset_model(assets, name), asset_calib(assets, name)
    result = run_bisect(model, calib, target_cosine=0.9999, limit=8, threads=1, profile="rk3588",
                        objective="latency", out=tmp_path)
    doc = json.loads((tmp_path / "plan.json").read_text())
    record = doc["objective"]
    assert doc["extra_ms"] <= record["sites_plan"]["extra_ms"] + 1e-6
    extra = priced_extra_ms(model, doc, [s["node"] for s in doc["sites"]], tmp_path / "cost")
    assert extra == pytest.approx(doc["extra_ms"], abs=1e-4)
    if record["chosen"] is not None:
        assert result.plan.achieved is not None and result.plan.achieved["cosine"] >= 0.9999


class ChainPricer:
    """A fake pricer over a chain a-b-c-d-e: each float site adds 0.01 ms of kernel, each place where a float and
    an int8 site meet (or a float site meets the chain's int8 ends) one 0.1 ms converter."""

    site_nodes = ["a", "b", "c", "d", "e"]

    def price(self, plan: dict[str, str]) -> object:
        flags = [False, *(n in plan for n in self.site_nodes), False]
        crossings = sum(x != y for x, y in itertools.pairwise(flags))
        kernels = 0.01 * len(plan)
        return type("Est", (), {"kernels_ms": kernels, "boundaries_ms": 0.1 * crossings,
                                "boundaries": [None] * crossings, "total_ms": kernels + 0.1 * crossings})()


def test_a_stayed_latency_plan_says_where_its_time_goes() -> None:
    """The fewest-sites plan {a, c, e} on the chain pays 6 converters (+0.6 ms) and 3 kernels (+0.03 ms); the
    whole chain at the fallback pays 5 kernels and the 2 converters at its ends (+0.25 ms)."""
    step = type("Step", (), {})
    known = []
    for sites, value in ((("a", "c", "e"), 0.99), (("a", "b", "c", "e"), 0.995), (("c",), 0.5)):
        s = step()
        s.sites, s.value, s.passed = sites, value, value >= 0.99
        known.append(s)
    held = {("a", "c", "e"): 0.992, ("a", "b", "c", "e"): 0.98}
    choice, record = rechoose(Objective("latency"), ChainPricer(), "fp16", known, ["a", "c", "e"],
                              lambda sets: lambda sites: held[tuple(sorted(sites))], 0.99)
    assert choice is None  # {a, b, c, e} is cheaper (4 converters) but misses held out
    assert record["sites_plan"]["extra_ms"] == pytest.approx(0.03 + 0.6)
    assert record["split"] == {"kernels_ms": pytest.approx(0.03), "boundaries_ms": pytest.approx(0.6),
                               "boundaries": 6, "whole_model_extra_ms": pytest.approx(0.05 + 0.2)}
    line = objective_line(record)
    assert line is not None and "+0.600 ms are its 6 converter(s)" in line and "+0.250 ms" in line


def test_the_objective_and_the_plan_judge_each_set_held_out_once(
    chain: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-choice reads the search judge's claims, the plan's too (bisect/finish.py): the fewest-sites plan
    and the chosen set, which both ask for, are each measured on the held-out samples once, and plan.json's
    held-out figures are those very measurements."""
    import quantscan.bisect.realise as realise

    judged: list[tuple[str, ...]] = []

    class Counting(realise.RealisedEvaluator):
        """The held-out evaluator (bisect/realise.HeldOut makes it; the search's is bisect/simulated.py's)."""

        def judge(self, prec: Sequence[str]) -> realise.Judged:
            judged.append(tuple(prec))
            return super().judge(prec)

    monkeypatch.setattr(realise, "RealisedEvaluator", Counting)
    model, calib = chain
    fast = run_bisect(model, calib, target_sqnr=TARGET_SQNR, out=tmp_path / "l", threads=1, profile="rk3588",
                      objective="latency")
    record = json.loads((tmp_path / "l" / "plan.json").read_text())["objective"]
    assert record["chosen"] is not None and record["candidates_judged"] >= 1
    assert judged and len(judged) == len(set(judged)), judged  # no set measured twice on the held-out samples
    # the plan (the chosen set) claims the figure the re-choice judged it by
    assert fast.plan.achieved is not None
    assert fast.plan.achieved["sqnr_db"] == record["chosen"]["held_out_value"]
