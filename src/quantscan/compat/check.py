"""`check()`: structural NPU compatibility of one model against one or more chip profiles.

No data, no onnxruntime: the model is loaded, shapes inferred (twice if input dims are symbolic),
then every rule runs per profile, nodes are coloured NPU/CPU and the islands measured.

If/Loop/Scan bodies are checked too (`graph.subgraphs`): each body is analysed as a standalone model
and the node rules run on it; its findings name the node by path (`If_0/then_branch/LSTM_3`) and take
the placement and island of the top-level node that owns the body (the body runs where its owner runs).
Model-level rules (opset, graph inputs) do not apply to a body's formal inputs and are skipped there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import onnx
import pandas as pd

from quantscan.columns import Col
from quantscan.compat.analysis import ModelAnalysis, analyse
from quantscan.compat.context import RuleContext
from quantscan.compat.partitions import Partitioning, colour, partition
from quantscan.compat.profiles import DEFAULT_PROFILE, Profile, expand, load_profile
from quantscan.compat.result import PARTITION_COLUMNS, CheckResult
from quantscan.compat.rules import BODY_RULES, RULES, Rule, control_flow
from quantscan.graph.subgraphs import Body, bodies, body_model, scope_of
from quantscan.records import FINDING_COLUMNS, FINDING_DETAIL_COLUMNS, Finding, Placement, Severity


def check(
    model: onnx.ModelProto | str | Path,
    profiles: Sequence[str | Path] = (),
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> CheckResult:
    """Check `model` against `profiles` (names or TOML paths; `all` = every shipped one; default generic-npu).

    The model is loaded and analysed once, whatever the number of profiles: only the rules and the
    partitioning run per profile. Profiles are validated before the model is read, so a typo fails fast.
    Raises ProfileError, ModelError or UsageError (bad input_shapes) for bad input; never for odd graphs.
    """
    loaded = _profiles(profiles)
    analysis = analyse(model, input_shapes)
    inner = body_analyses(analysis)
    records: list[Finding] = []
    parts: list[dict[str, object]] = []
    placement: dict[str, dict[str, str]] = {}
    for profile in loaded:
        found = run_rules(analysis, profile)
        part = partition(analysis, colour(analysis, found))
        records.extend(_placed(analysis, profile, found, part))
        records.extend(_body_findings(analysis, inner, profile, part))
        parts.extend(_partition_rows(analysis, profile, part))
        placement[profile.name] = _placement(analysis, part)
    rows = [f.to_row() for f in records]
    return CheckResult(
        findings=pd.DataFrame(rows, columns=list(FINDING_COLUMNS)),
        details=pd.DataFrame(rows, columns=list(FINDING_DETAIL_COLUMNS)),
        partitions=pd.DataFrame(parts, columns=list(PARTITION_COLUMNS)),
        node_placement=placement,
        profiles=[p.name for p in loaded],
        notes=_notes(analysis),
        records=records,
        fold_flags=control_flow.fold_flags(analysis),
    )


def _profiles(specs: Sequence[str | Path]) -> list[Profile]:
    out: list[Profile] = []
    for spec in expand(list(specs) or [DEFAULT_PROFILE]):
        p = load_profile(spec)
        if p.name not in {q.name for q in out}:
            out.append(p)
    return out


def run_rules(
    analysis: ModelAnalysis, profile: Profile, rules: Sequence[tuple[str, Rule]] = RULES
) -> list[Finding]:
    """Every rule's findings for one profile, unverified ones capped at warn.

    A rule that fails on an odd graph yields an info row saying so instead of aborting the check.
    """
    ctx = RuleContext(analysis, profile)
    out: list[Finding] = []
    for rule_id, run in rules:
        try:
            out.extend(f.capped() for f in run(ctx))
        except Exception as exc:  # robustness promise: odd graphs are reported, not fatal
            out.append(
                Finding("", "", rule_id, Severity.INFO, f"rule skipped on this model ({type(exc).__name__}: {exc})")
            )
    return out


def body_analyses(analysis: ModelAnalysis) -> list[tuple[Body, ModelAnalysis]]:
    """Every If/Loop/Scan body of the model with its own analysis (profile independent, done once).

    A body the loader cannot read as a model is left out here; the owner's control-flow finding
    still counts its nodes.
    """
    proto = analysis.view.model
    if proto is None:
        return []
    scope = scope_of(proto.graph)
    out: list[tuple[Body, ModelAnalysis]] = []
    for body in bodies(proto.graph):
        try:
            sub = analyse(body_model(proto, body, scope))
            out.append((body, replace(sub, conditions=analysis.conditions, path=f"{body.path}/",
                                       given_dims=analysis.given_dims)))
        except Exception:  # robustness promise: an odd body never aborts the check of the model
            continue
    return out


def _body_findings(
    analysis: ModelAnalysis, inner: list[tuple[Body, ModelAnalysis]], profile: Profile, part: Partitioning
) -> list[Finding]:
    """The node rules' findings inside every body, named by path, placed where the owning node runs."""
    index = {n: i for i, n in enumerate(analysis.view.names)}
    out: list[Finding] = []
    for body, sub in inner:
        placement, island = _where(analysis, part, index, body.top_owner)
        found = sorted(run_rules(sub, profile, BODY_RULES), key=lambda f: -f.severity.rank)
        for f in found:
            node = body.node_name(f.node) if f.node else body.path
            out.append(replace(f, node=node, placement=placement, partition=island, profile=profile.name))
    return out


