"""The plan a bisection ends with: the typed `records.Plan`, and the files it is written to.

`build_plan` turns the finished machine, the mixed-precision builder and the session into a
`records.Plan`; `write_plan` writes plan.json (its content is `Plan.to_json()`, the contract),
plan.csv, gain.csv, layers.csv with the gain columns merged in, and the vendor exports.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx
import pandas as pd

from quantscan.bisect import exports as qexports
from quantscan.bisect.realise import Claims
from quantscan.bisect.session import BisectSession
from quantscan.bisect.state import BUDGET, BUDGET_NO_PLAN, METRICS, Bisector, Step, Target
from quantscan.bisect.verdict import Verdict, held_out_kind, reach_text, undecided_text
from quantscan.columns import Col
from quantscan.errors import QuantscanError
from quantscan.graph.mixed import W8, MixedBuilder
from quantscan.graph.subgraphs import quantizable_bodies
from quantscan.records import Metrics, ParetoPoint, Plan, PlanSite, Precision
from quantscan.runfolder import RUN_JSON, atomic_write_text, csv_text, read_csv, read_run_json, read_text, write_json
from quantscan.scanning.ort_recipe import quantize_static_call
from quantscan.scanning.prepare import ScanContext
from quantscan.schemes import Scheme
from quantscan.sites import Site

PLAN_CSV_COLUMNS = (Col.NODE, Col.OUTPUT, "precision", Col.OP_TYPE, Col.KERNEL, Col.ORDER, Col.GAIN_IF_FLOAT)
REACHED = ("reached", "already_met", "found", "no_bad_layer", BUDGET)
"""Outcome statuses that mean the target was met (exit code 0)."""
INT16_NOTE = "int16 QuantizeLinear needs opset 21: the prepared copy was raised with onnx.version_converter"

SummaryBlock = Callable[[str, Mapping[str, Any]], str]
"""summary.md's text -> the same with the plan block in it (the renderer lives in report/, above bisect/)."""


def original_nodes(ctx: ScanContext, site: Site) -> list[str]:
    """The kernel's nodes as named in the user's model: a folded BatchNormalization comes back."""
    names = list(site.nodes)
    if site.node in ctx.graph.prepared.bn_folded_into:
        consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in ctx.loaded.proto.graph.node:
            for i in n.input:
                consumers.setdefault(i, []).append(n)
        first = next((n for n in ctx.loaded.proto.graph.node if n.name == site.node), None)
        if first is not None:
            bn = [c for c in consumers.get(first.output[0], []) if c.op_type == "BatchNormalization"]
            names[1:1] = [b.name for b in bn if b.name not in names]
    return names


def plan_sites(
    ctx: ScanContext, builder: MixedBuilder, session: BisectSession, prec: Sequence[str]
) -> tuple[PlanSite, ...]:
    """Every site `prec` keeps above int8, with its gain and what the exports need to address it."""
    gain = {r[Col.NODE]: r for r in session.gain}
    tensor_prec = builder.tensor_precision(prec)
    sites = []
    for k, s in enumerate(ctx.graph.sites):  # the builder's sites, typed as the scan's
        if prec[k] == "int8":
            continue
        sites.append(
            PlanSite(
                node=s.node,
                output=s.output,
                precision=Precision(Precision.parse(Precision.INT8.value if prec[k] == W8 else prec[k])),
                op_type=s.op_type,
                kernel=s.kernel,
                order=ctx.graph.order.get(s.node, -1 if s.is_input else k),
                nodes=tuple(original_nodes(ctx, s)),
                gain_if_float=float(gain.get(s.node, {}).get(Col.GAIN_IF_FLOAT, math.nan)),
                weights=tuple(w for w in [s.weight, *(n for n, _ in s.extra_weights)] if w),
                weight_axis=s.weight_axis if s.weight_axis is not None else 0,
                int16_tensors=tuple(
                    t for t in dict.fromkeys([*s.inputs, s.output, *s.inner]) if tensor_prec.get(t) == "int16"
                ),
            )
        )
    return tuple(sites)


