"""Which task an output gets (`--task auto` detects it from the shape) and its accumulator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from quantscan.errors import UsageError
from quantscan.taskmetrics.anchors import (
    BOX_FORMATS,
    DEFAULT_ANCHOR_NMS_IOU,
    DEFAULT_SCORE_THRESHOLD,
    AnchorAccumulator,
    load_anchors,
)
from quantscan.taskmetrics.base import TASKS, TaskAccumulator
from quantscan.taskmetrics.box import BoxAccumulator, box_layout
from quantscan.taskmetrics.classify import ClassifyAccumulator
from quantscan.taskmetrics.ctc import Charset, CtcAccumulator
from quantscan.taskmetrics.decoder import DecoderAccumulator, TokenTable, token_table
from quantscan.taskmetrics.heatmap import HeatmapAccumulator
from quantscan.taskmetrics.keypoints import DEFAULT_PCK_PX, KeypointAccumulator, keypoint_array
from quantscan.taskmetrics.lm import LmAccumulator
from quantscan.taskmetrics.mask import MaskIouAccumulator
from quantscan.taskmetrics.presence import (
    LOGIT_THRESHOLD,
    PROBABILITY_THRESHOLD,
    PresenceAccumulator,
    one_value_per_sample,
)
from quantscan.taskmetrics.spec import TaskSpec, parse_task_spec


def detect_task(shape: Sequence[int], charset: Charset | None, classifier: bool,
                input_hw: tuple[int, int] | None = None, decoder: bool = False, producer: str = "") -> str:
    """The task an output's shape and the files make clear; `none` when they do not.

    `decoder`: the output comes from an autoregressive Loop/Scan (`graph.decoders`). Its [N, T, C]
    scores are `decoder` when the charset fits `[sos] + characters + [eos]`, else `none` (the end token
    is unknown), never `ctc`, whose decode is not the model's.

    A [1, N, 5+C] output whose N is exactly the YOLOX cell count of the input (strides 8/16/32), a
    [1, 4+C, N] YOLOv8 head or a [1, 3N, 5+C] YOLOv5 head is a detection head (`box`, see `box_layout`);
    N alone would be ambiguous, so the input size must be known.

    One value per sample from a Sigmoid (`producer`, the op behind shape-only ops) is `presence`: a
    decision at 0.5, never a cosine of one number."""
    dims = [int(d) for d in shape]
    if producer == "Sigmoid" and one_value_per_sample(dims):
        return "presence"
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
    if task == "presence":
        return PresenceAccumulator()
    return None


def spec_accumulator(spec: TaskSpec, charset: Charset | None, threshold: float,
                     input_hw: tuple[int, int] | None, shape: Sequence[int] | None,
                     producers: Mapping[str, str]) -> TaskAccumulator | None:
    """The accumulator of one `--task` spec (`taskmetrics.spec`); `producers`: per output, the op behind
    its shape-only ops (a Sigmoid makes a presence score a probability, an anchor head's scores too)."""
    output = spec.outputs()[0] if spec.outputs() else ""
    if spec.kind == "keypoints":
        count, dims, layout = spec.integer("count"), spec.integer("dims"), spec.params.get("layout")
        if shape and all(int(d) > 0 for d in shape):  # a layout that cannot fit is refused now
            keypoint_array(np.zeros([1, *shape[1:]]), count, dims, layout)
        scale = spec.number("scale", 1.0) or 1.0
        return KeypointAccumulator(count, dims, spec.number("scale_x", scale) or scale,
                                   spec.number("pck", DEFAULT_PCK_PX) or DEFAULT_PCK_PX, layout=layout,
                                   scale_y=spec.number("scale_y", scale) or scale)
    if spec.kind == "presence":
        probability = producers.get(output) == "Sigmoid"
        default = PROBABILITY_THRESHOLD if probability else LOGIT_THRESHOLD
        return PresenceAccumulator(spec.number("threshold", default) or 0.0)
    if spec.kind == "anchors":
        return _anchor_accumulator(spec, input_hw, shape, producers)
    if spec.kind == "decoder" and "eos" in spec.params:
        eos = spec.integer("eos")
        bos = spec.integer("bos", -1)
        classes = int(shape[-1]) if shape else 0
        if eos is None or bos is None or (classes and max(eos, bos) >= classes):
            raise UsageError(f"--task decoder: expected bos and eos among the output's {classes} classes, "
                             f"found bos={spec.params.get('bos')}, eos={spec.params.get('eos')}")
        return DecoderAccumulator(TokenTable(bos, eos, first_end_step=0))
    return make_accumulator(spec.kind, charset, threshold, input_hw, shape)


def _anchor_accumulator(spec: TaskSpec, input_hw: tuple[int, int] | None, shape: Sequence[int] | None,
                        producers: Mapping[str, str]) -> AnchorAccumulator:
    """`anchors:boxes=..,scores=..[,anchors=FILE.npy]`: anchors and the pixel scale of the regressors."""
    boxes, scores = spec.outputs()
    count = int(shape[1]) if shape and len(shape) >= 2 else None
    anchors = load_anchors(spec.params["anchors"], count) if "anchors" in spec.params else None
    scale = spec.number("scale")
    if scale is not None:
        scale_xy = (scale, scale)
    elif input_hw is not None:
        scale_xy = (float(input_hw[1]), float(input_hw[0]))
    elif anchors is not None:
        raise UsageError("--task anchors: expected scale=S (input pixels the regressors are divided by), "
                         "found no image input to take it from")
    else:
        scale_xy = (1.0, 1.0)
    box = spec.params.get("box", "xyxy")
    if box not in BOX_FORMATS:
        raise UsageError(f"--task anchors: expected box= one of {', '.join(BOX_FORMATS)}, found {box!r}")
    flag = spec.params.get("sigmoid", "auto")
    if flag not in ("auto", "yes", "no"):
        raise UsageError(f"--task anchors: expected sigmoid=yes|no, found {flag!r}")
    probabilities = producers.get(scores) in ("Sigmoid", "Softmax")
    return AnchorAccumulator(
        scores, anchors, scale_xy, box, apply_sigmoid=flag == "yes" or (flag == "auto" and not probabilities),
        score_threshold=spec.number("score_threshold", DEFAULT_SCORE_THRESHOLD) or 0.0,
        nms_iou=spec.number("iou", DEFAULT_ANCHOR_NMS_IOU) or 0.0)


def check_task(task: str) -> str:
    """`task` when it is a task name or a valid `NAME:KEY=VALUE,...` spec (`taskmetrics.spec`)."""
    if task not in TASKS:
        parse_task_spec(task)
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
