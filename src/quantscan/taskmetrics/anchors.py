"""`anchors`: SSD/BlazeFace-style detectors whose box regressors and scores are separate outputs, decoded
outside the model (`--task anchors:boxes=NAME,scores=NAME,anchors=FILE.npy[,...]`).

Why not cosine: a [N, 896, 16] regressor at cosine 0.988 still drops one face in eight; what the
application reads is the detections after decode, threshold and NMS. Both sides go through the same
decode, written out here:
- anchors [A, 4] given (normalised x_center, y_center, w, h, MediaPipe's SsdAnchorsCalculator output):
  MediaPipe's TensorsToDetections decode, x = raw0 / sx · wa + xa, y = raw1 / sy · ha + ya,
  w = raw2 / sx · wa, h = raw3 / sy · ha, with sx, sy = the input's width and height in pixels (`scale=S`
  sets both): boxes in normalised image coordinates. Columns past 4 (BlazeFace's 6 keypoints) are not
  decoded.
- no anchors: the regressors are boxes already (`box=xyxy`, the default, or `box=cxcywh`).
Scores [N, A, 1] or [N, A]: through a sigmoid, as BlazeFace's logits need, unless the graph's last op on
them is a Sigmoid or Softmax (they are probabilities then; `sigmoid=yes|no` overrides). A detection is a
box whose score >= `score_threshold` (default 0.5), kept by single-class greedy NMS at `iou` (default 0.3;
MediaPipe blends overlapping boxes instead; plain NMS here treats FP32 and int8 alike).

FP32 and int8 detections are matched one-to-one, highest IoU first, at IoU >= 0.5 (BOX_MATCH_IOU):
`detections_kept` (matched), `detections_lost` (FP32 only), `detections_added` (int8 only),
`matched_iou` (mean over matched pairs), `score_change` (mean |Δ score| over matched pairs),
`detections_fp32`, `detection_recall` (kept / FP32) and `detection_agreement` (2·kept / (FP32 + int8)).
Per image (worst samples): the sum of its matched IoUs over its matched + lost + added detections (1 when
neither side detects anything).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantscan.errors import InternalError, UsageError
from quantscan.readers.arrays import read_npy
from quantscan.taskmetrics.base import add_sums, ratio
from quantscan.taskmetrics.box import BOX_MATCH_IOU, match_boxes, nms

DEFAULT_SCORE_THRESHOLD = 0.5
DEFAULT_ANCHOR_NMS_IOU = 0.3
BOX_FORMATS = ("xyxy", "cxcywh")


def anchor_head_pairs(outputs: Sequence[str], shapes: Mapping[str, Sequence[int]]) -> list[tuple[str, str]]:
    """(boxes, scores) output pairs shaped like an SSD/BlazeFace head: boxes [N, A, >=4] beside scores
    [N, A, 1] or [N, A] with the same A > 1. Why: such a head has no shape `--task auto` can decode (its
    anchors live outside the model), so its run speaks cosines unless the user is told the spec."""
    dims = {o: [int(d) for d in shapes.get(o, ())] for o in outputs}
    boxes = [o for o, d in dims.items() if len(d) == 3 and d[1] > 1 and d[2] >= 4]
    scores = [o for o, d in dims.items() if (len(d) == 2 or (len(d) == 3 and d[2] == 1)) and d[1] > 1]
    return [(b, s) for b in boxes for s in scores if b != s and dims[b][:2] == dims[s][:2]]


def anchor_head_hint(outputs: Sequence[str], shapes: Mapping[str, Sequence[int]]) -> str | None:
    """The note a run without an anchors spec gets when its outputs pair like an anchor head."""
    pairs = anchor_head_pairs(outputs, shapes)
    if not pairs:
        return None
    boxes, scores = pairs[0]
    count = shapes[boxes][1]
    return (f"outputs {boxes} {list(shapes[boxes])} and {scores} {list(shapes[scores])} look like an anchor "
            f"detector's head ({count} anchors, SSD/BlazeFace): their figures here are cosines; "
            f"`--task anchors:boxes={boxes},scores={scores},anchors=ANCHORS.npy` scores the detections the "
            f"application reads (anchors [{count}, 4]; without a file the regressors are read as boxes)")


def load_anchors(path: str | Path, count: int | None = None) -> np.ndarray:
    """[A, 4] float64 anchors from a .npy file; usage error when missing, mis-shaped or of another count."""
    file = Path(path)
    anchors = read_npy(file, "--task anchors")
    if anchors.ndim != 2 or anchors.shape[1] < 4 or (count is not None and anchors.shape[0] != count):
        want = f"[{count}, 4]" if count is not None else "[A, 4]"
        raise UsageError(f"--task anchors: expected anchors of shape {want} (x_center, y_center, w, h), "
                         f"found {list(anchors.shape)} in {file}")
    return np.asarray(anchors[:, :4], dtype=np.float64)


def decode_anchor_boxes(raw: np.ndarray, anchors: np.ndarray, scale_xy: tuple[float, float]) -> np.ndarray:
    """One image's [A, >=4] regressors → [A, 4] xyxy boxes, normalised (module docstring)."""
    r = np.asarray(raw, np.float64).reshape(anchors.shape[0], -1)
    sx, sy = scale_xy
    cx = r[:, 0] / sx * anchors[:, 2] + anchors[:, 0]
    cy = r[:, 1] / sy * anchors[:, 3] + anchors[:, 1]
    w = r[:, 2] / sx * anchors[:, 2]
    h = r[:, 3] / sy * anchors[:, 3]
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


