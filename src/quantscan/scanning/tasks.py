"""Which task metrics each headline output gets, and their table (task.csv).

Why its own module: choosing the task needs the options, the output shapes, the files beside the
evaluation data and the model's metadata; evaluate only feeds the accumulators this returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
import pandas as pd

from quantscan import taskmetrics as tm
from quantscan.calib import CalibSet
from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.graph.decoders import decoder_outputs
from quantscan.scanning.options import ScanOptions

CHARSET_METADATA_KEY = "character"
"""PP-OCR exports carry their CTC dictionary in metadata_props['character'] (one character per line)."""


def resolve_charset(proto: onnx.ModelProto, eval_set: CalibSet, opts: ScanOptions) -> tm.Charset | None:
    """--charset, else charset.json/.txt beside the evaluation data, else the model's own metadata."""
    if opts.charset is not None:
        return tm.load_charset(Path(opts.charset))
    beside = tm.find_charset(Path(eval_set.source) if eval_set.source else None)
    if beside is not None:
        return tm.load_charset(beside)
    meta = {p.key: p.value for p in proto.metadata_props}
    return tm.charset_from_text(meta[CHARSET_METADATA_KEY]) if CHARSET_METADATA_KEY in meta else None


def image_size(input_shapes: Mapping[str, Sequence[int]]) -> tuple[int, int] | None:
    """(H, W) of the model's image input, the first rank-4 input (NCHW when axis 1 holds 1-4 channels,
    else NHWC): what a detection head's grid is laid over. None without an image input."""
    for dims in input_shapes.values():
        if len(dims) == 4:
            nchw = 1 <= int(dims[1]) <= 4
            h, w = (dims[2], dims[3]) if nchw else (dims[1], dims[2])
            return int(h), int(w)
    return None


def task_accumulators(
    proto: onnx.ModelProto,
    outputs: Sequence[str],
    shapes: Mapping[str, Sequence[int]],
    classifiers: set[str],
    eval_set: CalibSet,
    opts: ScanOptions,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, list[tm.TaskAccumulator]]:
    """Per headline output: its `--task` spec's accumulator, else the plain or auto-detected task's, then
    any --metric plugins. An output a spec reads beside its own (an anchor head's scores) gets none."""
    plugins = [opts.metric] if isinstance(opts.metric, str) else list(opts.metric)  # API: one spec or many
    groups = _channel_groups(opts, outputs)
    plan = tm.task_plan(opts.task)
    default = plan.default
    if default.kind == "none" and not plan.bound and not plugins and not groups:
        return {}
    _check_named(plan, outputs)
    kinds = {default.kind, *(s.kind for s in plan.bound)}
    charset = resolve_charset(proto, eval_set, opts) if kinds & {"auto", "ctc", "decoder"} else None
    hw = image_size(input_shapes or {})
    producers = output_producers(proto.graph, outputs)
    decoders = decoder_outputs(proto.graph, outputs) if default.kind == "auto" else {}
    tokens = _default_outputs(default, outputs, shapes, charset)
    found: dict[str, list[tm.TaskAccumulator]] = {}
    for name in outputs:
        shape = list(shapes.get(name, ()))
        spec = plan.spec_for(name)
        accs: list[tm.TaskAccumulator] = []
        if spec is not None:
            built = tm.spec_accumulator(spec, charset, opts.mask_threshold, hw, shape, producers)
        elif name in plan.claimed():
            built = None
        elif default.kind == "auto":
            task = tm.detect_task(shape, charset, name in classifiers, hw, name in decoders, producers.get(name, ""))
            built = tm.make_accumulator(task, charset, opts.mask_threshold, hw, shape)
        elif tokens is not None and name not in tokens:
            built = None
        else:
            built = tm.spec_accumulator(default, charset, opts.mask_threshold, hw, shape, producers)
        if built is not None:
            accs.append(built)
        accs.extend(tm.load_plugin(spec) for spec in plugins)
        accs.extend(tm.ChannelGroupAccumulator(g) for g in groups.get(name, []))
        if accs:
            found[name] = accs
    return found


def check_task_specs(proto: onnx.ModelProto, outputs: Sequence[str], shapes: Mapping[str, Sequence[int]],
                     input_shapes: Mapping[str, Sequence[int]], opts: ScanOptions) -> None:
    """Refuse a `--task` spec that cannot fit the model (an output it names that is not measured, a
    keypoint layout the shape does not divide, an anchor file of another count) before the calibration
    pass, not after it. Specs that need the evaluation data's charset are checked where they are built."""
    plan = tm.task_plan(opts.task)
    if not plan.bound:
        return
    _check_named(plan, outputs)
    hw, producers = image_size(input_shapes), output_producers(proto.graph, outputs)
    for spec in plan.bound:
        if spec.kind in ("keypoints", "anchors", "presence") or (spec.kind == "decoder" and "eos" in spec.params):
            tm.spec_accumulator(spec, None, opts.mask_threshold, hw, list(shapes.get(spec.outputs()[0], ())),
                                producers)


def task_hint(outputs: Sequence[str], shapes: Mapping[str, Sequence[int]], opts: ScanOptions) -> str | None:
    """A note for a run whose outputs have a task `--task auto` cannot decode on its own: today an anchor
    head (boxes and scores as separate outputs), when no spec names those outputs already."""
    plan = tm.task_plan(opts.task)
    if plan.default.kind != "auto":
        return None
    free = [o for o in outputs if o not in plan.claimed()]
    return tm.anchor_head_hint(free, shapes)


SHAPE_ONLY_OPS = frozenset({"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose"})
"""Ops that only move values: the op an output "comes from" is the first one behind them."""


