"""Rule `unsupported-op`: op types the profile does not run on the NPU, and custom-domain ops.

An op listed under `ops.cpu` runs but on the CPU (warn); an op in no list is rejected by the
converter (error) or left on the CPU (warn), as the profile's `ops.unsupported` says. A part of a
Softmax written out (ReduceMax/Sub/Exp/ReduceSum/Div) on a chip that runs Softmax names `fuse-softmax`,
which leaves one Softmax node in its place. An op listed
under `ops.folded` with constant parameters (a Reshape to a constant shape) is removed by the
converter: no finding; with a run-time parameter it is a CPU op (warn). Control-flow
ops are left to the control-flow rule so one node gets one explanation.

An op outside the standard domain (`ai.onnx.ml`'s tree ensembles, linear classifiers, scalers and
encoders; a vendor's custom ops) is in no chip profile's op list, whatever the profile: its domain, not
the list, says no NPU converter compiles it. So it gets one severity on every chip profile, `error`
with CPU placement, and the profile's `unsupported` policy or an unverified list (which decide, and cap,
findings about standard ops a list may simply have missed) does not change it, nor does a chip list
written `npu = "*"` (bm1684x: every standard op tpu-mlir converts, not a domain it has no converter
for). Only the `onnxruntime` recipe runs `ai.onnx.ml` ops itself: no finding there.
"""

from __future__ import annotations

from quantscan.columns import Col
from quantscan.compat.context import RuleContext
from quantscan.compat.fixes import Fix, rewrite_fix, unsupported_op_fix
from quantscan.graph.index import CONTROL_FLOW_OPS, DEFAULT_DOMAINS, IDENTITY_OPS
from quantscan.patterns import softmax
from quantscan.records import Finding, RewriteId, Severity
from quantscan.rewrites.fuse_softmax import refusal_of

RULE_ID = "unsupported-op"
LAYOUT_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast", "Identity", "Dropout"})
"""Ops that only relabel or retype a tensor: when a profile lists them as folded, the converter removes
them (a folded BatchNormalization is not one of these: its fold is the `fold-bn` rewrite's job)."""


def run(ctx: RuleContext) -> list[Finding]:
    out = []
    fusable = _softmax_parts(ctx) if "Softmax" in ctx.profile.npu_ops else set()
    for i in ctx.analysis.live():
        finding = _check(ctx, i, fusable)
        if finding is not None:
            out.append(finding)
    return out


def _softmax_parts(ctx: RuleContext) -> set[int]:
    """Positions of the nodes of every written-out Softmax (`patterns.softmax`) that `fuse-softmax` fuses."""
    view = ctx.view
    position = {id(n): k for k, n in enumerate(view.nodes)}
    parts: set[int] = set()
    for node in view.nodes:
        found = softmax.match_at(view, node) if node.op_type == "Exp" else None
        if not isinstance(found, softmax.SoftmaxMatch):
            continue
        shape = view.info(found.x).shape
        if not refusal_of(found, view, view.opset(), {found.x: len(shape)} if shape is not None else {}):
            parts.update(position[id(n)] for n in found.nodes)
    return parts


