"""The search of a bisection: all-int8 first, the output gains, the session, then rounds until the machine ends.

The session file is rewritten atomically after the gains and after every step, so a kill or Ctrl-C loses at
most the step in flight. Candidates are measured by the search's judge (bisect/judges.py), one round at a
time (bisect/speculate.py): the driver never asks which judge it is.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantscan.bisect.external import BuildPool, Toolchain
from quantscan.bisect.judge import Judge
from quantscan.bisect.realise import Judged, SampleSplit
from quantscan.bisect.request import BisectHooks, BisectRequest
from quantscan.bisect.session import BisectSession, machine_for
from quantscan.bisect.speculate import Spare, SpeculativeFeed
from quantscan.bisect.state import Bisector, SessionFileError, Step, StepCallback, Target
from quantscan.bisect.targets import gain_key
from quantscan.columns import Col
from quantscan.graph.mixed import MixedBuilder
from quantscan.model import LoadedModel
from quantscan.scanning.gain import GainResult, compute_gain, sensitivity_order
from quantscan.scanning.options import ProgressFactory
from quantscan.scanning.prepare import ScanContext


@dataclass
class Search:
    """What the search and the plan are made from (`bisect_model` prepares it, `run` runs it)."""

    ctx: ScanContext
    loaded: LoadedModel
    identity: dict[str, Any]
    request: BisectRequest
    split: SampleSplit
    builder: MixedBuilder
    judge: Judge
    pool: BuildPool | None
    """The toolchain's builds (a toolchain judge's, and `--verify`'s), None without a toolchain."""

    @property
    def target(self) -> Target:
        assert self.request.target is not None
        return self.request.target

    @property
    def chain(self) -> Toolchain | None:
        return self.pool.chain if self.pool is not None else None


def run(search: Search, stored: BisectSession | None, path: Path | None, hooks: BisectHooks,
        deadline: float | None) -> tuple[BisectSession, SpeculativeFeed]:
    """Gains (for a new session), the session, the search in rounds; the finished session and feed."""
    request, judge = search.request, search.judge
    measured: dict[tuple[str, ...], tuple[Judged, float]] = {}
    marks = (request.keep_float, request.force_quant)
    if stored is None:
        met = request.mode == "search" and not request.keep_float and _all_int8_meets(search, measured)
        judge.release()  # its sessions are rebuilt after the gain graph's session is gone
        gains = (None if request.mode == "first_bad" or met else
                 compute_gain(search.split.search, search.builder, key=gain_key(search.target),
                              loss_if_only=request.loss_if_only, progress=hooks.progress))
        stored, marks = new_session(search, gains), ((), ())  # a new session holds its marks in its options
        stored.options.update(request.recorded())
    machine = machine_for(stored)
    if any(marks):
        machine.mark(*marks)
        stored.events = list(machine.events)
    save(stored, path, machine)
    feed = SpeculativeFeed(machine, judge.round, judge.width)
    feed.spare.update({sites: Spare(j.value, j.metrics(), seconds) for sites, (j, seconds) in measured.items()})
    session = stored

    def noted(step: Step, machine: Bisector) -> None:
        session.options.update(judge.note())  # saved with the next step: a search stopped by a cap still says
        if hooks.on_step is not None:
            hooks.on_step(step, machine)

    drive(feed, stored, path, hooks.progress, noted, deadline)
    stored.options.update(judge.note())
    save(stored, path, feed.machine, feed.spare)
    judge.release()
    return stored, feed


def _all_int8_meets(search: Search, measured: dict[tuple[str, ...], tuple[Judged, float]]) -> bool:
    """Measure all-int8 before the output gains; True when it already meets the target.

    Why: the gains cost one evaluation per site or more (minutes on a ViT) and answer nothing when the
    plan is empty. The measurement is kept in `measured` for the search's own all-int8 step, so it is
    not run twice.
    """
    t0 = time.perf_counter()
    base = search.judge.judge(search.builder.precisions(()))
    measured[()] = (base, time.perf_counter() - t0)
    return search.target.met(base.value)


def new_session(search: Search, gains: GainResult | None) -> BisectSession:
    """A session for a new search: identities, the request and scan options, the sites, the order, the gains."""
    ctx, request = search.ctx, search.request
    derived = set(search.builder.derived_sites)  # not a choice (a model input following its readers)
    sites = [
        {
            Col.NODE: s.node,
            Col.OUTPUT: s.output,
            Col.ORDER: ctx.graph.order.get(s.node, -1 if s.is_input else k),  # a model input: before every node
            Col.OP_TYPE: s.op_type,
            Col.KERNEL: s.kernel,
        }
        for k, s in enumerate(ctx.graph.sites)
        if s.node not in derived
    ]
    rounding = request.rounding
    order = (
        sensitivity_order(gains.table, gain_key(search.target), broad=rounding.z if rounding.realisations > 1 else 0.0)
        if gains is not None
        else [str(s[Col.NODE]) for s in sorted(sites, key=lambda s: int(str(s[Col.ORDER])))]
    )
    order = [n for n in order if n not in derived]
    opts = request.session_options(ctx.headline_outputs(), ctx.opts)
    gain_rows = gains.table.to_dict("records") if gains is not None else []
    session = BisectSession(str(search.loaded.path.resolve()), search.loaded.sha256, search.identity, opts, sites,
                            order, gain_rows)
    if gains is not None:
        session.options["gain_seconds"] = round(gains.seconds, 4)
        session.options["gain_work_ratio"] = round(gains.work_ratio, 4)
    return session


def save(session: BisectSession, path: Path | None, machine: Bisector,
         spare: Mapping[tuple[str, ...], Spare] | None = None) -> None:
    session.events = list(machine.events)
    if spare is not None:
        session.spare = [got.as_dict(sites) for sites, got in spare.items()]
    session.status = machine.outcome.status if machine.outcome is not None else "running"
    if path is not None:
        session.save(path)


def drive(feed: SpeculativeFeed, session: BisectSession, path: Path | None, progress: ProgressFactory,
          on_step: StepCallback | None, deadline: float | None = None) -> None:
    """Measure rounds until the machine is done, feeding it each round's results in its own order; the
    session is saved after every step, with the results measured ahead (`spare`) beside the events. Spare
    results a resumed session holds are fed first, never measured again."""
    stored = _stored_spare(session, path)
    feed.spare.update(stored)
    bar = progress("bisecting", None)
    assert feed.counts is not None
    try:
        while (cand := feed.machine.next()) is not None:
            if deadline is not None and time.perf_counter() >= deadline:
                feed.machine.stop_early()
                save(session, path, feed.machine, feed.spare)
                break
            if cand.sites not in feed.spare:
                try:
                    feed.round()
                finally:
                    save(session, path, feed.machine, feed.spare)
            for step in feed.feed():
                feed.counts.reused += step.sites in stored
                save(session, path, feed.machine, feed.spare)
                bar.update(1)
                if on_step is not None:
                    on_step(step, feed.machine)
    finally:
        bar.close()


def _stored_spare(session: BisectSession, path: Path | None) -> dict[tuple[str, ...], Spare]:
    """The sets a session measured ahead; one that cannot be read is a damaged file (one line, exit 2)."""
    try:
        return dict(Spare.from_dict(raw) for raw in session.spare)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SessionFileError(f"session {path} is damaged: expected spare sets of the form quantscan writes, "
                               f"found {type(exc).__name__}: {exc}") from None


def steps_of(machine: Bisector) -> list[Step]:
    return [e for e in machine.events if isinstance(e, Step)]

