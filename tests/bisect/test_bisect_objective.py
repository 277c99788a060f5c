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

    def site_neighbours(self) -> dict[str, set[str]]:
        chain = self.site_nodes
        return {n: {chain[j] for j in (i - 1, i + 1) if 0 <= j < len(chain)} for i, n in enumerate(chain)}

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
    # closing the plan's islands {b} and {d} gives the whole chain: judged too, as every site (said once)
    held = {("a", "c", "e"): 0.992, ("a", "b", "c", "e"): 0.98, ("a", "b", "c", "d", "e"): 0.985}
    choice, record = rechoose(Objective("latency"), ChainPricer(), "fp16", known, ["a", "c", "e"],
                              lambda sets: lambda sites: held[tuple(sorted(sites))], 0.99)
    assert choice is None  # {a, b, c, e} and the whole chain are cheaper but miss held out
    assert record["candidates_judged"] == 2
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
    # (plan.json spells an exact output's SQNR "inf": with every reader of the input float on rk3588 the input is
    # not rounded either, so a plan keeping the whole chain float reproduces FP32)
    assert fast.plan.achieved["sqnr_db"] == float(record["chosen"]["held_out_value"])


def conv_chain(heavy_kernel: int = 5, channels: int = 64, size: int = 32) -> onnx.ModelProto:
    """x -> c0 -> c1 -> c2 -> c3 -> c4: 1x1 Convs in the middle, `heavy_kernel` x `heavy_kernel` ones at the
    ends (their fp16 time is more than a converter's, the middle ones' much less)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, prev = [], [], "x"
    for i in range(5):
        k = heavy_kernel if i in (0, 4) else 1
        weights.append(numpy_helper.from_array(rng.normal(0, 0.1, (channels, channels, k, k)).astype(np.float32),
                                               f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"t{i}"], name=f"c{i}", pads=[k // 2] * 4))
        prev = f"t{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [1, channels, size, size])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_closing_an_int8_island_is_the_cheapest_superset_by_the_pricers_formula_written_out() -> None:
    """Plan {c1, c3} on the Conv chain: c2 between them is an int8 island paying two converters. Oracle, by
    hand: every superset of the plan among the chain's Conv sites, priced as the sum of its kernels' fp16 extra
    (each kernel's row of `quantscan cost`) plus one converter per place a float and an int8 Conv meet, each
    converter written out as the Pricer's formula (fixed cost + the tensor read at one width, written at the
    other, at the DRAM rate); the cheapest must be what close_islands grows, and rechoose must pick it."""
    from quantscan.compat.profiles import load_profile
    from quantscan.cost import Pricer
    from quantscan.cost.islands import close_islands

    pricer = Pricer.of(conv_chain(), load_profile("rk3588"))
    convs = ["c0", "c1", "c2", "c3", "c4"]
    assert pricer.site_nodes == ["x", *convs]  # the input site and the five Conv kernels
    base, every = pricer.price({}), pricer.price({s: "float" for s in convs})
    kernel_extra = {a.node: b.est_ms - a.est_ms for a, b in zip(base.per_site, every.per_site, strict=True)}
    table = pricer.table
    tensor = 64 * 32 * 32
    converter = table.converter_us * 1e-3 + tensor * (1 + 2) / (table.dram_gbps * 1e9) * 1e3  # int8 <-> fp16

    def by_hand(floats: set[str]) -> float:
        flags = [c in floats for c in convs]
        meets = sum(a != b for a, b in itertools.pairwise(flags))
        return sum(kernel_extra[c] for c in floats) + meets * converter

    plan = {"c1", "c3"}
    supersets = [plan | set(extra) for k in range(4) for extra in itertools.combinations(["c0", "c2", "c4"], k)]
    cheapest = min(supersets, key=lambda s: (by_hand(s), len(s)))
    assert cheapest == {"c1", "c2", "c3"}, {tuple(sorted(s)): round(by_hand(s), 5) for s in supersets}
    assert by_hand(cheapest) < by_hand(plan) - converter  # closing the island saves most of two converters

    def extra_ms(sites: Sequence[str]) -> float:
        return pricer.price({s: "fp16" for s in sites}).total_ms - base.total_ms

    for s in supersets:  # the Pricer agrees with the hand formula on every superset
        assert extra_ms(sorted(s)) == pytest.approx(by_hand(s), rel=1e-9, abs=1e-12)
    grown = close_islands(extra_ms, pricer.site_neighbours(), sorted(plan), pricer.site_nodes)
    assert set(grown) == cheapest

    step = type("Step", (), {"sites": ("c1", "c3"), "value": 0.999, "passed": True})
    judged: list[tuple[str, ...]] = []

    def held_out_of(sets: Sequence[Sequence[str]]):  # every set meets the target held out
        judged.extend(tuple(sorted(s)) for s in sets)
        return lambda sites: 0.999

    choice, record = rechoose(Objective("latency"), pricer, "fp16", [step], sorted(plan), held_out_of, 0.99,
                              every_site=pricer.site_nodes)
    assert choice is not None and set(choice.sites) == cheapest
    chosen = record["chosen"]
    assert chosen["origin"] == "closed_islands" and chosen["extra_ms"] == pytest.approx(by_hand(cheapest), abs=1e-6)
    assert chosen["split"]["boundaries"] == 2 and record["split"]["boundaries"] == 4
    # each set judged held out once: the plan's, the grown one, and every site (the input too) when it is
    # estimated cheaper than the plan
    every_judged = extra_ms(pricer.site_nodes) < by_hand(plan)
    expected = {tuple(sorted(cheapest)), ("c1", "c3")} | ({tuple(sorted(pricer.site_nodes))} if every_judged else set())
    assert sorted(judged) == sorted(expected)
    line = objective_line(record)
    assert line is not None and "grown to close the int8 islands" in line
    # the record lists every judged candidate with its held-out figure and estimate
    assert {j["origin"] for j in record["judged"]} >= {"closed_islands"}
    assert min(j["extra_ms"] for j in record["judged"]) == chosen["extra_ms"]
    from quantscan.report.verdict import plan_lines

    summary = "\n".join(plan_lines({"target": {"metric": "cosine", "value": 0.99}, "sites": [], "objective": record}))
    assert "**Objective**: --objective latency: chose 3 site(s)" in summary
