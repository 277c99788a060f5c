"""Bisection evaluations on one switchable session (graph/switchable.py) instead of a new graph each time.

Why: every evaluation of `CachedReferenceEvaluator` built the QDQ model of its assignment, staged it and
opened an onnxruntime session: on MiniLM (109 sites, 3 sentences per evaluation) 0.45 s of a 0.5 s
evaluation, so `bisect` did not finish in the zoo's 900 s. The switchable graph holds every quantization
the builder can give, picked by selector inputs; its session is built once, and the rounding realisations
share it (their int8 scales are inputs). The figures are the per-evaluation graph's, bit for bit (tests).

Which path runs is measured once per search, then kept (bisect/targets.graph_strategy, recorded in the
session): the switchable graph runs each weighted site twice (float and quantized weights: `_switch_sites`
says why), so on a model whose run costs more than building a session (a large conv net) it is slower. The
first evaluation goes the old way, the next two on the switchable session (the first of them pays its build
and warm-up), and the faster of the two paths is then the search's, for every later evaluation and for the
workers of a `--workers` run (the figures are the same either way). It is not built when it would take more
than 1/SWITCH_SHARE of the memory budget, or when the graph has a shape the switchable graph does not
reproduce bit for bit (`NotSwitchable`: a node in two sites, a quantizable tensor inside a weighted site, a
pair onnxruntime fuses across a quantizable tensor): the search then runs on the per-candidate graph, and
says why. An assignment whose plan holds a quantization the graph has no variant for (quantize_static's int16
bias) goes the old way alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from quantscan.graph.mixed import MixedBuilder
from quantscan.graph.switchable import NotSwitchable, SwitchableGraph, build_switchable
from quantscan.runner import Runner, Session
from quantscan.scanning.budget import MemoryPlan, format_size
from quantscan.scanning.sweep import Feeds, GraphHandoff, Values, open_session, sweep

Assemble = Callable[[onnx.ModelProto], onnx.ModelProto]
"""Adds the evaluator's output reductions and reference inputs to a model (the same for both paths)."""

SWITCH_SHARE = 2
"""The switchable session's weights (float, plus every stored quantization) may take 1/SWITCH_SHARE of
the memory budget."""


@dataclass
class Timings:
    """Seconds per evaluation of each path, measured on this run."""

    old: list[float] = field(default_factory=list)
    new: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        return {"switchable": len(self.new), "per_evaluation": len(self.old),
                "switchable_median_s": round(float(np.median(self.new)), 4) if self.new else 0.0,
                "per_evaluation_median_s": round(float(np.median(self.old)), 4) if self.old else 0.0}

    def prefer_new(self) -> bool:
        """The switchable session's first run pays its build and onnxruntime's warm-up (0.9 s against 0.06 s
        later on MiniLM): it is judged on its runs after the first."""
        return float(np.median(self.new[1:])) < float(np.median(self.old))


class SwitchedSession:
    """The switchable graph of a builder and its session, built on first use and shared by the builder's
    rounding realisations (`CachedReferenceEvaluator.for_builder` copies the evaluator, not this)."""

    def __init__(self, builder: MixedBuilder, runner: Runner, memory: MemoryPlan | None) -> None:
        self._builder = builder
        self._runner = runner
        self._memory = memory
        self.timings = Timings()
        self.note = "per evaluation: no evaluation ran on the switchable graph"
        """What the bisect records (session.json `options.evaluation_graph`): why the graph was not built,
        or that it was."""
        self._graph: SwitchableGraph | None = None
        self._session: Session | None = None
        self._refused = False
        self.policy = "measured"
        """`measured` (the module docstring: decided by the first evaluations, then `always` or `never` for
        good), `always` (the switchable session, unless it cannot be built) or `never` (the per-candidate
        graph): the search's graph strategy (bisect/targets.graph_strategy)."""

    def wanted(self) -> bool:
        """Whether the next evaluation runs on the switchable session (module docstring)."""
        decided = self.decided  # first: it may settle the policy
        if self._refused or self.policy == "never":
            return False
        return decided or bool(self.timings.old)

    @property
    def decided(self) -> bool:
        """Whether the path is settled: refused, or a policy other than `measured` (given, or measured: once
        both paths are timed, the faster becomes the policy for good)."""
        if self.policy == "measured" and len(self.timings.new) >= 2 and self.timings.old:
            self.policy = "always" if self.timings.prefer_new() else "never"
        return self._refused or self.policy != "measured"

    @property
    def usable(self) -> bool:
        """The switchable session is the path (decided, and not refused as far as tried)."""
        return not self._refused and self.policy == "always"

    def selectors(self, builder: MixedBuilder, prec: Sequence[str], assemble: Assemble) -> dict[str, np.ndarray] | None:
        """The selector feeds of `prec` under `builder` (a realisation of this one), building the session
        first if needed; None when the switchable graph cannot evaluate it."""
        if not self._ready(assemble):
            return None
        assert self._graph is not None
        sites, plan = builder.plan(prec)
        return self._graph.feeds([builder.index[s.node] for s in sites], plan)

    def run(self, batches: Iterable[Feeds], selectors: dict[str, np.ndarray],
            accumulate: Callable[[Feeds, Values], None]) -> None:
        """One sweep of the switchable session over `batches`, the selectors fed with every batch."""
        assert self._session is not None
        sweep(self._session, ({**feeds, **selectors} for feeds in batches), accumulate)

    def close(self) -> None:
        """Drop the session (its weights) once the search is over: the held-out claims build their own."""
        self._session = None
        self._graph = None

    def _ready(self, assemble: Assemble) -> bool:
        if self._graph is not None or self._refused:
            return not self._refused and self._session is not None
        acts, weights = self._builder.variants()
        try:
            graph = build_switchable(self._builder.proto, self._builder.sites, acts, weights)
        except NotSwitchable as exc:
            return self._refuse(f"per evaluation: {exc}")
        need = _initializer_bytes(graph.model) + graph.weight_variant_bytes()
        if self._memory is not None and need > self._memory.budget_bytes // SWITCH_SHARE:
            return self._refuse(f"per evaluation: the switchable graph needs ~{format_size(need)}, over 1/"
                                f"{SWITCH_SHARE} of the {format_size(self._memory.budget_bytes)} memory budget")
        self._session = open_session(self._runner, GraphHandoff(assemble(graph.model)))
        graph.model = onnx.ModelProto()  # handed off: the session holds the weights now
        self._graph = graph
        self.note = "switchable"
        return True

    def _refuse(self, why: str) -> bool:
        self._refused = True
        self.note = why
        return False


def _initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) or t.ByteSize() for t in model.graph.initializer)
