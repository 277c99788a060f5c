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
detection heads, after a documented decode and NMS written out in numpy), `keypoints` (landmark
displacement in input pixels, PCK, the worst keypoint), `anchors` (SSD/BlazeFace split box and score
heads decoded against their anchors: detections kept, lost, added, matched IoU), `presence` (one-number
outputs as decisions: the flip rate at a threshold), `lm` (a language model's decode step: next-token
agreement and the perplexity ratio on the true next tokens), `none`; `--task NAME:KEY=VALUE,...` (`spec`)
names the outputs and layout auto-detection cannot know; `--metric module:function` adds a plugin that
returns named sums per batch.

Accumulators that keep per-sample figures (`take_samples`, with `sample_metric` and `higher_is_worse`)
rank the worst samples by the task metric rather than by cosine.

One task per module: `base`, `classify`, `ctc`, `decoder`, `mask`, `heatmap`, `box`, `keypoints`,
`anchors`, `presence`, `lm`, `plugin`, `spec`, `choose`; `groups`
(`--channel-groups`: an output's channels measured per named group) goes beside any of them.
"""

from quantscan.taskmetrics.anchors import (
    AnchorAccumulator,
    anchor_head_hint,
    anchor_head_pairs,
    decode_anchor_boxes,
    load_anchors,
)
from quantscan.taskmetrics.base import LABEL_FILE, TASKS, TaskAccumulator, add_sums, feed, group_figures, ratio
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
from quantscan.taskmetrics.choose import check_task, detect_task, make_accumulator, spec_accumulator
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
from quantscan.taskmetrics.keypoints import KeypointAccumulator, keypoint_array
from quantscan.taskmetrics.lm import LmAccumulator, true_token_nll
from quantscan.taskmetrics.mask import DEFAULT_MASK_THRESHOLD, MaskIouAccumulator
from quantscan.taskmetrics.plugin import MetricFunction, PluginAccumulator, load_plugin
from quantscan.taskmetrics.presence import PresenceAccumulator, one_value_per_sample
from quantscan.taskmetrics.spec import TaskPlan, TaskSpec, parse_task_spec, task_plan

__all__ = [
    "AnchorAccumulator",
    "anchor_head_hint",
    "anchor_head_pairs",
    "KeypointAccumulator",
    "PresenceAccumulator",
    "TaskPlan",
    "TaskSpec",
    "decode_anchor_boxes",
    "feed",
    "keypoint_array",
    "load_anchors",
    "one_value_per_sample",
    "parse_task_spec",
    "spec_accumulator",
    "task_plan",
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
