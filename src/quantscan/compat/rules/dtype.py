"""Rule `dtype`: tensors of a type the NPU does not handle (int64, float64, bool...) on the NPU path.

Only data tensors count: constant inputs (weights, Reshape shapes, Slice starts) are parameters the
converter consumes at build time, and shape chains are the dynamic-shape rule's business.
"""

from __future__ import annotations

from quantscan.compat.context import RuleContext
from quantscan.graph.index import dtype_name
from quantscan.records import Finding, Severity

RULE_ID = "dtype"
_FIXES = {
    "int64": "Cast to int32 (or keep the index arithmetic out of the NPU graph)",
    "float64": "convert the model to float32",
    "bool": "express the mask as float/int8 arithmetic, or move it out of the NPU graph",
}


def run(ctx: RuleContext) -> list[Finding]:
    out = []
    for i in ctx.analysis.live():
        if ctx.on_npu_path(i):
            finding = _check(ctx, i)
            if finding is not None:
                out.append(finding)
    return out


def _data_tensors(ctx: RuleContext, i: int) -> list[str]:
    removed = ctx.analysis.removed()
    inputs = []
    for t in ctx.view.node_inputs(i):
        producer = ctx.view.producer.get(t)
        if ctx.view.is_const(t) or (producer is not None and producer in removed):
            continue
        inputs.append(t)
    return inputs + ctx.view.node_outputs(i)


def _check(ctx: RuleContext, i: int) -> Finding | None:
    p = ctx.profile
    for t in _data_tensors(ctx, i):
        elem = ctx.view.info(t).elem_type
        name = dtype_name(elem)
        if elem == 0 or name in p.npu_dtypes:
            continue
        return Finding(
            node=ctx.name(i),
            op_type=ctx.op(i),
            rule=RULE_ID,
            severity=Severity.WARN,
            reason=f"tensor '{t}' is {name}; {p.name}'s NPU takes {', '.join(sorted(p.npu_dtypes))}: "
            "the node runs on the CPU",
            attribute="dtype",
            value=name,
            limit=", ".join(sorted(p.npu_dtypes)),
            fix=_FIXES.get(name, f"convert '{t}' to a supported type"),
            source=p.dtypes.source,
            unverified=p.dtypes.unverified,
            forces_cpu=True,
        )
    return None
