"""Which rewrites a chip profile asks for: read from the typed `Finding.rewrite` of its compat check.

Why a module of its own: `quantscan rewrite --all-for-profile` used to parse the free-text `fix`
column back into rewrite ids inside the CLI. The findings now carry the id (and fix-dim's settings),
so planning is a small pure function over `check()`'s records, and the CLI only prints the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from quantscan.compat.check import check
from quantscan.model import ModelArg, load_model
from quantscan.records import RewriteId
from quantscan.rewrites.fix_dim import fix_dim
from quantscan.rewrites.opset_down import blocking_ops
from quantscan.rewrites.pipeline import REWRITES

REWRITE_ORDER: tuple[RewriteId, ...] = (
    RewriteId.FIX_DIM,
    RewriteId.FREEZE_INPUT,
    RewriteId.FIX_CEIL_MODE,
    RewriteId.GLOBAL_POOL,
    RewriteId.FOLD_BN,
    RewriteId.DECOMPOSE_HARDSWISH,
    RewriteId.DECOMPOSE_HARDSIGMOID,
    RewriteId.FUSE_HARDSWISH,
    RewriteId.DECOMPOSE_LAYERNORM,
    RewriteId.FUSE_LAYERNORM,
    RewriteId.FUSE_SOFTMAX,
    RewriteId.GELU_TANH,
    RewriteId.CLAMP_MASK,
    RewriteId.RECIPROCAL,
    RewriteId.DIV_TO_MUL,
    RewriteId.CLEANUP,
    RewriteId.RELU6_TO_RELU,
    RewriteId.EQUALIZE,
    RewriteId.SMOOTH,
    RewriteId.BIAS_CORRECT,
    RewriteId.OPSET_DOWN,
)
"""The order suggested rewrites apply in: dims fixed first, folds before decompositions before fusions,
the opset lowered last (the plan carries it as `ProfilePlan.opset`, the runner's `opset=`)."""



_UNBLOCKS: dict[str, RewriteId] = {
    "HardSwish": RewriteId.DECOMPOSE_HARDSWISH,
    "LayerNormalization": RewriteId.DECOMPOSE_LAYERNORM,
}
"""Ops that keep a model from an older opset, and the decomposition that removes them first."""

_NEEDS_OPSET: dict[RewriteId, int] = {RewriteId.FUSE_HARDSWISH: 14, RewriteId.FUSE_LAYERNORM: 17}
"""Fusions that create an op newer than a lowered target would undo the decomposition it needed."""

MAX_ROUNDS = 4


@dataclass(frozen=True)
class ProfilePlan:
    """What a profile's findings suggest: plain rewrites (in `REWRITE_ORDER`), fix-dim settings, and the
    opset to lower to last (None when the opset is in range or cannot be lowered by `opset-down`)."""

    rewrites: list[RewriteId] = field(default_factory=list)
    fix_dims: list[str] = field(default_factory=list)
    opset: int | None = None
    needs_value: list[str] = field(default_factory=list)
    """Rewrites a finding names that only the user can size (`freeze-input sr=VALUE`): never applied by
    the plan, listed so the CLI can say which flag to add."""

    @property
    def empty(self) -> bool:
        return not (self.rewrites or self.fix_dims or self.opset)


def plan_for_profile(model: ModelArg, profile: str | Path, sizes: Sequence[str] = ()) -> ProfilePlan:
    """Check `model` against `profile`, collect the rewrites its findings name, apply them in memory and
    check again until no new rewrite appears: a decomposition can expose a Div that `div-to-mul` then
    removes, and `opset-down` asks for the decompositions of the ops that have no older spelling.

    fix-dim settings keep the findings' order (worst first, then graph order); a fix-dim finding
    without settings (a shape chain that folds once dims are fixed) adds none. `sizes` are fix-dim
    settings known before the check (`rewrites.sizes`: H/W from the data or the model's metadata): the
    findings are read on the model with them applied, so what they fold (an anchor grid's shape chain)
    is no longer asked for, and they lead the plan's fix-dims.
    """
    original = model if isinstance(model, onnx.ModelProto) else load_model(model).proto
    dims: list[str] = list(dict.fromkeys(sizes))
    current = fix_dim(original, dims).model if dims else original
    ids: set[RewriteId] = set()
    opset: int | None = None
    needs = _needs_value(original, profile)
    for _ in range(MAX_ROUNDS):
        new_ids, new_dims, target = _suggested(current, profile)
        opset = target if target is not None else opset
        fresh = new_ids - ids
        dims += [d for d in new_dims if d not in dims]
        if not fresh:
            break
        ids |= fresh
        current = _apply(current, [r for r in REWRITE_ORDER if r in fresh], dims)
    if opset is not None:
        ids = {r for r in ids if _NEEDS_OPSET.get(r, 0) <= opset}
    return ProfilePlan([r for r in REWRITE_ORDER if r in ids], _applicable_dims(original, dims), opset, needs)


def _needs_value(model: onnx.ModelProto, profile: str | Path) -> list[str]:
    """`freeze-input NAME=VALUE` for every input a finding asks to freeze (the value is the user's)."""
    out: list[str] = []
    for finding in check(model, [profile]).records:
        if finding.rewrite is RewriteId.FREEZE_INPUT:
            out += [f"freeze-input {a}=VALUE" for a in finding.rewrite_args if f"freeze-input {a}=VALUE" not in out]
    return out


def _applicable_dims(model: onnx.ModelProto, dims: list[str]) -> list[str]:
    """The fix-dim settings that change something (a batch limit on an input with a static batch, e.g.
    a time-major LSTM state, names no symbolic dim: fix-dim would fail the whole run)."""
    return [d for d in dims if fix_dim(model, [d]).changes]


def _suggested(model: onnx.ModelProto, profile: str | Path) -> tuple[set[RewriteId], list[str], int | None]:
    """The ids, fix-dim settings and opset target `model`'s findings for `profile` name."""
    ids: set[RewriteId] = set()
    dims: list[str] = []
    opset: int | None = None
    for finding in check(model, [profile]).records:
        if finding.rewrite is RewriteId.FIX_DIM:
            dims += [d for d in finding.rewrite_args if d not in dims]
        elif finding.rewrite is RewriteId.OPSET_DOWN:
            opset = int(finding.rewrite_args[0])
            ids |= {_UNBLOCKS[op] for op in blocking_ops(model, opset) if op in _UNBLOCKS}
        elif finding.rule == "opset" and finding.rewrite_args:
            opset = int(finding.rewrite_args[0])  # raised first by the runner (version_converter)
        elif finding.rewrite is RewriteId.FREEZE_INPUT:
            continue  # needs the user's value: ProfilePlan.needs_value
        elif finding.rewrite is not None:
            ids.add(finding.rewrite)
    return ids, dims, opset


def _apply(model: onnx.ModelProto, ids: Sequence[RewriteId], dims: Sequence[str]) -> onnx.ModelProto:
    """The planned passes applied in memory (no proof: only to see which findings remain)."""
    current = fix_dim(model, list(dims)).model if dims else model
    for rid in ids:
        if rid in REWRITES:
            current = REWRITES[rid](current).model
    return current


def rewrites_for_profile(model: ModelArg, profile: str | Path) -> list[RewriteId]:
    """The plain rewrites (no fix-dim) `profile`'s findings suggest for `model`, in apply order."""
    return plan_for_profile(model, profile).rewrites


def split_applicable(model: ModelArg, steps: Sequence[str]) -> tuple[list[str], list[str]]:
    """(kept, skipped): a step whose pass changes nothing in the model as the steps before it left it
    (e.g. a fuse below its opset) is skipped rather than failing the run; fix-dim and unknown ids are
    kept for `rewrite()` to judge."""
    current = model if isinstance(model, onnx.ModelProto) else load_model(model).proto
    kept: list[str] = []
    skipped: list[str] = []
    for step in steps:
        if step not in REWRITES:
            kept.append(step)
            continue
        result = REWRITES[RewriteId(step)](current)
        if result.changes:
            kept.append(step)
            current = result.model
        else:
            skipped.append(step)
    return kept, skipped
