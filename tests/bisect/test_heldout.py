"""The toolchain scored on a claim's own samples (issue 38 part 3): quantscan/heldout.py and the
per-sample sums of driverfiles.py, against the pooled cosine written out in numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantscan.heldout import claimed_samples, held_out_figures
from quantscan.metrics import subset_cosine
from quantscan.toolchains.driverfiles import sample_sums


def _pooled(refs: list[np.ndarray], sims: list[np.ndarray]) -> float:
    """cos(concat x, concat y): the contract's pooled cosine over the chosen samples."""
    x = np.concatenate([r.ravel() for r in refs]).astype(np.float64)
    y = np.concatenate([s.ravel() for s in sims]).astype(np.float64)
    return float(x @ y / math.sqrt((x @ x) * (y @ y)))


def _outputs(seed: int, n: int) -> tuple[list[list[np.ndarray]], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    reference = [[rng.normal(size=(1, 4)).astype(np.float32), rng.normal(size=(1, 3, 2)).astype(np.float32)]
                 for _ in range(n)]
    simulated = {f"{i}:{k}": (ref[k] + rng.normal(scale=0.3 * (i + 1), size=ref[k].shape)).reshape(-1, 1)
                 for i, ref in enumerate(reference) for k in range(2)}  # another layout, as RKNN's
    return reference, simulated


def test_subset_cosine_is_the_worst_outputs_pooled_cosine_on_those_samples() -> None:
    reference, simulated = _outputs(0, 6)
    sums = sample_sums(reference, simulated, ["a", "b"])
    picked = [1, 3, 5]
    expected = min(_pooled([reference[i][k] for i in picked], [simulated[f"{i}:{k}"] for i in picked])
                   for k in range(2))
    assert subset_cosine(sums, picked) == pytest.approx(expected, abs=1e-12)
    everything = min(_pooled([r[k] for r in reference], [simulated[f"{i}:{k}"] for i in range(6)]) for k in range(2))
    assert subset_cosine(sums, list(range(6))) == pytest.approx(everything, abs=1e-12)
    assert subset_cosine(sums, picked) != pytest.approx(everything, abs=1e-6)  # the subset is not the whole


def test_an_output_missing_on_a_sample_is_left_out_and_no_sample_is_nan() -> None:
    reference, simulated = _outputs(1, 4)
    del simulated["2:1"]
    sums = sample_sums(reference, simulated, ["a", "b"])
    assert list(sums) == ["a"]
    assert subset_cosine(sums, [0, 2]) == pytest.approx(
        _pooled([reference[0][0], reference[2][0]], [simulated["0:0"], simulated["2:0"]]), abs=1e-12)
    assert math.isnan(subset_cosine(sums, [9]))
    assert math.isnan(subset_cosine({}, [0]))


def test_claimed_samples_follow_the_plans_split() -> None:
    assert claimed_samples({"split": "interleave: even samples searched, odd samples held out",
                            "held_out_samples": 3}, 6) == [1, 3, 5]
    assert claimed_samples({"split": "none: the search's samples are also the claimed ones",
                            "held_out_samples": 4}, 4) == [0, 1, 2, 3]
    assert claimed_samples({"split": "--eval: searched on --calib, claimed on --eval"}, 6) is None
    assert claimed_samples({"split": "interleave: ...", "held_out_samples": 8}, 6) is None  # other samples
    assert claimed_samples(None, 6) is None


def test_held_out_figures_put_both_gains_side_by_side() -> None:
    reference, sim_plan = _outputs(2, 4)
    _, sim_int8 = _outputs(3, 4)
    plan_sums = sample_sums(reference, sim_plan, ["a", "b"])
    int8_sums = sample_sums(reference, sim_int8, ["a", "b"])
    plan = {"achieved": {"cosine": 0.99}, "all_int8": {"cosine": 0.95}, "interval": {"low": 0.98, "high": 0.995}}
    got = held_out_figures(plan, [1, 3], plan_sums, int8_sums)
    vendor = min(_pooled([reference[i][k] for i in (1, 3)], [sim_plan[f"{i}:{k}"] for i in (1, 3)]) for k in range(2))
    vendor_int8 = min(_pooled([reference[i][k] for i in (1, 3)], [sim_int8[f"{i}:{k}"] for i in (1, 3)])
                      for k in range(2))
    assert got["vendor"] == pytest.approx(vendor, abs=1e-12)
    assert got["vendor_all_int8"] == pytest.approx(vendor_int8, abs=1e-12)
    assert got["claimed_gain"] == pytest.approx(0.04) and got["vendor_gain"] == pytest.approx(vendor - vendor_int8)
    assert got["interval"] == plan["interval"] and got["samples"] == [1, 3]
