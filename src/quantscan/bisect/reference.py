"""Bisection evaluations against FP32 outputs computed once, not once per evaluation.

Why: gain.Evaluator builds FP32 + the mixed copy into one graph for every candidate, so each of the
10-40 evaluations of a bisection pays for a whole FP32 pass again (on a 640x640 detector a bisection
took more than 20 minutes). The FP32 headline outputs do not depend on the candidate: they are
computed in one pass over the evaluation set and fed back, per batch, as graph inputs next to the
batch; the evaluation graph is the mixed QDQ model plus the same in-graph reductions, so the figures
are those of gain.Evaluator (same reduction nodes on the same FP32 values).

That FP32 pass runs at ORT_ENABLE_ALL (runner.FP32_LEVEL): the graph has no Q/DQ node, so the
level only changes float32 rounding, and the figures equal gain.Evaluator's within it.

Kept in memory only when they fit a fraction of the memory plan's budget (headline outputs are
usually small: logits, a score map); otherwise every evaluation recomputes them as before.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
from onnx import helper

from quantscan import graph as qgraph
from quantscan.bisect.switched import SwitchedSession
from quantscan.graph.mixed import MixedBuilder, MixedSite
from quantscan.graph.qdq import activation_scale
from quantscan.runner import FP32_LEVEL, Runner, Session
from quantscan.scanning.gain import Evaluator, Measured, OutputPairs, worst_output
from quantscan.scanning.prepare import ScanContext
from quantscan.scanning.sweep import GraphHandoff, open_session, sweep

REF_SUFFIX = "@fp32ref"
CACHE_SHARE = 8
"""The cached FP32 outputs may take at most 1/CACHE_SHARE of the memory budget."""


class CachedReferenceEvaluator(Evaluator):
    """gain.Evaluator with the FP32 outputs of every batch computed on first use and reused."""

    def __init__(
        self, ctx: ScanContext, builder: MixedBuilder, key: str, runner: Runner | None = None
    ) -> None:
        super().__init__(ctx, builder, key, runner)
        self._reference: list[dict[str, np.ndarray]] | None = None
        self._cache_tried = False
        self.switch = SwitchedSession(builder, self.runner, ctx.data.memory)
        """The switchable session (bisect/switched.py), shared with the realisation twins."""
        self.candidate = CandidateSession()
        """The last candidate's per-evaluation session, shared with the realisation twins."""

    @property
    def tried(self) -> bool:
        """True once the FP32 outputs were computed or found too big (`cached` then says which)."""
        return self._cache_tried

    @property
    def cached(self) -> bool:
        """True once the FP32 outputs are held in memory (False: too big for the budget, recomputed)."""
        return self._reference is not None

    def evaluate(self, prec: Sequence[str]) -> Measured:
        reference = self._fp32_outputs()
        if reference is None:
            return super().evaluate(prec)
        started = time.perf_counter()
        if self.switch.wanted():
            selectors = self.switch.selectors(self.builder, prec, lambda model: self._assemble(model, reference))
            if selectors is not None:
                pairs, refs = self._pairs()
                self.switch.run(self._with_reference(reference), selectors,
                                lambda feeds, values: pairs.update({**feeds, **values}, refs))
                self.switch.timings.new.append(time.perf_counter() - started)
                return self._measured(pairs)
        measured = self._per_evaluation(prec, reference)
        self.switch.timings.old.append(time.perf_counter() - started)
        return measured

    def _per_evaluation(self, prec: Sequence[str], reference: list[dict[str, np.ndarray]]) -> Measured:
        """The assignment's own QDQ model and session (the switchable session's oracle, and its fallback),
        its activation scales fed as inputs, so the rounding realisations of one candidate share the session
        (`CandidateSession`)."""
        sites, plan = self.builder.plan(prec)
        scales = self.candidate.scales(prec, sites, plan)
        if scales is None:
            self.candidate.close()  # one session alive at a time, as before
            graph = self._assemble(qgraph.build_qdq_model(self.builder.proto, sites, plan), reference)
            scales = scales_as_inputs(graph, plan)
            # the weights are in `graph` now, handed off before onnxruntime builds its copy
            self.candidate.keep(prec, sites, plan, open_session(self.runner, GraphHandoff(graph)))
            del graph
        session = self.candidate.session
        assert session is not None
        pairs, refs = self._pairs()
        sweep(session, ({**feeds, **scales} for feeds in self._with_reference(reference)),
              lambda feeds, values: pairs.update({**feeds, **values}, refs))
        return self._measured(pairs)

    def _pairs(self) -> tuple[OutputPairs, dict[tuple[str, str], tuple[str, str]]]:
        """Fresh accumulators of (fed FP32, mixed) per headline output; their reduction nodes are named
        the same every time (Reducer numbers them in order), so they fit a graph assembled earlier."""
        pairs = OutputPairs(qgraph.Reducer(self.builder.opset), self.rank)
        refs: dict[tuple[str, str], tuple[str, str]] = {}
        for o in self.outputs:
            pairs.add((o, "q"), o + REF_SUFFIX, o, o, o in self.classifiers)
            refs[(o, "q")] = (o + REF_SUFFIX, o)
        return pairs, refs

    def _assemble(self, model: onnx.ModelProto, reference: list[dict[str, np.ndarray]]) -> onnx.ModelProto:
        """`model` with the output reductions and the FP32 outputs as inputs (reduced in place)."""
        pairs, _ = self._pairs()
        fed = [o + REF_SUFFIX for o in self.outputs]
        reduced = pairs.reducer.attach(model, [n for n in pairs.outputs() if n not in fed], in_place=True)
        return _with_inputs(reduced, reference[0], self.outputs)

    def _with_reference(self, reference: list[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
        batches = zip(self.ctx.data.eval_set.batches(self.ctx.data.batch_size), reference, strict=True)
        return ({**feeds, **{o + REF_SUFFIX: v for o, v in ref.items()}} for feeds, ref in batches)

    def _measured(self, pairs: OutputPairs) -> Measured:
        rows = {o: pairs.row((o, "q")) for o in self.outputs}
        output, worst = worst_output(rows, self.key)
        return Measured(rows, output, worst, {o: pairs.sample_sums((o, "q")) for o in self.outputs})

    def for_builder(self, builder: MixedBuilder) -> CachedReferenceEvaluator:
        """The same evaluator for another builder (a rounding realisation), sharing the FP32 outputs."""
        self._fp32_outputs()
        twin = copy.copy(self)
        twin.builder = builder
        return twin

    def _fp32_outputs(self) -> list[dict[str, np.ndarray]] | None:
        """One FP32 pass over the evaluation set, kept when it fits its share of the budget."""
        if self._cache_tried:
            return self._reference
        self._cache_tried = True
        memory = self.ctx.data.memory
        per_sample = sum(
            int(np.prod(self.ctx.graph.probe.shapes.get(o, (1,))[1:], dtype=np.int64)) * 4 for o in self.outputs
        )
        if memory is None or per_sample * self.ctx.data.eval_set.n_samples > memory.budget_bytes // CACHE_SHARE:
            return None
        session = self.runner.session(qgraph.expose(self.builder.proto, self.outputs), built=True,
                                      opt_level=FP32_LEVEL)  # FP32 only, a few outputs: NCHWc pays here
        reference: list[dict[str, np.ndarray]] = []
        sweep(session, self.ctx.data.eval_set.batches(self.ctx.data.batch_size), lambda feeds,
              values: reference.append(values),
              fetch=self.outputs)
        self._reference = reference
        return self._reference


class CandidateSession:
    """The per-evaluation session of the candidate measured last, which its rounding realisations share.

    Why: a realisation differs from realisation 0 only in its activation scales (gain.realised_builder), so
    the candidate's QDQ model, with those scales as inputs (`scales_as_inputs`), serves all of them: one
    onnxruntime session a candidate instead of one per realisation (building a session was about 3/4 of the
    evaluation's time outside onnxruntime's runs on PP-OCRv4 rec, RESULTS.md). A scale fed as an input is
    the value the initializer held, and the basic-level graph reads it as such (as the switchable graph's
    fed scales, bisect/switched.py): the figures are bit for bit the per-realisation models' (tests). A
    realisation whose plan differs otherwise (another zero point, weight or bias: quantize_static's int16
    bias follows the input scale) gets its own session."""

    def __init__(self) -> None:
        self.key: tuple[str, ...] | None = None
        self.plan: qgraph.QuantPlan | None = None
        self.sites: list[str] = []
        self.session: Session | None = None

    def scales(self, prec: Sequence[str], sites: Sequence[MixedSite],
               plan: qgraph.QuantPlan) -> dict[str, np.ndarray] | None:
        """The scale feeds of `plan` on the kept session, None when it was built for another plan shape."""
        if self.session is None or self.plan is None or tuple(prec) != self.key:
            return None
        if [s.node for s in sites] != self.sites or not _same_but_scales(self.plan, plan):
            return None
        return scale_feeds(plan)

    def keep(self, prec: Sequence[str], sites: Sequence[MixedSite], plan: qgraph.QuantPlan,
             session: Session) -> None:
        self.key, self.sites, self.plan, self.session = tuple(prec), [s.node for s in sites], plan, session

    def close(self) -> None:
        self.key, self.plan, self.session = None, None, None


def scale_feeds(plan: qgraph.QuantPlan) -> dict[str, np.ndarray]:
    """Each quantized activation's scale, by its initializer's name."""
    return {activation_scale(t): np.asarray(qp.scale, np.float32)
            for t, qp in plan.activations.items()}


def scales_as_inputs(model: onnx.ModelProto, plan: qgraph.QuantPlan) -> dict[str, np.ndarray]:
    """Turn `model`'s activation scale initializers into graph inputs (in place); their values, to feed."""
    feeds = scale_feeds(plan)
    kept = [t for t in model.graph.initializer if t.name not in feeds]
    present = {t.name for t in model.graph.initializer} & set(feeds)
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    for name in sorted(present):
        model.graph.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(feeds[name].shape)))
    return {k: feeds[k] for k in present}