def absolute_boxes(raw: np.ndarray, box: str) -> np.ndarray:
    """One image's [A, >=4] boxes already in box space → [A, 4] xyxy."""
    r = np.asarray(raw, np.float64).reshape(np.shape(raw)[0], -1)[:, :4]
    if box == "xyxy":
        return r
    return np.concatenate([r[:, :2] - r[:, 2:4] / 2, r[:, :2] + r[:, 2:4] / 2], axis=1)


def _agreement(s: dict[str, float]) -> float:
    """F1 of the matching, 2·kept / (FP32 + int8 detections): a lost face and an added one both count;
    1 when neither side detects anything (what `bisect --target detections=X` aims at)."""
    both = 2 * s.get("kept", 0.0) + s.get("lost", 0.0) + s.get("added", 0.0)
    return 2 * s.get("kept", 0.0) / both if both else 1.0


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, np.float64)))  # no overflow warning for wild logits


@dataclass
class AnchorAccumulator:
    """FP32 vs int8 detections of a split box/score head through one decode (module docstring).

    Registered under the boxes output; `reads` names the scores output it also needs."""

    scores_output: str
    anchors: np.ndarray | None = None
    scale_xy: tuple[float, float] = (1.0, 1.0)
    box: str = "xyxy"
    apply_sigmoid: bool = True
    score_threshold: float = DEFAULT_SCORE_THRESHOLD
    nms_iou: float = DEFAULT_ANCHOR_NMS_IOU
    match_iou: float = BOX_MATCH_IOU
    kind: str = "anchors"
    sample_metric: str = "image_matched_iou"
    higher_is_worse: bool = False
    _s: dict[str, float] = field(default_factory=dict)
    _samples: list[float] = field(default_factory=list)

    @property
    def reads(self) -> tuple[str, ...]:
        return (self.scores_output,)

    def detections(self, boxes: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One image's kept (xyxy boxes, scores)."""
        xyxy = (decode_anchor_boxes(boxes, self.anchors, self.scale_xy) if self.anchors is not None
                else absolute_boxes(boxes, self.box))
        s = np.asarray(scores, np.float64).reshape(xyxy.shape[0], -1)[:, 0]
        s = sigmoid(s) if self.apply_sigmoid else s
        hit = np.nonzero(np.isfinite(s) & (s >= self.score_threshold) & np.isfinite(xyxy).all(axis=1))[0]
        kept = hit[nms(xyxy[hit], s[hit], np.zeros(len(hit), np.int64), self.nms_iou)]
        return xyxy[kept], s[kept]

    def update_outputs(self, ref: Mapping[str, np.ndarray], test: Mapping[str, np.ndarray], boxes_output: str,
                       labels: Sequence[int | None] | None) -> None:
        """One batch: the boxes output and `scores_output` of FP32 (`ref`) and int8 (`test`)."""
        rb, rs, tb, ts = (np.asarray(v[k]) for v in (ref, test) for k in (boxes_output, self.scores_output))
        if rb.shape[:2] != rs.shape[:2] or rb.ndim != 3 or rb.shape[2] < 4:
            raise UsageError(f"--task anchors: expected boxes [N, A, >=4] and scores [N, A, 1] with the same A, "
                             f"found {list(rb.shape)} and {list(rs.shape)}")
        if self.anchors is not None and self.anchors.shape[0] != rb.shape[1]:
            raise UsageError(f"--task anchors: expected {rb.shape[1]} anchors (one per box), "
                             f"found {self.anchors.shape[0]}")
        for i in range(rb.shape[0]):
            self._image(*self.detections(rb[i], rs[i]), *self.detections(tb[i], ts[i]))

    def _image(self, rbox: np.ndarray, rscore: np.ndarray, tbox: np.ndarray, tscore: np.ndarray) -> None:
        matched = match_boxes(rbox, np.zeros(len(rbox)), tbox, np.zeros(len(tbox)), self.match_iou)
        kept, iou = len(matched), sum(m[2] for m in matched)
        lost, added = len(rbox) - kept, len(tbox) - kept
        add_sums(self._s, {
            "images": 1.0, "fp32": float(len(rbox)), "kept": float(kept), "lost": float(lost),
            "added": float(added), "iou_sum": float(iou),
            "score_change": float(sum(abs(rscore[i] - tscore[j]) for i, j, _ in matched)),
        })
        self._samples.append(iou / (kept + lost + added) if kept + lost + added else 1.0)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        raise InternalError("AnchorAccumulator reads two outputs: feed it with base.feed (update_outputs)")

    def take_samples(self) -> list[float]:
        """Per image of the batches fed since the last call: its matched IoU, lost/added counting 0."""
        out, self._samples = self._samples, []
        return out

    def merge(self, other: AnchorAccumulator) -> None:
        add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        return {
            "detections_kept": s.get("kept", 0.0),
            "detections_lost": s.get("lost", 0.0),
            "detections_added": s.get("added", 0.0),
            "matched_iou": ratio(s.get("iou_sum", 0.0), s.get("kept", 0.0)),
            "score_change": ratio(s.get("score_change", 0.0), s.get("kept", 0.0)),
            "detections_fp32": s.get("fp32", 0.0),
            "detection_recall": ratio(s.get("kept", 0.0), s.get("fp32", 0.0)) if s.get("fp32") else math.nan,
            "detection_agreement": _agreement(s),
            "score_threshold": self.score_threshold,
        }
