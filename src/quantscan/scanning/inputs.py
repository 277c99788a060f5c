"""The model's inputs as quantization sites: every NPU quantizes them, so they are measured like a site.

Why: a speaker encoder fed power mel frames puts 88% of its input values into uint8 code 0; with only
the input quantized the output cosine is 0.593 (0.989 at 16 bits), and the summary blamed the LSTM
after it ("intrinsic"). Per quantized float input (recurrent state inputs aside): its isolated figures
(QDQ(x) against x), where its codes go, the cause rules that apply to data (code waste, one-sided or
signed data, codes crowded by rare peaks), and the output when only this input is quantized, at the
scan's scheme and at 16 bits: the FP32 model run on the fake-quantized input, no extra graph.

The input is also a site of the scan (sites.input_sites): its layers.csv row gets its isolated and
cumulative figures and its gain_if_float from the scan's own passes, and its cause, reason and fix from
here (`with_input_findings`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from quantscan import metrics as qm
from quantscan import quant
from quantscan.diagnose import code_waste
from quantscan.diagnose.base import FixKind, SiteFacts, human
from quantscan.runner import FP32_LEVEL
from quantscan.scanning.prepare import ScanContext
from quantscan.scanning.site_result import SiteResult
from quantscan.scanning.sweep import Feeds, Runs, Values, sweep
from quantscan.sites import INPUT_OP

CROWDED_SHARE = 0.5
"""A most-used code holding at least this share of an input's values, while quantizing that input alone
costs the output at least CROWDED_LOSS of cosine, is an input whose range rare peaks set: most values
get one or two codes. (Its isolated SQNR can look fine: the peaks carry the energy.)"""
CROWDED_LOSS = 1e-3
MAX_SAMPLES = 64
"""Evaluation samples the inputs are measured on at most (three FP32 passes over them: the reference, the
8-bit and the 16-bit input), so the cost stays a small fixed share of a scan on a large evaluation set."""


@dataclass
class InputSite:
    """One quantized model input, measured as a site (run.json `inputs[*].quantization`)."""

    name: str
    scheme: str
    isolated_sqnr_db: float
    isolated_cosine: float
    top_code: int
    top_code_share: float
    codes_used: int
    output_cosine: float
    """Worst headline output's cosine with only this input quantized (the scan's scheme)."""
    output_cosine_16bit: float
    """The same with the input at 16 bits (uint16/int16 over the same range)."""
    samples: int
    """Evaluation samples measured (the first MAX_SAMPLES at most)."""
    cause: str
    reason: str
    fix: str

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in asdict(self).items()}


def _sixteen_bit(qp: quant.QParams) -> quant.QParams:
    """The 16-bit counterpart of an 8-bit activation over the same range (uint8 -> uint16, int8 -> int16)."""
    lo = float((qp.qmin - int(qp.zero_point)) * float(qp.scale))
    hi = float((qp.qmax - int(qp.zero_point)) * float(qp.scale))
    return quant.activation_qparams(lo, hi, "uint16" if qp.qmin == 0 else "int16")


def measure_inputs(ctx: ScanContext) -> list[InputSite]:
    """Every quantized float input of the prepared model, measured over the first MAX_SAMPLES evaluation
    samples: the FP32 graph runs once per batch (the reference) and once per input and width with that
    input alone fake-quantized."""
    states = set(ctx.opts.state.values())
    quantized, floats = ctx.quant.plan.activations, ctx.graph.probe.float_tensors
    names = [i.name for i in ctx.graph.prepared.proto.graph.input
             if i.name in quantized and i.name not in states and i.name in floats]
    if not names:
        return []
    outputs = ctx.headline_outputs()
    # a plain FP32 graph with few outputs, fed fake-quantized arrays: FP32_LEVEL's fast kernels (runner.py)
    session = ctx.runner.session(ctx.graph.prepared.proto, built=True, opt_level=FP32_LEVEL)
    inputs = _InputPass(ctx.quant.plan.activations, names, outputs, session)
    sweep(session, _first_samples(ctx.data.eval_set.batches(ctx.data.batch_size), MAX_SAMPLES), inputs.update,
          fetch=outputs)
    return [_site(ctx.quant.plan.activations[n], n, inputs.iso[n], inputs.codes[n], inputs.span[n], inputs.out[(n, 8)],
                  inputs.out[(n, 16)], inputs.seen) for n in names]


def _first_samples(batches: Iterable[Feeds], limit: int) -> Iterator[Feeds]:
    """The batches until `limit` samples have been given (the batch that crosses it included)."""
    seen = 0
    for feeds in batches:
        if seen >= limit:
            return
        first = next(iter(feeds.values()), None)
        seen += int(first.shape[0]) if first is not None and first.ndim else 1
        yield feeds


class _InputPass:
    """The accumulator of `measure_inputs`: per input, its own error, its codes, its span, and the output
    error with it alone quantized at 8 and 16 bits."""

    def __init__(self, plan: Mapping[str, quant.QParams], names: Sequence[str], outputs: Sequence[str],
                 session: Runs) -> None:
        self.plan, self.names, self.outputs, self.session = plan, names, outputs, session
        self.iso = {n: qm.ErrorAccumulator() for n in names}
        self.out = {(n, bits): {o: qm.ErrorAccumulator() for o in outputs} for n in names for bits in (8, 16)}
        self.codes = {n: np.zeros(plan[n].qmax - plan[n].qmin + 1, np.int64) for n in names}
        self.span = {n: [math.inf, -math.inf] for n in names}
        self.seen = 0

    def update(self, feeds: Feeds, ref: Values) -> None:
        first = next(iter(feeds.values()), None)
        self.seen += int(first.shape[0]) if first is not None and first.ndim else 1
        for n in self.names:
            if n not in feeds:
                continue
            qp = self.plan[n]
            q = quant.quantize(feeds[n], qp)
            self.codes[n] += np.bincount((q.astype(np.int64) - qp.qmin).ravel(), minlength=self.codes[n].size)
            self.iso[n].update(feeds[n], quant.dequantize(q, qp))
            finite = feeds[n][np.isfinite(feeds[n])]
            if finite.size:
                self.span[n] = [min(self.span[n][0], float(finite.min())), max(self.span[n][1], float(finite.max()))]
            for bits, p in ((8, qp), (16, _sixteen_bit(qp))):
                got = self.session.run({**feeds, n: quant.fake_quant(feeds[n], p)}, self.outputs)
                for o in self.outputs:
                    self.out[(n, bits)][o].update(ref[o], got[o])


def _site(
    qp: quant.QParams, name: str, iso: qm.ErrorAccumulator, codes: np.ndarray, span: list[float],
    out8: dict[str, qm.ErrorAccumulator], out16: dict[str, qm.ErrorAccumulator], samples: int,
) -> InputSite:
    """The figures of one input and its cause."""
    total = int(codes.sum())
    top = int(np.argmax(codes)) if total else 0
    share = float(codes[top]) / total if total else math.nan
    alone = min((float(a.cosine) for a in out8.values()), default=math.nan)
    cause, reason, fix = _cause(name, qp, 1.0 - alone, top + qp.qmin, share, span)
    return InputSite(
        name=name, scheme=str(qp.dtype), isolated_sqnr_db=float(iso.sqnr_db), isolated_cosine=float(iso.cosine),
        top_code=top + qp.qmin, top_code_share=share, codes_used=int(np.count_nonzero(codes)),
        output_cosine=alone, output_cosine_16bit=min((float(a.cosine) for a in out16.values()), default=math.nan),
        samples=samples, cause=cause, reason=reason, fix=fix,
    )


def _cause(
    name: str, qp: quant.QParams, loss: float, top: int, share: float, span: list[float]
) -> tuple[str, str, str]:
    """(cause, reason, fix) for an input (`loss`: output cosine lost with it alone quantized): codes crowded
    by rare peaks, else the code-waste rule, else ok. The fixes are the ones an input has: fix the
    preprocessing, feed it at 16 bits, or keep it float (a kernel's fixes, such as a rewrite, do not apply)."""
    if share >= CROWDED_SHARE and loss >= CROWDED_LOSS:
        return ("crowded-codes",
                f"{human(100 * share)}% of its values land in code {top}: rare peaks set the range "
                "(heavy-tailed data such as a power spectrum)",
                "fix the preprocessing: feed it compressed (log or dB, as a front end would) and normalised; "
                f"or {WIDER}")
    facts = SiteFacts(node=name, op_type="Input", output=name, lo=span[0], hi=span[1], scale=float(qp.scale),
                      zero_point=int(qp.zero_point), qmin=qp.qmin, qmax=qp.qmax)
    finding = code_waste.check(facts)
    if finding is not None:
        how = _PREPROCESS.get(finding.fix.kind, finding.fix.how)
        return finding.cause.value, finding.reason, f"fix the preprocessing: {how}; or {WIDER}"
    return "ok", f"its most used code holds {human(100 * share)}% of its values", ""


WIDER = "feed int16 (quantize this input at 16 bits) or keep the input float"
"""The fixes every input has besides its preprocessing (bisect plans either: `--fallback int16|float`)."""
_PREPROCESS = {
    FixKind.SCHEME: "normalise it to the range the input scale covers (centre one-sided data, e.g. subtract the "
                    "mean, or give the input an asymmetric scale)",
    FixKind.CALIBRATION: "calibrate on inputs preprocessed exactly as deployed (the data is narrower than its range)",
}


def with_input_findings(results: Sequence[SiteResult], measured: Sequence[InputSite]) -> list[SiteResult]:
    """`results` with each model input's row (sites.input_sites) diagnosed by its measurement here: the
    cause (crowded codes, code waste), a reason with the output cosine it costs alone, and the input's
    fixes. An input whose figures show nothing wrong keeps the rows' own diagnosis."""
    by_name = {m.name: m for m in measured}
    out = []
    for r in results:
        m = by_name.get(r.output)
        if r.op_type != INPUT_OP or m is None or m.cause == "ok":
            out.append(r)
            continue
        reason = (f"{m.reason}; quantized alone ({m.scheme}) it takes the output cosine to "
                  f"{m.output_cosine:.5f} ({m.output_cosine_16bit:.5f} at 16 bits)")
        diagnosis = replace(r.diagnosis, text=f"{m.cause}: {reason} -> {m.fix}", cause=m.cause, fix=m.fix)
        out.append(replace(r, diagnosis=diagnosis, cause="intrinsic", reason=reason))
    return out
