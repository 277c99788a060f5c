"""Rule `dtype`: tensors of a type the NPU does not handle (int64, float64, bool...) on the NPU path.

Only data tensors count: constant inputs (weights, Reshape shapes, Slice starts) are parameters the
converter consumes at build time, and shape chains are the dynamic-shape rule's business. Nor does a
type the ONNX schema itself fixes (Reshape's and Expand's shape, Resize's sizes, Tile's repeats, ArgMax's
output: int64 and nothing else): "Cast to int32" there names a fix that would make the model invalid.
A computed shape of that kind is the dynamic-shape rules' business, not a dtype choice of the exporter.
"""

from __future__ import annotations

from functools import lru_cache

import onnx

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
    """The node's inputs and outputs whose type the model chose: not constants, not folded shape values,
    not a slot whose type the op's schema fixes."""
    removed = ctx.analysis.removed()
    node = ctx.view.nodes[i]
    fixed_in, fixed_out = _schema_fixed_slots(node.op_type, node.domain, ctx.view.opset())
    inputs = []
    for pos, t in enumerate(node.input):
        producer = ctx.view.producer.get(t)
        if not t or ctx.view.is_const(t) or (producer is not None and producer in removed) or _in(fixed_in, pos):
            continue
        inputs.append(t)
    return inputs + [t for pos, t in enumerate(node.output) if t and not _in(fixed_out, pos)]


def _in(fixed: tuple[bool, ...], pos: int) -> bool:
    """Whether slot `pos` is schema-fixed (a variadic last formal parameter covers the positions after it)."""
    return bool(fixed) and fixed[min(pos, len(fixed) - 1)]


@lru_cache(maxsize=256)
def _schema_fixed_slots(op: str, domain: str, opset: int) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """Per formal input and output of `op` at `opset`: True when the schema admits exactly one type
    (e.g. Reshape's `shape`: tensor(int64)). Unknown op or domain: nothing fixed."""
    try:
        schema = onnx.defs.get_schema(op, opset or onnx.defs.onnx_opset_version(), domain or "")
    except onnx.defs.SchemaError:
        return (), ()
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

    def fixed(params: list[onnx.defs.OpSchema.FormalParameter]) -> tuple[bool, ...]:
        return tuple(len(allowed.get(p.type_str, {p.type_str})) == 1 for p in params)

    return fixed(list(schema.inputs)), fixed(list(schema.outputs))


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
