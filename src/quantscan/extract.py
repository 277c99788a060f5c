"""`quantscan extract`: the smallest model around a node that a vendor can run, and shrinking it.

Why: a compiler bug report needs a model the vendor can open and run in seconds, with the real input
values that trigger the problem, not a 20 MB network and "layer 57 looks wrong". Three tools:

- `extract(model, node, context=K)`: the node, its producers up to depth K and its consumers, widened
  to whole kernels (sites.py's grouping, a Conv's BatchNormalization included: a cut inside a fused
  Conv+activation gives a model that no longer fuses, so it no longer reproduces), as a valid model
  (checked with `onnx.checker.check_model(full_check=True)`). Cut tensors become typed
  graph inputs/outputs (from `onnx.shape_inference` with data propagation; where that leaves a type or
  rank unknown, from one run of the full model on data). Initializers and constant-only producers
  (Constant nodes holding Paddle weights, shape arithmetic on constants) are carried along and never
  count as context.
- `save_inputs(result, calib, out, samples=[...])`: the subgraph's real input tensors for up to N
  samples (the first ones, or a scan's worst ones), captured by running the full model with them
  exposed, written beside the extracted model as `.npz` (with the full model's values of the subgraph
  outputs in `.expected.npz`, so "reproduces" can be checked); `write_record` adds `<stem>.extract.json`
  saying which kernel and which finding of a run the model reproduces.
- `until_fails(model, predicate)`: shrink a node set while a user predicate keeps failing, by delta
  debugging (Zeller's ddmin). ddmin only ever moves to a set it has seen fail, so it needs no
  monotonicity along the graph (the reason bisection-style reducers stall), and it ends 1-minimal:
  removing any single node of the result makes the predicate pass. Every try is logged (set size,
  verdict, seconds) and reported to a progress callback; `command_predicate` turns a shell command
  with `{model}` into a predicate (exit code != 0 = fails).

Node names are the loader's: unnamed nodes are called `<op_type>_<index>` as in every quantscan table.

Each job is its own module (cut.py, repro.py, shrink.py); this one names their API in one place, as
`quantscan extract` and its users have always imported it.
"""

from __future__ import annotations

from quantscan.cut import Extractor, ExtractResult, UntypedError, companion_paths, extract, node_reads
from quantscan.repro import (
    DEFAULT_SAMPLES,
    SavedSamples,
    capture,
    finding_for,
    save_inputs,
    save_samples,
    worst_sample_indices,
    write_record,
)
from quantscan.shrink import Predicate, ShrinkResult, TryRecord, command_predicate, ddmin, until_fails

__all__ = [
    "DEFAULT_SAMPLES", "ExtractResult", "Extractor", "Predicate", "SavedSamples", "ShrinkResult", "TryRecord",
    "UntypedError", "capture", "command_predicate", "companion_paths", "ddmin", "extract", "finding_for",
    "node_reads", "save_inputs", "save_samples", "until_fails", "worst_sample_indices", "write_record",
]
