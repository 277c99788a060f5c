"""run_bisect end to end on the tiny chain model: files, resume, manual marks, refusals, SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import chain_model, write_chain
from quantscan.api import run_bisect
from quantscan.bisect import BisectSession, SessionFileError
from quantscan.bisect.realise import Judged
from quantscan.errors import UsageError
from quantscan.records import Plan
from quantscan.runner import Runner

TARGET_SQNR = 44.0
"""The chain's all-int8 output SQNR is ~39.5 dB: a few sites must stay float to reach 44 dB."""


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_chain(tmp_path_factory.mktemp("chain"))


def test_bisect_reaches_target_and_writes_plan(chain: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = chain
    out = tmp_path / "run"
    result = run_bisect(
        model, calib, target_sqnr=TARGET_SQNR, out=out, save_qdq=out / "mixed.onnx", threads=1
    )
    plan = result.plan
    assert result.reached and plan.status == "reached"
    assert plan.all_int8 is not None and plan.achieved is not None
    assert plan.all_int8["sqnr_db"] < TARGET_SQNR <= plan.achieved["sqnr_db"]
    assert plan.sites and all(s.precision == "float" for s in plan.sites)
    assert (
        plan.evaluations
        == len(result.steps)
        == len(json.loads((out / "session.json").read_text())["events"])
    )
    assert plan.evaluations_before_prune <= 2 * np.log2(plan.site_count) + 2
    on_disk = json.loads((out / "plan.json").read_text())
    for key in (
        "model_sha256",
        "target",
        "all_int8",
        "all_float",
        "achieved",
        "sites",
        "pareto",
        "evaluations",
    ):
        assert key in on_disk
    assert on_disk["target"]["metric"] == "sqnr" and on_disk["target"]["output"] == "y"
    assert on_disk == plan.to_json() and list(on_disk) == list(plan.to_json())  # the typed plan is the file
    assert Plan.from_json(plan.to_json()) == plan and Plan.from_json(on_disk) == plan
    assert (out / "plan.csv").read_text().splitlines()[0].startswith("node,output,precision")
    for name in (
        "ort_quant_config.json",
        "rknn_hybrid_quant.cfg",
        "horizon_node_config.yaml",
        "tpu_mlir.qtable",
    ):
        assert (out / name).exists()
    # The saved mixed model, run in plain onnxruntime on the held-out samples (the odd ones: the search
    # saw the even ones), reproduces the reported SQNR.
    runner = Runner(threads=1)
    x = np.load(calib / "x.npy")[1::2]
    ref = runner.session(onnx.load(model)).run({"x": x})["y"].astype(np.float64)
    got = runner.session(onnx.load(out / "mixed.onnx")).run({"x": x})["y"].astype(np.float64)
    sqnr = 10 * np.log10((ref**2).sum() / ((ref - got) ** 2).sum())
    assert sqnr == pytest.approx(plan.achieved["sqnr_db"], abs=0.05)


def test_int16_fallback_plan_says_opset_21(chain: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = chain
    result = run_bisect(model, calib, target_sqnr=TARGET_SQNR, fallback="int16", threads=1, out=tmp_path)
    assert result.plan.qdq_opset == 21 and "opset 21" in result.plan.qdq_note
    assert result.reached and all(s.precision == "int16" for s in result.plan.sites)
    assert Plan.from_json(result.plan.to_json()) == result.plan
    assert result.qdq_model is not None
    assert max(o.version for o in result.qdq_model.opset_import if o.domain in ("", "ai.onnx")) == 21


def test_unreachable_target_is_reported_at_once(chain: tuple[Path, Path]) -> None:
    model, calib = chain
    steps: list[str] = []
    result = run_bisect(
        model,
        calib,
        target_sqnr=500.0,
        threads=1,
        on_step=lambda s, m: steps.append(s.phase),
        force_quant=["mm0"],
    )
    assert not result.reached and result.outcome.status == "unreachable"
    assert steps == ["all_float"]


def test_resume_with_marks_and_refusals(chain: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = chain
    session = tmp_path / "s.json"
    first = run_bisect(model, calib, target_sqnr=TARGET_SQNR, session=session, threads=1)
    with pytest.raises(SessionFileError, match="already exists"):
        run_bisect(model, calib, target_sqnr=TARGET_SQNR, session=session, threads=1)
    seen: list[str] = []
    again = run_bisect(resume=session, threads=1, on_step=lambda s, m: seen.append(s.phase))
    assert seen == [] and again.plan.sites == first.plan.sites  # finished: nothing re-run
    pinned = run_bisect(resume=session, keep_float=["mm9"], threads=1)
    assert "mm9" in {s.node for s in pinned.plan.sites}
    assert any(e.get("kind") == "mark" for e in json.loads(session.read_text())["events"])
    other_model = tmp_path / "other.onnx"
    onnx.save(chain_model(seed=5), other_model)
    with pytest.raises(SessionFileError, match="sha256"):
        run_bisect(other_model, calib, resume=session, threads=1)
    other_calib = tmp_path / "calib2"
    other_calib.mkdir()
    np.save(other_calib / "x.npy", np.zeros((16, 16), np.float32))
    with pytest.raises(SessionFileError, match="another set"):
        run_bisect(model, other_calib, resume=session, threads=1)
    text = session.read_text()
    session.write_text(text[:100])
    with pytest.raises(SessionFileError, match="truncated"):
        run_bisect(resume=session, threads=1)
    assert session.read_text() == text[:100]


CHILD = """
import sys, time
from quantscan.api import run_bisect
run_bisect(sys.argv[1], sys.argv[2], target_sqnr=float(sys.argv[4]), session=sys.argv[3], threads=1,
           on_step=lambda step, machine: time.sleep(0.4))
"""


def test_sigkill_mid_search_then_resume_repeats_nothing(chain: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = chain
    reference = run_bisect(model, calib, target_sqnr=TARGET_SQNR, threads=1)
    session = tmp_path / "killed.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(model), str(calib), str(session), str(TARGET_SQNR)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        done: list[dict[str, object]] = []
        while time.monotonic() < deadline and child.poll() is None:
            if session.exists():
                done = [e for e in json.loads(session.read_text())["events"] if e["kind"] == "eval"]
                if len(done) >= 2:
                    break
            time.sleep(0.05)
        assert child.poll() is None, f"the child ended before it could be killed: {child.stderr.read()!r}"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    killed = BisectSession.load(session)  # the file is whole: written atomically
    finished = [tuple(s.sites) for s in killed.steps()]
    assert len(finished) >= 2
    rerun: list[tuple[str, ...]] = []
    resumed = run_bisect(resume=session, threads=1, on_step=lambda s, m: rerun.append(tuple(s.sites)))
    assert not set(rerun) & set(finished)
    assert resumed.plan.sites == reference.plan.sites
    assert resumed.plan.achieved == reference.plan.achieved
    assert [s.sites for s in resumed.steps] == [s.sites for s in reference.steps]


def test_already_met_is_answered_before_the_gains(
    chain: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target all-int8 meets: all-int8 is measured first, no output gain runs, nothing twice."""
    import quantscan.bisect.search as search
    import quantscan.bisect.simulated as simulated

    def no_gains(*args: object, **kwargs: object) -> None:
        raise AssertionError("output gains computed for a target all-int8 already meets")

    calls: list[list[str]] = []

    class Counting(simulated.RealisedEvaluator):
        """The search's evaluator (the held-out claims build their own, in bisect/realise.py)."""

        def judge(self, prec: Sequence[str]) -> Judged:
            calls.append(list(prec))
            return super().judge(prec)

    monkeypatch.setattr(search, "compute_gain", no_gains)
    monkeypatch.setattr(simulated, "RealisedEvaluator", Counting)
    model, calib = chain
    result = run_bisect(model, calib, target_sqnr=30.0, out=tmp_path / "run", threads=1)
    plan = result.plan
    assert plan.status == "already_met" and not plan.sites
    assert plan.all_int8 is not None and plan.all_int8["sqnr_db"] >= 30.0
    assert [s.phase for s in result.steps] == ["all_float", "all_int8"]
    assert len(calls) == 2 and calls.count(["int8"] * len(calls[0])) == 1  # all-int8 measured once


def test_unmet_target_reuses_the_first_all_int8_measurement(chain: tuple[Path, Path], tmp_path: Path) -> None:
    """All-int8 measured before the gains is the search's all-int8 step (same value, one run)."""
    model, calib = chain
    result = run_bisect(model, calib, target_sqnr=TARGET_SQNR, threads=1)
    int8 = [s for s in result.steps if s.phase == "all_int8"]
    assert len(int8) == 1 and int8[0].value < TARGET_SQNR
    assert result.plan.status == "reached"


def test_resume_measures_with_the_stored_profile(chain: tuple[Path, Path], tmp_path: Path) -> None:
    """A session records every option that decides what is measured (scanning.options.MEASUREMENT_OPTIONS),
    the chip profile among them: a resume used to fall back to the default uint8 scheme."""
    model, calib = chain
    session = tmp_path / "s.json"
    run_bisect(model, calib, target_sqnr=TARGET_SQNR, session=session, threads=1, profile="rk3588")
    stored = json.loads(session.read_text())["options"]["scan"]
    assert stored["profile"] == "rk3588" and stored["input_dims"] == [] and stored["state"] == {}
    resumed = run_bisect(resume=session, keep_float=["mm9"], threads=1)
    fresh = run_bisect(model, calib, target_sqnr=TARGET_SQNR, session=tmp_path / "f.json", threads=1,
                       profile="rk3588", keep_float=["mm9"])
    assert resumed.plan.achieved == pytest.approx(fresh.plan.achieved, abs=1e-9)


def test_time_budget_gives_the_smallest_passing_plan_then_resume_finishes(
    chain: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--max-minutes`: a clock that moves a minute per step stops the search once the budget is spent; the
    plan is the smallest set measured to meet the target so far (status budget, exit 0 in the CLI), and a
    resume without a budget finishes the very search a run without one makes, repeating no step."""
    from types import SimpleNamespace

    from quantscan.bisect import driver, search

    model, calib = chain
    reference = run_bisect(model, calib, target_sqnr=TARGET_SQNR, threads=1)
    k = next(i for i, s in enumerate(reference.steps) if s.phase in ("reduce", "prune"))
    clock = SimpleNamespace(now=0.0)
    for module in (driver, search):  # the budget starts in the driver and is checked between rounds
        monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    session = tmp_path / "s.json"

    def tick(step: object, machine: object) -> None:
        clock.now += 60.0

    stopped = run_bisect(model, calib, target_sqnr=TARGET_SQNR, session=session, threads=1,
                         max_minutes=k - 0.5, on_step=tick)
    passing = [s for s in reference.steps[:k] if s.passed]
    smallest = min(passing, key=lambda s: (len(s.sites), -s.value))
    assert stopped.plan.status == "budget" and stopped.plan.reached
    assert {s.node for s in stopped.plan.sites} == set(smallest.sites)
    assert len(stopped.steps) == k
    assert json.loads(session.read_text())["status"] == "budget"
    from quantscan.report.verdict import plan_lines

    assert "time budget" in " ".join(plan_lines(stopped.plan.to_json()))
    monkeypatch.undo()
    rerun: list[tuple[str, ...]] = []
    resumed = run_bisect(resume=session, threads=1, on_step=lambda s, m: rerun.append(tuple(s.sites)))
    assert not set(rerun) & {tuple(s.sites) for s in stopped.steps}
    assert resumed.plan.status == reference.plan.status
    assert resumed.plan.sites == reference.plan.sites


def test_time_budget_must_be_positive(chain: tuple[Path, Path]) -> None:
    model, calib = chain
    with pytest.raises(UsageError, match="--max-minutes: expected a positive number"):
        run_bisect(model, calib, target_sqnr=TARGET_SQNR, threads=1, max_minutes=0)


def test_a_target_needing_every_site_float_stops_after_the_prefix_search(
    chain: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38: the target only all-float meets (cosine 1 to 1e-7) needs every site float; the search ends after
    its prefix search with the measured passing set and says so (stdout, plan.json, summary lines), where the
    full search would go on to trim it member by member. The stop needs an order that saw each site's loss alone
    (`--loss-if-only`); the chain has 12 sites: EARLY_STOP_MIN lowered."""
    from quantscan.bisect import state
    from quantscan.cli.dispatch import main
    from quantscan.report.verdict import plan_lines

    monkeypatch.setattr(state, "EARLY_STOP_MIN", 8)
    model, calib = chain
    out = tmp_path / "b"
    code = main(["bisect", str(model), "--calib", str(calib), "--target-cosine", "0.9999999", "--realisations", "1",
                 "--loss-if-only", "--out", str(out), "--quiet", "--threads", "1"])
    assert code in (0, 1)
    raw = json.loads((out / "plan.json").read_text())
    assert raw["early_stop"] and "nearly every site float" in raw["early_stop"]
    assert "stopped early: " in capsys.readouterr().out
    assert set(raw["phases"]) <= {"all_float", "all_int8", "search"}
    steps = raw["steps"]
    plan_sites = {s["node"] for s in raw["sites"]}
    passing = next(s for s in steps if set(s["sites"]) == plan_sites)
    assert passing["passed"] and passing["value"] >= 0.9999999
    shorter = [s for s in steps if not s["passed"] and len(s["sites"]) == len(plan_sites) - 1]
    assert shorter and len(shorter[0]["sites"]) > 0.75 * raw["site_count"]
    assert "The search stopped early" in " ".join(plan_lines(raw))
    assert json.loads((out / "session.json").read_text())["options"]["early_stop"] is True
    plain = tmp_path / "plain"  # the gain order alone can miss a non-additive loss: no stop, the trimming runs
    main(["bisect", str(model), "--calib", str(calib), "--target-cosine", "0.9999999", "--realisations", "1",
          "--out", str(plain), "--quiet", "--threads", "1"])
    assert "early_stop" not in json.loads((plain / "plan.json").read_text())
    assert json.loads((plain / "session.json").read_text())["options"]["early_stop"] is False