def build_plan(
    ctx: ScanContext,
    builder: MixedBuilder,
    machine: Bisector,
    session: BisectSession,
    target: Target,
    prec: Sequence[str],
    steps: Sequence[Step],
    seconds: float,
    claims: Claims | None = None,
    achieved_sites: Sequence[str] | None = None,
) -> Plan:
    """The plan as the contract fixes it, plus the step log and what the exports need.

    With `claims` (bisect/realise.py) the metrics, the Pareto values and the intervals are the held-out
    samples' and the search's own figures go under `search`; without, the search's figures are the claims.
    """
    outcome = machine.outcome
    assert outcome is not None

    def searched(sites: Sequence[str]) -> Metrics | None:
        step = machine.step_of(sites)
        return {k: float(v) for k, v in step.metrics.items()} if step is not None else None

    metrics_of = claims.metrics if claims is not None else searched
    ceiling = [n for n in machine.order if n not in machine.force_quant]
    output = session.options.get(Col.OUTPUT)
    achieved = outcome.sites if outcome.status not in ("unreachable", BUDGET_NO_PLAN) else None
    achieved = tuple(achieved_sites) if achieved_sites is not None else achieved  # bisect/objective.py's pick
    plan = Plan(
        model=session.model_path,
        model_sha256=session.model_sha256,
        target=target.record(None if output is None else str(output)),
        fallback=Precision(Precision.parse(builder.fallback)),
        mode=machine.mode,
        status=outcome.status,
        reached=outcome.status in REACHED,
        all_int8=metrics_of([]),
        all_float=metrics_of(ceiling),
        achieved=metrics_of(achieved) if achieved is not None else None,
        sites=plan_sites(ctx, builder, session, prec),
        pareto=tuple(machine.pareto()),
        evaluations=len(steps),
        evaluations_before_prune=sum(1 for s in steps if s.phase not in ("reduce", "prune")),
        evaluations_reduce=sum(1 for s in steps if s.phase == "reduce"),
        site_count=len(builder.sites),
        first_bad=outcome.first_bad,
        keep_float=tuple(sorted(machine.keep_float)),
        force_quant=tuple(sorted(machine.force_quant)),
        qdq_opset=builder.opset,
        qdq_note=INT16_NOTE if builder.fallback == "int16" else "",
        calibration=dict(session.calibration),
        seconds=round(seconds, 3),
        search_seconds=round(sum(s.seconds for s in steps), 3),
        last_phase=steps[-1].phase if steps else None,
        phases=tuple(sorted({s.phase for s in steps})),
        steps=tuple(s.record() for s in steps),
        recipe=plan_recipe(ctx),
        unmeasured=tuple(quantizable_bodies(ctx.graph.prepared.proto)),
        scheme=ctx.chip.scheme.to_json(),
        early_stop=outcome.early_stop,
    )
    if claims is None:
        return plan
    return with_claims(plan, claims, achieved, {"achieved": searched(achieved) if achieved is not None else None,
                                                "all_int8": searched([]), "all_float": searched(ceiling)})


def with_claims(
    plan: Plan, claims: Claims, achieved: Sequence[str] | None, search: Mapping[str, Metrics | None]
) -> Plan:
    """The plan's interval and held-out record, and its Pareto points re-valued on the held-out samples
    (`value` the held-out figure under quantscan's rounding, `search_value` the search's lower bound)."""
    key = METRICS[plan.target.metric]

    def held(point: ParetoPoint) -> ParetoPoint:
        got = claims.metrics(point.sites) or {}
        spread = claims.spread(point.sites)
        return replace(point, value=float(got.get(key, math.nan)), search_value=point.value,
                       interval=spread.to_json() if spread is not None else None)

    spread = claims.spread(achieved) if achieved is not None else None
    claimed = float((plan.achieved or {}).get(key, math.nan))
    meets = plan.reached and not math.isnan(claimed) and claimed >= plan.target.value
    plan = replace(
        plan, pareto=tuple(held(p) for p in plan.pareto),
        interval=spread.to_json() if spread is not None else None,
        held_out={**claims.record(), "meets_target": meets}, search=dict(search),
    )
    return with_held_out_verdict(plan)


def with_held_out_verdict(plan: Plan) -> Plan:
    """The plan judged on its held-out claim (bisect/verdict.py): a search that met the target on the
    searched samples is `reached` only when the held-out claim meets it too; below the held-out all-int8
    figure it is `no_plan_helps`. The search's own status stays in `verdict.search_status`. A first-bad
    search, or one that reached nothing, keeps its status."""
    key = METRICS[plan.target.metric]
    claimed = float((plan.achieved or {}).get(key, math.nan))
    all_int8 = float((plan.all_int8 or {}).get(key, math.nan))
    kind = held_out_kind(plan.reached and plan.mode == "search", bool(plan.sites), claimed, all_int8,
                         plan.target.value)
    held = int((plan.held_out or {}).get("held_out_samples") or 0) or None
    if not kind:
        text = reach_text(plan.status, plan.target.metric, plan.target.value, claimed, all_int8, held)
        verdict = Verdict(plan.status, plan.reached, text, plan.status, len(plan.sites), plan.site_count)
        return replace(plan, verdict=verdict.to_json())
    text = reach_text(kind, plan.target.metric, plan.target.value, claimed, all_int8, held)
    reached = kind == "reached"
    verdict = Verdict(kind if not reached else plan.status, reached, text, plan.status, len(plan.sites),
                      plan.site_count, undecided=undecided_text(claimed, plan.target.value, plan.interval, held))
    return replace(plan, status=plan.status if reached else kind, reached=reached, verdict=verdict.to_json())


