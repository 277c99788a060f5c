"""Task metrics beside cosine: does the product still work after int8, not only how close the numbers are.

Why its own pure-numpy module: a score map at cosine 0.74 says nothing about whether a class, a string
or a mask survives; these figures do. Every accumulator keeps plain sums (`sums()`), so two of them
built on different batches or worker processes combine exactly with `merge()`, and the figures
(`results()`) are ratios of those sums. Reference (`ref`) is the FP32 output, `test` the int8 one.

Tasks: `classify` (top-1 / top-5 agreement, accuracy when labels exist), `ctc` (greedy-decoded string
agreement and character error rate for recognisers), `decoder` (the token sequences of an autoregressive
decoder, greedy until its end token, for a Loop that feeds its ArgMax back), `mask` (IoU of the
thresholded score map for segmentation and DB-style text detectors), `heatmap` (peak-location agreement
and per-channel figures of multi-channel score maps, NCHW or NHWC), `box` (matched-box agreement for
detection heads, after a documented decode and NMS written out in numpy), `lm` (a language model's
decode step: next-token agreement and the perplexity ratio on the true next tokens), `none`; `--metric
module:function` adds a plugin that returns named sums per batch.

One task per module: `base`, `classify`, `ctc`, `decoder`, `mask`, `heatmap`, `box`, `lm`, `plugin`, `choose`; `groups`
(`--channel-groups`: an output's channels measured per named group) goes beside any of them.
"""

from quantscan.taskmetrics.base import LABEL_FILE, TASKS, TaskAccumulator, add_sums, group_figures, ratio
from quantscan.taskmetrics.box import (
    BOX_MATCH_IOU,
    DEFAULT_BOX_SCORE,
    DEFAULT_NMS_IOU,
    YOLOX_STRIDES,
    BoxAccumulator,
    box_iou,
    box_layout,
    decode_yolox,
    match_boxes,
    nms,
    yolox_grid,
    yolox_grid_count,
)
from quantscan.taskmetrics.choose import check_task, detect_task, make_accumulator
from quantscan.taskmetrics.classify import ClassifyAccumulator, class_scores
from quantscan.taskmetrics.ctc import (
    CHARSET_FILES,
    Charset,
    CtcAccumulator,
    charset_from_text,
    edit_distance,
    find_charset,
    greedy_decode,
    levenshtein,
    load_charset,
)
from quantscan.taskmetrics.decoder import DecoderAccumulator, TokenTable, decode_tokens, token_table
from quantscan.taskmetrics.groups import ChannelGroupAccumulator, ChannelGroups, parse_channel_groups
from quantscan.taskmetrics.heatmap import HeatmapAccumulator, heatmap_layout
from quantscan.taskmetrics.lm import LmAccumulator, true_token_nll
from quantscan.taskmetrics.mask import DEFAULT_MASK_THRESHOLD, MaskIouAccumulator
from quantscan.taskmetrics.plugin import MetricFunction, PluginAccumulator, load_plugin

__all__ = [
    "BOX_MATCH_IOU",
    "BoxAccumulator",
    "CHARSET_FILES",
    "ChannelGroupAccumulator",
    "ChannelGroups",
    "Charset",
    "ClassifyAccumulator",
    "CtcAccumulator",
    "DecoderAccumulator",
    "DEFAULT_BOX_SCORE",
    "DEFAULT_MASK_THRESHOLD",
    "DEFAULT_NMS_IOU",
    "HeatmapAccumulator",
    "LABEL_FILE",
    "LmAccumulator",
    "MaskIouAccumulator",
    "MetricFunction",
    "PluginAccumulator",
    "TASKS",
    "TaskAccumulator",
    "TokenTable",
    "YOLOX_STRIDES",
    "add_sums",
    "box_iou",
    "box_layout",
    "charset_from_text",
    "check_task",
    "class_scores",
    "decode_tokens",
    "decode_yolox",
    "detect_task",
    "edit_distance",
    "find_charset",
    "greedy_decode",
    "heatmap_layout",
    "group_figures",
    "levenshtein",
    "load_charset",
    "load_plugin",
    "make_accumulator",
    "match_boxes",
    "nms",
    "parse_channel_groups",
    "ratio",
    "token_table",
    "true_token_nll",
    "yolox_grid",
    "yolox_grid_count",
]
