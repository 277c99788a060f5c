"""The vendor in the loop: a real toolchain measures candidates (`--evaluator`) or the result (`--verify`).

Why: a plan measured only in quantscan's simulation can fit its particular rounding (issue 32: RKNN
gave 0.972 for a PP-OCRv4 rec plan quantscan scored 0.9946). A toolchain applies a set of float sites
and says what its own simulator gets; this module needs only that, as the `Toolchain` protocol
(`toolchains/rknn/hybrid.HybridRknn` is one), so the search never imports a vendor package and a pool of
workers (the Ray executor) can map `evaluate` over candidates: each call is one independent build.

* `ToolchainJudge` is the search's judge (bisect/judges.py) for `--evaluator TOOL`: precisions -> the
  sites kept above int8 -> one hybrid build -> the toolchain's output cosine; a round is that many builds
  side by side. The search order is still quantscan's ranking (the output gains), so the cheap simulation
  decides what to try and the chip decides what passes; the plan claims the chip's own figures.
* `verify` applies the plan and every Pareto point once and records `verified` beside each claim; with
  all-int8 built too, `verified.held_out` scores the toolchain on the claim's own held-out samples.
* `BuildPool` runs builds where `--executor` puts them (issue 29): locally up to `--workers` at once in
  threads (each build is a subprocess already), under Ray one task each on a node offering the resource
  `toolchain:TOOL` (a node started with `--resources '{"toolchain:rknn": 2}'` has the toolchain's Python).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from quantscan.bisect.judge import JudgeSetup
from quantscan.bisect.realise import Claims, Judged
from quantscan.bisect.robust import Spread
from quantscan.bisect.speculate import Spare
from quantscan.bisect.state import Candidate
from quantscan.calib import CalibSet
from quantscan.errors import UsageError
from quantscan.executors import Executor
from quantscan.graph.mixed import MixedBuilder
from quantscan.heldout import claimed_samples, held_out_figures
from quantscan.model import LoadedModel
from quantscan.records import Plan, PlanSite, Precision
from quantscan.scanning.gain import Measured
from quantscan.scanning.prepare import ScanContext


class Toolchain(Protocol):
    """A vendor toolchain that applies sets of float sites (module docstring)."""

    tool: str
    builds: int
    export: str
    """The `--export` whose file `names_for`'s names fill (`rknn`: the hybrid cfg, `tpu-mlir`: the qtable)."""

    def evaluate(self, sites: Sequence[PlanSite], label: str) -> dict[str, Any]:
        """Build with `sites` above int8 and simulate: `cosine` (worst output), `version`, `error`
        (None or {stage, message}), `vanished`, `honoured`, ... `label` names the build's folder."""
        ...

    def names_for(self, sites: Sequence[PlanSite]) -> dict[str, list[str]]:
        """Site node -> the names the toolchain's own configuration takes for it (the export's)."""
        ...

    def prepare(self) -> None:
        """Run what every build shares (RKNN's hybrid step 1) once, before builds run side by side."""
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


Build = tuple[Sequence[PlanSite], str]
"""One build: the sites kept above int8 and the label naming its folder."""


def build_task(chain: Toolchain, build: Build, threads: int | None) -> tuple[dict[str, Any], float]:
    """One build where the executor put it (a module-level function: Ray pickles it by reference); its
    result and its own wall time (the time a serial run's step would have taken)."""
    t0 = time.perf_counter()
    got = chain.evaluate(*build)
    return got, time.perf_counter() - t0


def prepare_task(chain: Toolchain, _item: object, threads: int | None) -> None:
    chain.prepare()


@dataclass
class BuildPool:
    """Builds of one toolchain through the executor seam (module docstring); `builds` counts them.
    Without an executor every build runs here, one after another, as before issue 29."""

    chain: Toolchain
    executor: Executor | None = None
    builds: int = 0
    prepared: bool = False

    @property
    def resources(self) -> dict[str, float]:
        """The Ray resource a node with this toolchain's Python offers (docs/workers.md, "On a cluster")."""
        return {f"toolchain:{self.chain.tool}": 1.0}

    def run(self, builds: Sequence[Build]) -> list[tuple[dict[str, Any], float]]:
        """Every build's result and seconds, in order (step 1 first, once, where the builds will run)."""
        if self.executor is None or len(builds) == 0:
            results = [build_task(self.chain, b, None) for b in builds]
        else:
            if not self.prepared:
                self.executor.map_tasks(prepare_task, self.chain, [None], self.resources)
                self.prepared = True
            results = self.executor.map_tasks(build_task, self.chain, list(builds), self.resources)
        self.builds += len(builds)
        return results


