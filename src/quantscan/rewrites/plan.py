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
from quantscan.model import load_model
from quantscan.records import RewriteId
from quantscan.rewrites.runner import REWRITES

REWRITE_ORDER: tuple[RewriteId, ...] = (
    RewriteId.FIX_DIM,
    RewriteId.FIX_CEIL_MODE,
    RewriteId.FOLD_BN,
    RewriteId.DECOMPOSE_HARDSWISH,
    RewriteId.DECOMPOSE_HARDSIGMOID,
    RewriteId.FUSE_HARDSWISH,
    RewriteId.DECOMPOSE_LAYERNORM,
    RewriteId.FUSE_LAYERNORM,
    RewriteId.GELU_TANH,
    RewriteId.DIV_TO_MUL,
    RewriteId.CLEANUP,
)
"""The order suggested rewrites apply in: dims fixed first, folds before decompositions before fusions."""

ModelArg = str | Path | onnx.ModelProto


@dataclass(frozen=True)
class ProfilePlan:
    """What a profile's findings suggest: plain rewrites (in `REWRITE_ORDER`) and fix-dim settings."""

    rewrites: list[RewriteId] = field(default_factory=list)
    fix_dims: list[str] = field(default_factory=list)


def plan_for_profile(model: ModelArg, profile: str | Path) -> ProfilePlan:
    """Check `model` against `profile` and collect the rewrites its findings name, deduplicated.

    fix-dim settings keep the findings' order (worst first, then graph order); a fix-dim finding
    without settings (a shape chain that folds once dims are fixed) adds none.
    """
    result = check(model, [profile])
    ids: set[RewriteId] = set()
    dims: list[str] = []
    for finding in result.records:
        if finding.rewrite is None:
            continue
        if finding.rewrite is RewriteId.FIX_DIM:
            dims += [d for d in finding.rewrite_args if d not in dims]
        else:
            ids.add(finding.rewrite)
    return ProfilePlan([r for r in REWRITE_ORDER if r in ids], dims)


def rewrites_for_profile(model: ModelArg, profile: str | Path) -> list[RewriteId]:
    """The plain rewrites (no fix-dim) `profile`'s findings suggest for `model`, in apply order."""
    return plan_for_profile(model, profile).rewrites


def split_applicable(model: ModelArg, steps: Sequence[str]) -> tuple[list[str], list[str]]:
    """(kept, skipped): a step whose pass changes nothing in `model` (e.g. a fuse below its opset) is
    skipped rather than failing the run; fix-dim and unknown ids are kept for `rewrite()` to judge."""
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model).proto
    kept: list[str] = []
    skipped: list[str] = []
    for step in steps:
        if step in REWRITES and not REWRITES[RewriteId(step)](proto).changes:
            skipped.append(step)
        else:
            kept.append(step)
    return kept, skipped