def output_producers(graph: onnx.GraphProto, outputs: Sequence[str]) -> dict[str, str]:
    """Per output, the op type that computes its values (behind shape-only ops); "" for a graph input or
    an initializer. Why: a Sigmoid behind an [N, 1] output makes it a probability (presence at 0.5), and
    an anchor head's scores from a Sigmoid need none applied."""
    made = {o: node for node in graph.node for o in node.output}
    found: dict[str, str] = {}
    for name in outputs:
        node = made.get(name)
        while node is not None and node.op_type in SHAPE_ONLY_OPS and node.input:
            node = made.get(node.input[0])
        found[name] = node.op_type if node is not None else ""
    return found


def _check_named(plan: tm.TaskPlan, outputs: Sequence[str]) -> None:
    """Every output a spec names must be measured: a headline output (`--output` chooses them)."""
    missing = sorted(plan.claimed() - set(outputs))
    if missing:
        raise UsageError(f"--task: expected outputs among the headline outputs ({', '.join(outputs)}; "
                         f"--output NAME, repeatable, chooses them), found {', '.join(missing)}")


def _default_outputs(default: tm.TaskSpec, outputs: Sequence[str], shapes: Mapping[str, Sequence[int]],
                     charset: tm.Charset | None) -> set[str] | None:
    """The outputs a plain `--task decoder` measures (None: every output its task applies to). With the
    charset's table, those whose class axis fits it; with `bos=`/`eos=`, the [N, T, C] outputs with more
    than `eos` classes."""
    if default.kind != "decoder":
        return None
    if "eos" in default.params:
        eos = default.integer("eos") or 0
        return {o for o in outputs if len(shapes.get(o, ())) == 3 and int(shapes[o][-1]) > eos}
    return _token_outputs(outputs, shapes, charset) or None


def _token_outputs(outputs: Sequence[str], shapes: Mapping[str, Sequence[int]], charset: tm.Charset | None) -> set[str]:
    """The outputs whose class axis fits the charset's token table: `--task decoder` measures those and
    leaves a decoder's other outputs alone (SLANet's [N, 501, 4] boxes beside its token scores); with
    none fitting, every output is tried and the first refuses with the reason."""
    return {name for name in outputs
            if len(shapes.get(name, ())) == 3 and tm.token_table(charset, int(shapes[name][-1])) is not None}


def decoder_notes(proto: onnx.ModelProto, outputs: Sequence[str], shapes: Mapping[str, Sequence[int]],
                  eval_set: CalibSet, opts: ScanOptions) -> list[str]:
    """One line per headline output that an autoregressive decoder emits, saying which task `--task auto`
    gave it and why: the CTC-looking charset of such a model must not pass unremarked, and an output left
    without a task metric says what would give it one."""
    if tm.task_plan(opts.task).default.kind != "auto":
        return []
    decoders = decoder_outputs(proto.graph, outputs)
    charset = resolve_charset(proto, eval_set, opts) if decoders else None
    notes = []
    for name, loop in decoders.items():
        dims = [int(d) for d in shapes.get(name, ())]
        head = f"output '{name}' comes from an autoregressive decoder ({loop} feeds its ArgMax back)"
        if tm.detect_task(dims, charset, False, None, True) == "decoder":
            notes.append(f"{head}: task decoder (tokens until the end token, not CTC's collapse of repeats)")
        elif charset is None:
            notes.append(f"{head}: no task metric, no charset names its end token (--task decoder:output="
                         f"{name},bos=K,eos=K names the tokens; --charset with C - 2 characters, for [sos] + "
                         "characters + [eos], gives one too)")
        else:
            notes.append(f"{head}: no task metric, its last axis ({dims[-1] if dims else '?'}) is not "
                         f"[sos] + {len(charset.symbols) - 1} characters + [eos]")
    return notes


def _channel_groups(opts: ScanOptions, outputs: Sequence[str]) -> dict[str, list[tm.ChannelGroups]]:
    """`--channel-groups` per headline output; one naming another output is refused (say `--output`)."""
    found: dict[str, list[tm.ChannelGroups]] = {}
    for spec in [opts.channel_groups] if isinstance(opts.channel_groups, str) else opts.channel_groups:
        parsed = tm.parse_channel_groups(spec)
        if parsed.output not in outputs:
            raise UsageError(f"--channel-groups: expected a headline output ({', '.join(outputs)}; --output NAME "
                             f"chooses), found {parsed.output!r}")
        found.setdefault(parsed.output, []).append(parsed)
    return found


def task_results(accs: Mapping[str, Sequence[tm.TaskAccumulator]]) -> dict[str, dict[str, float]]:
    """Per output, every figure its accumulators give (plugins prefixed by their spec)."""
    results: dict[str, dict[str, float]] = {}
    for name, items in accs.items():
        row: dict[str, float] = {}
        for acc in items:
            prefix = f"{getattr(acc, 'name', 'plugin')}:" if acc.kind == "plugin" else ""
            row.update({prefix + k: v for k, v in acc.results().items()})
        results[name] = row
    return results


def task_table(accs: Mapping[str, Sequence[tm.TaskAccumulator]]) -> pd.DataFrame:
    """task.csv: one row per (output, task, metric) so any task's figures fit one table."""
    rows = [
        {Col.OUTPUT: name, "task": acc.kind, "metric": key, "value": value}
        for name, items in accs.items()
        for acc in items
        for key, value in acc.results().items()
    ]
    return pd.DataFrame(rows, columns=[Col.OUTPUT, "task", "metric", "value"])