def _same_but_scales(a: qgraph.QuantPlan, b: qgraph.QuantPlan) -> bool:
    """Whether two plans build the same QDQ model but for their activation scales' values."""
    if a.activations.keys() != b.activations.keys() or a.weights.keys() != b.weights.keys():
        return False
    for t, qa in a.activations.items():
        qb = b.activations[t]
        same_kind = (qa.axis, qa.block_size, qa.bits, np.shape(qa.scale)) == (qb.axis, qb.block_size, qb.bits,
                                                                               np.shape(qb.scale))
        if not same_kind or qa.zero_point.dtype != qb.zero_point.dtype or not np.array_equal(qa.zero_point,
                                                                                               qb.zero_point):
            return False
    return (all(a.weights[w] is b.weights[w] for w in a.weights) and a.biases.keys() == b.biases.keys()
            and all(a.biases[k] is b.biases[k] for k in a.biases))


def _with_inputs(model: onnx.ModelProto, sample: dict[str, np.ndarray], outputs: Sequence[str]) -> onnx.ModelProto:
    """Declare the fed FP32 outputs as graph inputs, every dim free (a short last batch, varying widths)."""
    for o in outputs:
        value = sample[o]
        dims = [f"{o}_d{i}" for i in range(value.ndim)]
        elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
        model.graph.input.append(helper.make_tensor_value_info(o + REF_SUFFIX, elem, dims))
    return model