def _check(ctx: RuleContext, i: int, fusable: set[int]) -> Finding | None:
    node, p = ctx.view.nodes[i], ctx.profile
    op = node.op_type
    base = dict(node=ctx.name(i), op_type=op, rule=RULE_ID, source=p.ops.source, unverified=p.ops.unverified)
    foreign = node.domain not in DEFAULT_DOMAINS
    # Before the op list: a chip's `npu = "*"` names op types, not domains. Only onnxruntime itself (the
    # recipe whose list takes in ai.onnx.ml) runs such an op; a chip that borrows its recipe (qnn-htp) does not.
    if foreign and not (p.recipe == ORT_RECIPE and op in p.npu_ops):
        return _foreign_domain(node.domain, op, base)
    if op in CONTROL_FLOW_OPS or op in IDENTITY_OPS or op in p.npu_ops:
        return None
    if foreign:  # a domain onnxruntime does not run either
        return Finding(
            **base,  # type: ignore[arg-type]
            severity=ctx.severity(p.unsupported, p.ops),
            reason=f"custom-domain op {node.domain}::{op}: onnxruntime has no kernel for its domain",
            attribute="domain",
            value=node.domain,
            limit="ai.onnx",
            fix="register a custom op library with onnxruntime, or re-export with standard ops",
            forces_cpu=True,
        )
    if _folded_away(ctx, i):
        return None
    fix = (rewrite_fix(RewriteId.FUSE_SOFTMAX) if i in fusable else None) or _div_by_constant_fix(ctx, i) \
        or unsupported_op_fix(op, p)
    if op in p.cpu_ops or op in p.folded_ops:
        why = "listed as a CPU op" if op in p.cpu_ops else "only removed when constant folding applies"
        return Finding(
            **base,  # type: ignore[arg-type]
            severity=Severity.WARN,
            reason=f"{op} runs on the CPU on {p.name} ({why}); data crosses the NPU/CPU boundary",
            attribute=Col.OP_TYPE,
            value=op,
            limit="NPU op list",
            fix=fix.text,
            rewrite=fix.rewrite,
            rewrite_args=fix.args,
            forces_cpu=True,
        )
    return Finding(
        **base,  # type: ignore[arg-type]
        severity=ctx.severity(p.unsupported, p.ops),
        reason=f"{op} is not in {p.name}'s supported op list",
        attribute=Col.OP_TYPE,
        value=op,
        limit="NPU op list",
        fix=fix.text,
        rewrite=fix.rewrite,
        rewrite_args=fix.args,
        forces_cpu=True,
    )


ML_DOMAIN = "ai.onnx.ml"
ORT_RECIPE = "onnxruntime"
"""The one profile whose runtime runs ai.onnx.ml (its op list is every inference op): not a chip."""


def _foreign_domain(domain: str, op: str, base: dict[str, object]) -> Finding:
    """An op no chip profile runs: error everywhere (see the module docstring), placed on the CPU."""
    same = "error on every chip profile: its domain, not a profile's op list, rules it out"
    if domain == ML_DOMAIN:
        reason = (f"{domain}::{op} is a classical-ML op (no tensor arithmetic an NPU has): no NPU converter "
                  f"compiles it and nothing in it is int8; it runs on the CPU ({same})")
        fix = ("run it on the CPU with onnxruntime (its ai.onnx.ml kernels): cut the network part out with "
               "`quantscan extract` and deploy only that to the NPU")
    else:
        reason = f"custom-domain op {domain}::{op}: no NPU converter knows it ({same})"
        fix = "implement it as a custom CPU op in the vendor runtime, or re-export with standard ops"
    return Finding(
        **{**base, "source": f"ONNX domain {domain} (outside the standard ops every NPU list names)",
           "unverified": False},  # type: ignore[arg-type]
        severity=Severity.ERROR,
        reason=reason,
        attribute="domain",
        value=domain,
        limit="ai.onnx",
        fix=fix,
        forces_cpu=True,
    )


def _folded_away(ctx: RuleContext, i: int) -> bool:
    """An op the profile lists as folded (horizon-x3: Reshape/Squeeze/Unsqueeze/Cast) whose parameters
    (every input after the data) are constants: the converter removes it, so no CPU finding. A Reshape
    whose target shape is computed at run time still gets one."""
    op = ctx.op(i)
    if op not in LAYOUT_OPS or op not in ctx.profile.folded_ops or op in ctx.profile.cpu_ops:
        return False
    folded_outputs = {t for j in ctx.analysis.removed() for t in ctx.view.node_outputs(j)}
    params = ctx.view.node_inputs(i)[1:]
    return all(ctx.view.is_const(t) or t in folded_outputs for t in params)


def _div_by_constant_fix(ctx: RuleContext, i: int) -> Fix | None:
    """`div-to-mul` for a Div whose divisor is a float constant on a chip that runs Mul: the node's
    inputs decide, which is why this sits here and not in the op-name table of `fixes`."""
    node = ctx.view.nodes[i]
    if node.op_type != "Div" or "Mul" not in ctx.profile.npu_ops or len(node.input) != 2:
        return None
    value = ctx.view.constant(node.input[1])
    if value is None or value.dtype.kind != "f" or (value == 0).any():
        return None
    return rewrite_fix(RewriteId.DIV_TO_MUL)