def held_out_warning(plan: Plan) -> str | None:
    """Said when the search's set met the target but the held-out samples do not: the plan fits the
    searched samples more than the model (more samples, or a stricter --bound-z, are the remedies)."""
    searched = (plan.verdict or {}).get("search_status", plan.status)
    if searched not in REACHED or plan.held_out is None or plan.held_out.get("meets_target", True):
        return None
    key = METRICS[plan.target.metric]
    return (f"the plan meets {plan.target.metric} >= {plan.target.value} on the searched samples but claims "
            f"{float((plan.achieved or {}).get(key, math.nan)):.5f} on the {plan.held_out.get('held_out_samples')} "
            "held-out ones")


def plan_recipe(ctx: ScanContext) -> dict[str, Any]:
    """What the exports need to say how the plan was measured: the profile, its recipe, and the
    quantize_static call of its activation scheme (the one the sites were read from, for recipe
    onnxruntime)."""
    call = ctx.quant.quantize_static or scheme_call(
        quantize_static_call(ctx.chip.activations, ctx.opts.calib_method), ctx.chip.scheme
    )
    note = scheme_note(ctx.chip.scheme)
    return {"profile": ctx.chip.profile, "recipe": ctx.chip.recipe, "quantize_static": call,
            "scheme": ctx.chip.scheme.to_json(), **({"scheme_note": note} if note else {})}


def scheme_call(call: Mapping[str, Any], scheme: Scheme) -> dict[str, Any]:
    """quantize_static's arguments for the scheme the plan's `int8` sites were measured in: int16
    activations are QInt16 symmetric (quantscan's int16), int4 weights QInt4 (per channel)."""
    out = dict(call)
    if scheme.activations == "int16":
        out["activation_type"] = "QInt16"
        out["extra_options"] = {**dict(out.get("extra_options") or {}), "ActivationSymmetric": True}
    if scheme.weights == "int4":
        out["weight_type"] = "QInt4"
    return out


def scheme_note(scheme: Scheme) -> str:
    """What quantize_static cannot express of the scheme (it has no group-wise weights, weight zero
    points nor float activations: onnxruntime's MatMulNBitsQuantizer is the weight-only block route),
    so an export does not pretend its call writes the measured model; empty when it can."""
    gaps = [what for what, missing in (("group-wise weights", scheme.group_size is not None),
                                        ("weight zero points", scheme.weight_zero_point),
                                        ("float activations", scheme.weight_only)) if missing]
    return f"scheme {scheme.name()}: quantize_static has no {', '.join(gaps)}" if gaps else ""


def write_plan(
    plan: Plan, session: BisectSession, out: Path, exports: Sequence[str] | None = None,
    model: onnx.ModelProto | None = None, summary_block: SummaryBlock | None = None,
    vendor_names: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
) -> dict[str, Path]:
    """plan.json, plan.csv, gain.csv (every site's output gain) and the vendor exports, all atomic;
    `model` (the user's) names every tensor of a kernel where an export needs them (RKNN);
    `summary_block` puts the plan into a scan's summary.md in `out` (report.verdict.with_plan_block);
    `vendor_names` per export the names a vendor toolchain keeps per site (bisect --verify/--evaluator TOOL:
    RKNN step 1's, tpu-mlir's op names), for that export only."""
    out.mkdir(parents=True, exist_ok=True)
    files = {"plan.json": _plan_json(out, plan, model, board_shapes(session, out)), "plan.csv": out / "plan.csv"}
    table = pd.DataFrame([_csv_row(s) for s in plan.sites], columns=list(PLAN_CSV_COLUMNS))
    atomic_write_text(files["plan.csv"], csv_text(table))
    if session.gain:
        files["gain.csv"] = out / "gain.csv"
        gains = pd.DataFrame(session.gain)
        atomic_write_text(files["gain.csv"], csv_text(gains))
        files["layers.csv"] = out / "layers.csv"
        atomic_write_text(files["layers.csv"], csv_text(_layers_with_gain(out / "layers.csv", gains)))
    # a scan's folder: its diagnosis shows the plan on the first screen
    text = read_text(out / "summary.md") if summary_block is not None else None
    if summary_block is not None and text is not None:
        files["summary.md"] = out / "summary.md"
        atomic_write_text(files["summary.md"], summary_block(text, plan.to_json()))
    files.update(qexports.write_exports(plan, out, exports, vendor_names=vendor_names, model=model))
    return files


