"""A parsed vendor log as `check`'s findings: the same `Finding` records, the same compat.csv rows.

A vendor log is the chip's own answer to what `check --profile` predicts, so it speaks in the same
rows: the failure that stopped the conversion (error), each layer the tool put on the CPU (warn),
each NPU layer it kept in a precision other than int8 (info). `profile` names the tool, its
version and target as the log gives them; `source` the log line, so a row can be checked by eye.
"""

from __future__ import annotations

from collections.abc import Mapping

from quantscan.columns import Col
from quantscan.records import Finding, Placement, RewriteId, Severity
from quantscan.toolchains.parsed import Failure, LayerSimilarity, ParsedLog, VendorLayer, WeightOutlier
from quantscan.toolchains.renaming import NameMatch

RULE_FAILED = "vendor-failed"
RULE_CPU = "vendor-cpu"
RULE_PRECISION = "vendor-precision"
RULE_MISMATCH = "vendor-vs-check"
RULE_OUTLIER = "vendor-weight-outlier"
RULE_NOT_SIMILAR = "vendor-not-similar"
RULE_UNSUPPORTED = "vendor-unsupported"

_INT8_WORDS = frozenset({"int8", "uint8", "int32"})
"""int32 is Horizon's high-precision output of a last Conv: still the int8 kernel, not a fallback."""

# (words in the vendor message, fix text, rewrite id): what quantscan can do about a known refusal.
_FIXES: tuple[tuple[tuple[str, ...], str, RewriteId | None], ...] = (
    (("opset",), "lower the opset: quantscan rewrite MODEL --opset N (proven)", RewriteId.OPSET_DOWN),
    (("dynamic graph", "need to be constant", "dynamic shape", "dimensions of 0", "input-shape"),
     "fix the free dims (quantscan rewrite MODEL --fix-dim batch=1 -o OUT, proven), or cut the node out "
     "of the graph into post-processing", RewriteId.FIX_DIM),
)


def log_findings(parsed: ParsedLog, matches: Mapping[str, NameMatch] | None = None) -> list[Finding]:
    """The findings of one log, failure first, then layers in log order."""
    matches = matches or {}
    rows: list[Finding] = []
    if parsed.failure is not None:
        rows.append(_failure_finding(parsed, parsed.failure, matches.get(parsed.failure.layer)))
    for layer in parsed.layers:
        if layer.io_operator:
            continue
        if layer.target == Placement.CPU:
            rows.append(_cpu_finding(parsed, layer, matches.get(layer.layer)))
        elif _not_int8(layer.dtype):
            rows.append(_precision_finding(parsed, layer, matches.get(layer.layer)))
    rows += [_outlier_finding(parsed, outlier, matches.get(outlier.tensor)) for outlier in parsed.weight_outliers]
    rows += [_not_similar_finding(parsed, row, matches.get(row.layer)) for row in parsed.similarity
             if row.passed is False]
    return rows


def _not_similar_finding(parsed: ParsedLog, row: LayerSimilarity, match: NameMatch | None) -> Finding:
    """A tensor the tool's own float-vs-quantized comparison failed (tpu-mlir `[name] NOT_SIMLIAR [FAILED]`)."""
    node, op_type, note = _where(row.layer, row.vendor_op, match)
    figures = ", ".join(f"{label} {value:g}" for label, value in (("cosine", row.entire_cosine),
                                                                  ("euclidean", row.entire_euclidean))
                        if value is not None)
    return Finding(
        node=node,
        op_type=op_type,
        rule=RULE_NOT_SIMILAR,
        severity=Severity.WARN,
        reason=f"{parsed.tool}'s comparison fails tensor {row.layer}" + (f" ({figures})" if figures else "")
               + note,
        attribute="cosine",
        value=f"{row.entire_cosine:g}" if row.entire_cosine is not None else "",
        fix="compare with quantscan's cumulative cosine at this node (scan layers.csv): if quantscan shows "
            "the loss too it is quantization (keep the site float or int16 in a bisect plan, export it as "
            "the tpu-mlir qtable); if not, it is the tool's lowering or kernel",
        source=f"{parsed.label} log line {row.line}",
        profile=parsed.label,
    )


def unsupported_findings(parsed: ParsedLog, nodes: Mapping[str, str]) -> list[Finding]:
    """One error per model node (name -> op type) whose op type the tool said it cannot convert.

    The tool names op types only (tpu-mlir "Op not support:{'Cos', 'Sin'}"), so with the model each
    node of those types is a row, as `check`'s unsupported-op rule writes them.
    """
    line = parsed.failure.line if parsed.failure is not None else 0
    return [Finding(
        node=name,
        op_type=op_type,
        rule=RULE_UNSUPPORTED,
        severity=Severity.ERROR,
        reason=f"{parsed.tool} cannot convert {op_type} nodes",
        attribute=Col.OP_TYPE,
        value=op_type,
        fix="replace the op with ones the tool converts, or cut it out of the graph into pre/post-processing",
        source=f"{parsed.label} log line {line}",
        forces_cpu=True,
        profile=parsed.label,
    ) for name, op_type in nodes.items()]


def _outlier_finding(parsed: ParsedLog, outlier: WeightOutlier, match: NameMatch | None) -> Finding:
    node, op_type, note = _where(outlier.tensor, "", match)
    values = ", ".join(f"{v:g}" for v in outlier.values)
    spread = f" (|w| mean {outlier.abs_mean:g}, std {outlier.abs_std:g})" if outlier.abs_mean is not None and (
        outlier.abs_std is not None) else ""
    return Finding(
        node=node,
        op_type=op_type,
        rule=RULE_OUTLIER,
        severity=Severity.INFO,
        reason=f"{parsed.tool} warns that weight {outlier.tensor} has outlying values {values}{spread}, after "
               f"folding BatchNormalization{note}",
        attribute="weight",
        value=values,
        fix="per-channel weight scales keep an outlier to its own channel; if this site ranks high in "
            "layers.csv (weight_worst_channel_sqnr_db), keep it float or int16 in a bisect plan",
        source=f"{parsed.label} log line {outlier.line}",
        profile=parsed.label,
    )