def _order(analysis: ModelAnalysis) -> dict[str, int]:
    view = analysis.view
    order = {name: i for i, name in enumerate(view.names)}
    order.update({name: -1 for name in view.inputs})
    return order


def _placed(analysis: ModelAnalysis, profile: Profile, found: list[Finding], part: Partitioning) -> list[Finding]:
    """The profile's findings, worst first then in graph order, with placement, island and profile set."""
    order = _order(analysis)
    index = {n: i for i, n in enumerate(analysis.view.names)}
    found = sorted(found, key=lambda f: (-f.severity.rank, order.get(f.node, -2)))
    out = []
    for f in found:
        placement, island = _where(analysis, part, index, f.node)
        out.append(replace(f, placement=placement, partition=island, profile=profile.name))
    return out


def _where(
    analysis: ModelAnalysis, part: Partitioning, index: Mapping[str, int], node: str
) -> tuple[Placement | None, int | None]:
    """(placement, partition id) of a finding's node; graph inputs use their first consumer."""
    view = analysis.view
    i = index.get(node)
    if i is None and node in view.inputs:
        consumers = [c for c in view.consumers.get(node, []) if c in part.colour]
        i = consumers[0] if consumers else None
    if i is None:
        return None, None
    if i not in part.colour:
        return Placement.NPU, None
    return Placement(part.colour[i]), part.island_of[i]


def _partition_rows(analysis: ModelAnalysis, profile: Profile, part: Partitioning) -> list[dict[str, object]]:
    names = analysis.view.names
    return [
        {
            "profile": profile.name,
            "partition": isl.id,
            Col.PLACEMENT: isl.placement,
            "n_nodes": len(isl.nodes),
            "first_node": names[isl.nodes[0]],
            "nodes": ";".join(names[i] for i in isl.nodes),
            "bytes_in": isl.bytes_in,
            "bytes_out": isl.bytes_out,
            "bytes_unknown": isl.unknown_in,
            "from_partitions": ";".join(str(s) for s in isl.sources),
            "bytes_estimated": analysis.loaded.estimated,
        }
        for isl in part.islands
    ]


def _placement(analysis: ModelAnalysis, part: Partitioning) -> dict[str, str]:
    return {name: part.colour.get(i, "npu") for i, name in enumerate(analysis.view.names)}


def _notes(analysis: ModelAnalysis) -> list[str]:
    notes = []
    for f in analysis.loaded.fills:
        if not f.from_user:
            notes.append(f"input '{f.input}' axis {f.axis} ({f.symbol}) checked as {f.value} (not given)")
    return notes