class ToolchainJudge:
    """A toolchain build per candidate (the `cosine` target only: the toolchain's simulator output compared
    with FP32 on the same samples); the bisection's `Judge` (bisect/judges.py)."""

    def __init__(self, ctx: ScanContext, chain: Toolchain, key: str, builder: MixedBuilder,
                 pool: BuildPool | None = None, width: int = 1) -> None:
        if key != "cosine":
            raise UsageError(f"bisect --evaluator {chain.tool}: expected a cosine target (the toolchain's "
                             f"simulator is compared by output cosine), found {key}")
        self.ctx = ctx
        self.chain = chain
        self.key = key
        self.pool = pool if pool is not None else BuildPool(chain)
        self.builder = builder
        self.width = width
        """Builds side by side in a round: `--workers` (each build a subprocess: threads, or Ray tasks)."""

    @classmethod
    def of(cls, setup: JudgeSetup) -> ToolchainJudge:
        """The judge of a search whose toolchain the driver made (`setup.pool`: its builds)."""
        if setup.pool is None:
            raise UsageError("bisect: expected a toolchain for a toolchain --evaluator, found none")
        width = max(1, setup.workers) if setup.executor is not None else 1
        return cls(setup.split.search, setup.pool.chain, setup.target.key, setup.builder, setup.pool, width)

    def evaluate(self, prec: Sequence[str]) -> Measured:
        sites = kernel_sites(self.ctx, prec)
        (got, _), = self.pool.run([(sites, _label("eval", sites))])
        return self._measured(got, len(sites))

    def _measured(self, got: dict[str, Any], n_sites: int) -> Measured:
        chain = self.chain
        if got.get("error"):
            raise UsageError(f"bisect --evaluator {chain.tool}: expected a build with {n_sites} float "
                             f"site(s), found it stopped in {got['error'].get('stage')}: "
                             f"{got['error'].get('message')}; the session keeps every finished step")
        value = float(got.get("cosine", math.nan))
        worst = {"cosine": value}
        output = ",".join(got.get("vendor_output_cosine", {})) or chain.tool
        return Measured(rows={output: worst}, output=output, worst=worst)

    def _judged(self, measured: Measured) -> Judged:
        value = float(measured.worst[self.key])
        return Judged(measured, Spread(value, value, value, (value,)), value, (measured,))

    def judge(self, prec: Sequence[str]) -> Judged:
        """One build's figure as the search compares it: the chip's rounding is the only realisation (no
        interval: the toolchain's simulator is what the plan is for)."""
        return self._judged(self.evaluate(prec))

    def round(self, cands: Sequence[Candidate]) -> list[Spare | BaseException]:
        """A round's candidates as builds side by side (`judge_many`)."""
        judged = self.judge_many([self.builder.precisions(c.sites) for c in cands])
        return [got if isinstance(got, BaseException) else Spare(got.value, got.metrics(), seconds)
                for got, seconds in judged]

    def claims(self, sets: object) -> Claims | None:
        """None: the chip's own figures on the search's samples are the plan's claims (no held-out split)."""
        return None

    def note(self) -> dict[str, Any]:
        return {}

    def release(self) -> None:
        """Nothing to free between builds (the toolchain's step 1 stays for a resume until the plan)."""

    def judge_many(self, precs: Sequence[Sequence[str]]) -> list[tuple[Judged | UsageError, float]]:
        """Several candidates' builds at once (bisect/speculate.py), each judged or the error that stopped
        it, with the build's own seconds."""
        sites = [kernel_sites(self.ctx, prec) for prec in precs]
        results = self.pool.run([(s, _label("eval", s)) for s in sites])
        out: list[tuple[Judged | UsageError, float]] = []
        for kept, (got, seconds) in zip(sites, results, strict=True):
            try:
                out.append((self._judged(self._measured(got, len(kept))), seconds))
            except UsageError as exc:
                out.append((exc, seconds))
        return out


ToolchainEvaluator = ToolchainJudge
"""The name before the judge seam (a toolchain judge written in its style keeps working)."""


def verify(plan: Plan, ctx: ScanContext, precisions: Callable[[Sequence[str]], Sequence[str]],
           chain: Toolchain, pool: BuildPool | None = None) -> Plan:
    """The plan and every Pareto point applied by the toolchain, `verified` recorded beside each claim
    (one build per distinct set; a set the plan and a point share is built once). The builds are
    independent: they run together through `pool` (the executor seam)."""
    claimed = (plan.achieved or {}).get("cosine", math.nan)
    plan_nodes = [s.node for s in plan.sites]
    applied = plan.reached or bool(plan_nodes)  # a plan missed on held-out samples is still worth applying
    samples = claimed_samples(plan.held_out, ctx.data.eval_set.n_samples) if applied else None
    wanted = ([plan_nodes] if applied else []) + [list(p.sites) for p in plan.pareto]
    wanted += [[]] if samples is not None else []  # all-int8 in the toolchain: the vendor's gain baseline
    distinct = list(dict.fromkeys(frozenset(nodes) for nodes in wanted))
    sites = [kernel_sites(ctx, precisions(sorted(nodes))) for nodes in distinct]
    results = (pool if pool is not None else BuildPool(chain)).run([(s, _label("verify", s)) for s in sites])
    done = {key: got for key, (got, _) in zip(distinct, results, strict=True)}
    top = _verified(chain.tool, done[frozenset(plan_nodes)], claimed) if applied else None
    pareto = tuple(replace(p, verified=_verified(chain.tool, done[frozenset(p.sites)], p.value)) for p in plan.pareto)
    if top is not None:
        top["builds"] = len(done)
        plan_sums = done[frozenset(plan_nodes)].get("vendor_sample_sums") or {}
        if samples is not None and plan_sums:  # a toolchain without per-sample sums gives no held-out figure
            top["held_out"] = held_out_figures(plan.to_json(), samples, plan_sums,
                                               done[frozenset()].get("vendor_sample_sums") or {})
    return replace(plan, verified=top, pareto=pareto)


def _verified(tool: str, got: dict[str, Any], claimed: float) -> dict[str, Any]:
    value = float(got.get("cosine", math.nan))
    return {
        "tool": tool, "version": got.get("version"), "value": value, "metric": "cosine",
        "claimed": claimed, "delta": value - claimed if math.isfinite(value) and math.isfinite(claimed) else None,
        "vanished": list(got.get("vanished", [])), "warning": got.get("warning"),
        "honoured": list(got.get("honoured", [])), "error": got.get("error"),
    }
