"""The vendor in the loop: a real toolchain measures candidates (`--evaluator`) or the result (`--verify`).

Why: a plan measured only in quantscan's simulation can fit its particular rounding (issue 32: RKNN
gave 0.972 for a PP-OCRv4 rec plan quantscan scored 0.9946). A toolchain applies a set of float sites
and says what its own simulator gets; this module needs only that, as the `Toolchain` protocol
(`toolchains/rknn/hybrid.HybridRknn` is one), so bisect never imports a vendor package and a pool of
workers (the Ray executor) can map `evaluate` over candidates: each call is one independent build.

* `ToolchainEvaluator` stands in for `scanning.gain.Evaluator` in the search: precisions -> the sites
  kept above int8 -> one hybrid build -> the toolchain's output cosine. The search order is still
  quantscan's ranking (the output gains), so the cheap simulation decides what to try and the chip
  decides what passes.
* `verify` applies the plan and every Pareto point once and records `verified` beside each claim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from quantscan.bisect.realise import Judged
from quantscan.bisect.robust import Spread
from quantscan.calib import CalibSet
from quantscan.errors import UsageError
from quantscan.model import LoadedModel
from quantscan.records import Plan, PlanSite, Precision
from quantscan.scanning.gain import Measured
from quantscan.scanning.prepare import ScanContext

TOOLS = ("rknn", "tpu-mlir")


class Toolchain(Protocol):
    """A vendor toolchain that applies sets of float sites (module docstring)."""

    tool: str
    builds: int

    def evaluate(self, sites: Sequence[PlanSite], label: str) -> dict[str, Any]:
        """Build with `sites` above int8 and simulate: `cosine` (worst output), `version`, `error`
        (None or {stage, message}), `vanished`, `honoured`, ... `label` names the build's folder."""
        ...

    def names_for(self, sites: Sequence[PlanSite]) -> dict[str, list[str]]:
        """Site node -> the names the toolchain's own configuration takes for it (the export's)."""
        ...

    def close(self) -> None:
        """Remove what only builds needed."""
        ...


ToolchainFactory = Callable[[LoadedModel, CalibSet], Toolchain]
"""Made by the CLI from `--evaluator/--verify TOOL --vendor-python PATH` and `--profile CHIP`
(toolchains/rknn/hybrid.toolchain_factory), called by the bisection with the model and the very samples it
measures on."""


def kernel_sites(ctx: ScanContext, prec: Sequence[str]) -> list[PlanSite]:
    """The sites `prec` keeps above int8, named as the exports name them (nodes of the user's model)."""
    from quantscan.bisect.plan import original_nodes

    return [PlanSite(node=s.node, output=s.output, precision=Precision(Precision.parse(prec[k])),
                     op_type=s.op_type, nodes=tuple(original_nodes(ctx, s)))
            for k, s in enumerate(ctx.graph.sites) if prec[k] != "int8"]


def _label(prefix: str, sites: Sequence[PlanSite]) -> str:
    import hashlib

    digest = hashlib.sha256("\n".join(sorted(s.node for s in sites)).encode()).hexdigest()[:10]
    return f"{prefix}-{len(sites):03d}-{digest}"


class ToolchainEvaluator:
    """`Evaluator.evaluate(prec) -> Measured` through a toolchain build (the `cosine` target only: the
    toolchain's simulator output compared with FP32 on the same samples)."""

    def __init__(self, ctx: ScanContext, chain: Toolchain, key: str) -> None:
        if key != "cosine":
            raise UsageError(f"bisect --evaluator {chain.tool}: expected a cosine target (the toolchain's "
                             f"simulator is compared by output cosine), found {key}")
        self.ctx = ctx
        self.chain = chain
        self.key = key

    def evaluate(self, prec: Sequence[str]) -> Measured:
        sites = kernel_sites(self.ctx, prec)
        chain = self.chain
        got = chain.evaluate(sites, _label("eval", sites))
        if got.get("error"):
            raise UsageError(f"bisect --evaluator {chain.tool}: expected a build with {len(sites)} float "
                             f"site(s), found it stopped in {got['error'].get('stage')}: "
                             f"{got['error'].get('message')}; the session keeps every finished step")
        value = float(got.get("cosine", math.nan))
        worst = {"cosine": value}
        output = ",".join(got.get("vendor_output_cosine", {})) or chain.tool
        return Measured(rows={output: worst}, output=output, worst=worst)

    def judge(self, prec: Sequence[str]) -> Judged:
        """One build's figure as the search compares it: the chip's rounding is the only realisation (no
        interval: the toolchain's simulator is what the plan is for)."""
        measured = self.evaluate(prec)
        value = float(measured.worst[self.key])
        return Judged(measured, Spread(value, value, value, (value,)), value, (measured,))


def verify(plan: Plan, ctx: ScanContext, precisions: Callable[[Sequence[str]], Sequence[str]],
           chain: Toolchain) -> Plan:
    """The plan and every Pareto point applied by the toolchain, `verified` recorded beside each claim
    (one build per distinct set; a set the plan and a point share is built once)."""
    done: dict[frozenset[str], dict[str, Any]] = {}
    claimed = (plan.achieved or {}).get("cosine", math.nan)

    def apply(nodes: Sequence[str], value: float) -> dict[str, Any]:
        key = frozenset(nodes)
        if key not in done:
            sites = kernel_sites(ctx, precisions(list(nodes)))
            done[key] = chain.evaluate(sites, _label("verify", sites))
        return _verified(chain.tool, done[key], value)

    plan_nodes = [s.node for s in plan.sites]
    top = apply(plan_nodes, claimed) if plan.reached else None
    pareto = tuple(replace(p, verified=apply(p.sites, p.value)) for p in plan.pareto)
    if top is not None:
        top["builds"] = len(done)
    return replace(plan, verified=top, pareto=pareto)


def _verified(tool: str, got: dict[str, Any], claimed: float) -> dict[str, Any]:
    value = float(got.get("cosine", math.nan))
    return {
        "tool": tool, "version": got.get("version"), "value": value, "metric": "cosine",
        "claimed": claimed, "delta": value - claimed if math.isfinite(value) and math.isfinite(claimed) else None,
        "vanished": list(got.get("vanished", [])), "warning": got.get("warning"),
        "honoured": list(got.get("honoured", [])), "error": got.get("error"),
    }
