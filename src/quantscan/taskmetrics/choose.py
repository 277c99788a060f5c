"""Which task an output gets (`--task auto` detects it from the shape) and its accumulator.
"""

from __future__ import annotations

from collections.abc import Sequence

from quantscan.errors import UsageError
from quantscan.taskmetrics.base import TASKS, TaskAccumulator
from quantscan.taskmetrics.box import BoxAccumulator, box_layout
from quantscan.taskmetrics.classify import ClassifyAccumulator
from quantscan.taskmetrics.ctc import Charset, CtcAccumulator
from quantscan.taskmetrics.decoder import DecoderAccumulator, TokenTable, token_table
from quantscan.taskmetrics.heatmap import HeatmapAccumulator
from quantscan.taskmetrics.lm import LmAccumulator
from quantscan.taskmetrics.mask import MaskIouAccumulator


def detect_task(shape: Sequence[int], charset: Charset | None, classifier: bool,
                input_hw: tuple[int, int] | None = None, decoder: bool = False) -> str:
    """The task an output's shape and the files make clear; `none` when they do not.

    `decoder`: the output comes from an autoregressive Loop/Scan (`graph.decoders`). Its [N, T, C]
    scores are `decoder` when the charset fits `[sos] + characters + [eos]`, else `none` (the end token
    is unknown), never `ctc`, whose decode is not the model's.

    A [1, N, 5+C] output whose N is exactly the YOLOX cell count of the input (strides 8/16/32), a
    [1, 4+C, N] YOLOv8 head or a [1, 3N, 5+C] YOLOv5 head is a detection head (`box`, see `box_layout`);
    N alone would be ambiguous, so the input size must be known."""
    dims = [int(d) for d in shape]
    if decoder:
        return "decoder" if len(dims) == 3 and token_table(charset, dims[-1]) is not None else "none"
    if charset is not None and len(dims) == 3 and dims[-1] in (len(charset.symbols), len(charset.symbols) + 1):
        return "ctc"
    if classifier:
        return "classify"
    nchw_map = len(dims) == 4 and dims[1] == 1 and dims[2] > 1 and dims[3] > 1
    nhwc_map = len(dims) == 4 and dims[3] == 1 and dims[1] > 1 and dims[2] > 1  # TF exports' heatmaps
    if nchw_map or nhwc_map:
        return "mask"
    if box_layout(dims, input_hw) is not None:
        return "box"
    return "none"


def make_accumulator(task: str, charset: Charset | None, threshold: float,
                     input_hw: tuple[int, int] | None = None,
                     shape: Sequence[int] | None = None) -> TaskAccumulator | None:
    """One fresh accumulator for `task`; usage error when the task needs a file that is missing. A box
    head is decoded as its `shape` says (`box_layout`; YOLOX when the shape says nothing)."""
    if task == "classify":
        return ClassifyAccumulator()
    if task == "ctc":
        if charset is None:
            raise UsageError("--task ctc: expected a charset (charset.json/.txt beside the data, --charset, "
                             "or the model's 'character' metadata), found none")
        return CtcAccumulator(charset)
    if task == "decoder":
        return DecoderAccumulator(_token_table(charset, shape))
    if task == "mask":
        return MaskIouAccumulator(threshold)
    if task == "lm":  # never auto-detected: a decode step's logits look like a classifier's
        return LmAccumulator()
    if task == "heatmap":  # never auto-detected: a multi-channel map may as well be a feature map
        return HeatmapAccumulator()
    if task == "box":
        return BoxAccumulator(decode=box_layout(shape or (), input_hw) or "yolox", input_hw=input_hw)
    return None


def check_task(task: str) -> str:
    if task not in TASKS:
        raise UsageError(f"--task: expected one of {', '.join(TASKS)}, found {task!r}")
    return task


def _token_table(charset: Charset | None, shape: Sequence[int] | None) -> TokenTable:
    """The start/end tokens of a decoder output of `shape`; usage error when the charset does not fit."""
    classes = int(shape[-1]) if shape else 0
    table = token_table(charset, classes)
    if table is None:
        found = "no charset" if charset is None else f"{len(charset.symbols) - 1} characters"
        raise UsageError(f"--task decoder: expected a charset of C - 2 characters ([sos] + characters + [eos] "
                         f"= the output's C={classes} classes; --charset, charset.json/.txt beside the data, "
                         f"or the model's 'character' metadata), found {found}")
    return table