def _not_int8(dtype: str) -> bool:
    words = {w for w in dtype.split("/") if w}
    return bool(words) and not words <= _INT8_WORDS


def _where(name: str, vendor_op: str, match: NameMatch | None) -> tuple[str, str, str]:
    """node and op_type columns (the ONNX ones when mapped, the vendor's otherwise) and a mapping note."""
    if match is None or not match.mapped:
        return name, vendor_op, "" if match is None else " (no ONNX node of that name)"
    if not match.node:
        return name, vendor_op, f" (graph input {match.tensor})"
    note = "" if match.layer == match.node else f" (vendor name {match.layer}, matched by {match.mapped_by})"
    return match.node, match.op_type, note


def _value(value: str, layer: VendorLayer, node: str) -> str:
    """The value, naming the vendor's layer when it is not the ONNX node itself (a layer the tool added)."""
    return value if layer.layer == node else f"{value} ({layer.vendor_op} {layer.layer})"


def _failure_finding(parsed: ParsedLog, failure: Failure, match: NameMatch | None) -> Finding:
    node, op_type, note = _where(failure.layer, failure.vendor_op, match) if failure.layer else ("", "", "")
    fix, rewrite = _fix_for(failure.message)
    return Finding(
        node=node,
        op_type=op_type,
        rule=RULE_FAILED,
        severity=Severity.ERROR,
        reason=f"{parsed.tool} stopped at {failure.stage}: {failure.message}{note}",
        attribute="stage",
        value=str(failure.stage),
        fix=fix,
        source=f"{parsed.label} log line {failure.line}",
        rewrite=rewrite,
        profile=parsed.label,
    )


def _fix_for(message: str) -> tuple[str, RewriteId | None]:
    lowered = message.lower()
    for words, fix, rewrite in _FIXES:
        if any(w in lowered for w in words):
            return fix, rewrite
    return "read the vendor message; extract the node (quantscan extract MODEL --node NAME) to reproduce it", None


def _layer_finding(parsed: ParsedLog, layer: VendorLayer, match: NameMatch | None, *, rule: str,
                   severity: Severity, what: str, attribute: str, value: str, limit: str, fix: str,
                   forces_cpu: bool = False) -> Finding:
    """A finding about one row of the vendor's placement table; `what` completes "<tool> <what>"."""
    node, op_type, note = _where(layer.layer, layer.vendor_op, match)
    return Finding(
        node=node,
        op_type=op_type,
        rule=rule,
        severity=severity,
        reason=f"{parsed.tool} {what}{note}",
        attribute=attribute,
        value=_value(value, layer, node),
        limit=limit,
        fix=fix,
        source=f"{parsed.label} log line {layer.line}",
        forces_cpu=forces_cpu,
        placement=Placement(layer.target),
        partition=layer.partition,
        profile=parsed.label,
    )


def _cpu_finding(parsed: ParsedLog, layer: VendorLayer, match: NameMatch | None) -> Finding:
    dtype = f" in {layer.dtype}" if layer.dtype else ""
    return _layer_finding(
        parsed, layer, match, rule=RULE_CPU, severity=Severity.WARN, forces_cpu=True,
        what=f"runs {layer.vendor_op} {layer.layer} on the CPU{dtype}", attribute=Col.PLACEMENT, value="cpu",
        limit="npu", fix="move it into pre/post-processing or replace it with an op the NPU runs; if check "
                         "--profile placed it on the NPU, the profile needs this fact")


def _precision_finding(parsed: ParsedLog, layer: VendorLayer, match: NameMatch | None) -> Finding:
    return _layer_finding(
        parsed, layer, match, rule=RULE_PRECISION, severity=Severity.INFO,
        what=f"keeps {layer.vendor_op} {layer.layer} in {layer.dtype} on the NPU", attribute="dtype",
        value=layer.dtype, limit="int8",
        fix="not an error: the tool keeps a wider type here, so quantscan's int8 figure for this site is "
            "pessimistic; to simulate it, keep the site float or int16 (bisect --keep-float NAME, --fallback int16)")


def placement_mismatches(parsed: ParsedLog, matches: Mapping[str, NameMatch], predicted: Mapping[str, str],
                         profile: str) -> list[Finding]:
    """One finding per vendor layer whose placement differs from `check --profile`'s for its ONNX node.

    The vendor has the last word: a mismatch is either a tool quirk (a layer it added) or a fact the
    profile lacks; the finding names both placements so the profile can be fixed from it.
    """
    rows: list[Finding] = []
    for layer in parsed.layers:
        match = matches.get(layer.layer)
        if layer.io_operator or match is None or not match.node or match.node not in predicted:
            continue
        expected = predicted[match.node]
        if layer.target != expected:
            rows.append(_layer_finding(
                parsed, layer, match, rule=RULE_MISMATCH, severity=Severity.WARN,
                what=f"runs {layer.vendor_op} {layer.layer} on the {layer.target.upper()}, check --profile "
                     f"{profile} places {match.node} on the {expected.upper()}",
                attribute=Col.PLACEMENT, value=layer.target, limit=f"{expected} (check --profile {profile})",
                fix=f"if the vendor is right (it has the last word), add this fact to the {profile} profile"))
    return rows