def _csv_row(site: PlanSite) -> dict[str, Any]:
    """A plan.csv row: the site's values as they are (NaN gain stays an empty cell)."""
    return {
        Col.NODE: site.node,
        Col.OUTPUT: site.output,
        "precision": str(site.precision),
        Col.OP_TYPE: site.op_type,
        Col.KERNEL: site.kernel,
        Col.ORDER: site.order,
        Col.GAIN_IF_FLOAT: site.gain_if_float,
    }


def _layers_with_gain(path: Path, gains: pd.DataFrame) -> pd.DataFrame:
    """layers.csv gains `gain_if_float` (and `loss_if_only` when computed), as the contract says.

    A scan's layers.csv in the same run folder keeps every column and rank; only the gain columns
    are (re)placed, joined on `node`. Without a scan, the gain table itself becomes layers.csv.
    """
    prefixes = (Col.GAIN_IF_FLOAT, Col.LOSS_IF_ONLY, "if_float", "if_only")
    gain_columns = [c for c in gains.columns if c.startswith(prefixes)]
    if not path.is_file():
        return gains
    try:
        layers = read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError):
        return gains
    if Col.NODE not in layers.columns:
        return gains
    layers = layers.drop(columns=[c for c in gain_columns if c in layers.columns])
    return layers.merge(gains[[Col.NODE, *gain_columns]], on=Col.NODE, how="left")


def _plan_json(out: Path, plan: Plan, model: onnx.ModelProto | None = None,
               shapes: Mapping[str, Sequence[int]] | None = None) -> Path:
    """plan.json, one-space indented like the session file; priced when the plan's profile has a cost table."""
    path = out / "plan.json"
    write_json(path, with_board_time(plan.to_json(), plan, model, shapes), indent=1)
    return path


def board_shapes(session: BisectSession, out: Path) -> dict[str, list[int]] | None:
    """The input shapes a plan is priced at: the user's --input-shape, else those the scan in the same run
    folder priced its sites at (run.json `board_time`), else None (the model's own, guessed dims noted)."""
    given = session.options.get("scan", {}).get("input_shape") if isinstance(session.options, dict) else None
    if isinstance(given, dict) and given:
        return {str(k): [int(d) for d in v] for k, v in given.items()}
    try:
        info = read_run_json(out / RUN_JSON) if (out / RUN_JSON).is_file() else None
    except QuantscanError:  # a run.json we cannot read prices nothing differently: the model's own shapes
        info = None
    shapes = ((info or {}).get("options") or {}).get("board_time", {}).get("input_shapes")
    return {str(k): [int(d) for d in v] for k, v in shapes.items()} if isinstance(shapes, dict) and shapes else None


def with_board_time(doc: dict[str, Any], plan: Plan, model: onnx.ModelProto | None,
                    shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """plan.json with `estimated_ms` and `extra_ms` (over all-int8) for the plan and every Pareto point,
    when the profile it was measured for has a [cost] table (quantscan.cost; estimated, not measured)."""
    profile_spec = (plan.recipe or {}).get("profile")
    if model is None or not profile_spec:
        return doc
    from quantscan.compat.profiles import load_profile
    from quantscan.cost import Pricer
    from quantscan.cost.plans import priced_plan

    profile = load_profile(str(profile_spec))
    if not profile.cost:
        return doc
    pricer = Pricer.of(model, profile, shapes)
    priced = priced_plan(pricer, doc, strict=False)
    doc["estimated_ms"], doc["extra_ms"] = priced["estimated_ms"], priced["extra_ms"]
    for point, cost in zip(doc.get("pareto", []), priced["pareto"], strict=True):
        point["estimated_ms"], point["extra_ms"] = cost["estimated_ms"], cost["extra_ms"]
    doc["board_time"] = {"profile": profile.name, "int8_ms": priced["int8_ms"], "estimated": True,
                         "input_shapes": dict(shapes or {}), "notes": list(pricer.notes)}
    return doc
