"""Rule `rank-size`: tensors on the NPU path past the profile's rank, dim, batch or element limits.

One finding per node (the first limit broken), so a 5-D attention block does not bury the table.
Shapes are read from the view with input dims fixed; unknown dims are skipped, and so are the dim and
element limits of a tensor whose size rests on a guessed input dim (`ModelViews.guessed`). The batch
limit is layout-aware only as far as it can be sure: a tensor's axis 0 is judged as a batch when it
equals the batch of a data input, so an LSTM state [2,1,128] (axis 0 = layers x directions, its batch
is 1) is not "batch 2 > 1".
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from quantscan.compat.context import RuleContext
from quantscan.compat.fixes import Fix, batch_fix
from quantscan.compat.params import recurrent_batch_axis
from quantscan.graph.index import GraphIndex
from quantscan.records import Finding

RULE_ID = "rank-size"


def run(ctx: RuleContext) -> list[Finding]:
    out = []
    for i in ctx.analysis.live():
        if ctx.on_npu_path(i):
            finding = next(_violations(ctx, i), None)
            if finding is not None:
                out.append(finding)
    return out


def batch_sizes(view: GraphIndex) -> set[int]:
    """The batch sizes the model's data inputs have (axis 0 in the fixed view). A recurrent state input
    (silero's `state` [2,1,128], fed back from output `stateN` of the same shape) is not data: its axis 0
    counts layers x directions, and tensors derived from it are not batches either."""
    outputs = {o: view.info(o).shape for o in view.outputs}
    sizes: set[int] = set()
    for name in view.inputs:
        shape = view.info(name).shape
        if not shape:
            continue
        if any(o != name and o.startswith(name) and s == shape for o, s in outputs.items()):
            continue
        readers = view.consumers.get(name, [])
        axis = max((recurrent_batch_axis(view, r) for r in readers if view.node_inputs(r)[:1] == [name]), default=0)
        size = shape[axis] if axis < len(shape) else None
        if isinstance(size, int):
            sizes.add(size)
    return sizes


def batch_origins(ctx: RuleContext) -> tuple[set[int], set[int]]:
    """The batch sizes the check gave symbolic input batches (axis 0), and the static input batches."""
    symbolic = {f.value for f in ctx.analysis.loaded.fills if f.axis == 0}
    original = ctx.analysis.original
    static = {s[0] for s in (original.info(n).shape for n in original.inputs) if s and isinstance(s[0], int)}
    return symbolic, static


def _violations(ctx: RuleContext, i: int) -> Iterator[Finding]:
    p = ctx.profile
    tensors = [t for t in ctx.view.node_inputs(i) if not ctx.view.is_const(t)] + ctx.view.node_outputs(i)
    batches = batch_sizes(ctx.view)
    guessed = ctx.analysis.loaded.guessed
    for t in tensors:
        shape = ctx.view.info(t).shape
        if shape is None:
            continue
        dims = [d for d in shape if isinstance(d, int)]
        if p.max_rank is not None and len(shape) > p.max_rank:
            yield _finding(ctx, i, t, "rank", len(shape), f"<= {p.max_rank}", "Reshape to fewer dims")
        if t in guessed:
            continue  # its sizes rest on a dim nobody gave: no size finding on a guess
        if p.max_dim is not None and dims and max(dims) > p.max_dim:
            yield _finding(ctx, i, t, "dim", max(dims), f"<= {p.max_dim}", "split the tensor along that axis")
        if (
            p.max_batch is not None
            and len(shape) >= 2
            and isinstance(shape[0], int)
            and shape[0] > p.max_batch
            and shape[0] in batches
        ):
            yield _finding(ctx, i, t, "batch", shape[0], f"<= {p.max_batch}", batch_fix(shape[0], *batch_origins(ctx)))
        n = int(np.prod(dims, dtype=np.int64)) if len(dims) == len(shape) else None
        if p.max_elements is not None and n is not None and n > p.max_elements:
            yield _finding(ctx, i, t, "elements", n, f"<= {p.max_elements}", "tile the input (smaller crops)")


def _finding(
    ctx: RuleContext, i: int, tensor: str, attribute: str, value: int, limit: str, fix: str | Fix
) -> Finding:
    p = ctx.profile
    fix = fix if isinstance(fix, Fix) else Fix(fix)
    return Finding(
        node=ctx.name(i),
        op_type=ctx.op(i),
        rule=RULE_ID,
        severity=ctx.severity(p.on_violation, p.tensor),
        reason=f"tensor '{tensor}' {attribute} {value} outside {limit} on {p.name}",
        attribute=attribute,
        value=str(value),
        limit=limit,
        fix=fix.text,
        rewrite=fix.rewrite,
        rewrite_args=fix.args,
        source=p.tensor.source,
        unverified=p.tensor.unverified,
        forces_cpu=True,
    )
