"""The one batch loop every pass over samples goes through.

A pass opens a session on a graph quantscan built, feeds it batches and hands each batch's outputs to
an accumulator; nothing is kept between batches unless the accumulator keeps it. The calibration pass,
the analysis pass, the gain graph, one configuration's evaluation (bisect), the deployed check and
bisect's FP32 reference run here (and through them the `--workers` shards and the scan's gain
ranking), so the staging order, the progress bar and its closing are written once.

Why `GraphHandoff`: a graph's weights should exist once when onnxruntime builds its own copy. The pass
takes the graph from its builder, stages it (the weights leave the serialized model, runner.stage) and
the proto is gone before the session is built; a caller that kept a reference to the proto would hold
every weight twice at the peak (bisect on BERT-base: two weight sets).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np
import onnx

from quantscan.runner import Runner, Session
from quantscan.scanning.options import ProgressFactory, no_progress

Feeds = Mapping[str, np.ndarray]
Values = dict[str, np.ndarray]
Accumulate = Callable[[Feeds, Values], None]
"""What a pass does with one batch: its feeds and the outputs the session returned."""


class Runs(Protocol):
    """A session the loop can feed: `runner.Session` and `runner.SegmentedSession`."""

    def run(self, feeds: Feeds, outputs: Sequence[str] | None = None) -> Values: ...


class GraphHandoff:
    """A built graph handed to the pass that runs it: `take()` gives it away and keeps no reference."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self._model: onnx.ModelProto | None = model

    def take(self) -> onnx.ModelProto:
        model, self._model = self._model, None
        if model is None:
            raise RuntimeError("GraphHandoff.take: the graph was already taken")
        return model


def open_session(
    runner: Runner, graph: GraphHandoff, *, opt_level: str | None = None, ordered: bool = False
) -> Session:
    """Stage the graph and build its session; the proto is dropped once staged (see the module docstring).

    `ordered=True` runs the nodes in the graph's own order (analysis graphs are interleaved so each
    activation dies right after its reductions); `opt_level` overrides the runner's level."""
    staged = runner.stage(graph.take())
    return runner.session(staged, opt_level=opt_level, built=True, ordered=ordered)


def sweep(
    session: Runs,
    batches: Iterable[Feeds],
    accumulate: Accumulate,
    *,
    progress: ProgressFactory = no_progress,
    label: str | None = None,
    total: int | None = None,
    fetch: Sequence[str] | Callable[[], Sequence[str] | None] | None = None,
) -> int:
    """Run `session` on every batch and hand the outputs to `accumulate`; returns the number of batches.

    `fetch` names the outputs to compute (default all), or is asked before each batch (the analysis pass
    fetches its histogram codes only for the first samples). A progress bar labelled `label` (none
    without a label) counts batches out of `total` and is closed whatever happens."""
    bar = progress(label, total) if label is not None else no_progress("", total)
    count = 0
    try:
        for feeds in batches:
            names = fetch() if callable(fetch) else fetch
            accumulate(feeds, session.run(feeds, names))
            count += 1
            bar.update(1)
    finally:
        bar.close()
    return count
