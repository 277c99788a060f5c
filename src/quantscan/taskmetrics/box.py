"""`box`: matched-box agreement for detection heads, after a decode and NMS written out in numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscan.errors import UsageError
from quantscan.taskmetrics.base import add_sums, group_figures, ratio

YOLOX_STRIDES = (8, 16, 32)
DEFAULT_BOX_SCORE = 0.3
DEFAULT_NMS_IOU = 0.45
BOX_MATCH_IOU = 0.5


# --- detection boxes ---------------------------------------------------------------------------------


def yolox_grid(anchors: int, input_hw: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """Cell offsets [N, 2] (x, y) and strides [N, 1] of a YOLOX head with `anchors` predictions.

    The input size comes from the model when known; otherwise a square input is assumed, whose side
    follows from N = 21·(S/32)². None when N does not fit the three strides.
    """
    if input_hw is None:
        side = 32 * math.isqrt(anchors // 21)
        input_hw = (side, side)
    h, w = input_hw
    grids, strides = [], []
    for stride in YOLOX_STRIDES:
        gh, gw = h // stride, w // stride
        xv, yv = np.meshgrid(np.arange(gw), np.arange(gh))
        grids.append(np.stack((xv, yv), axis=-1).reshape(-1, 2))
        strides.append(np.full((gh * gw, 1), stride))
    if sum(len(g) for g in grids) != anchors:
        return None
    return np.concatenate(grids).astype(np.float64), np.concatenate(strides).astype(np.float64)


def box_layout(shape: Sequence[int], input_hw: tuple[int, int] | None) -> str | None:
    """How a [N, D1, D2] detection head is laid out, from its sizes and the input's:

    - "yolox": [N, A, 5+C], one raw prediction per cell of strides 8/16/32 (A = the cell count);
    - "yolov8": [N, 4+C, A], channels first, decoded centre boxes in pixels and class scores, no
      objectness (YOLOv8/v11 exports, the most common detector export);
    - "xywh": [N, 3·A, 5+C], three anchors per cell, decoded centre boxes, objectness (YOLOv5/v7).
    None when no layout fits (the input size is needed: a count alone is ambiguous)."""
    dims = [int(d) for d in shape]
    if len(dims) != 3 or input_hw is None:
        return None
    cells = yolox_grid_count(input_hw)
    if dims[2] == cells and dims[1] >= 5:
        return "yolov8"
    if dims[1] == cells and dims[2] >= 6:
        return "yolox"
    if dims[1] == 3 * cells and dims[2] >= 6:
        return "xywh"
    return None


def yolox_grid_count(input_hw: tuple[int, int]) -> int:
    """Cells of the stride 8/16/32 grids over an input of (H, W)."""
    return sum((input_hw[0] // s) * (input_hw[1] // s) for s in YOLOX_STRIDES)


def decode_yolox(pred: np.ndarray, grid: np.ndarray, strides: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One sample's [N, 5+C] raw head → (xyxy boxes, scores, classes), as YOLOX's demo_postprocess:
    centre = (offset + cell)·stride, size = exp(log-size)·stride, score = objectness·class score."""
    p = np.asarray(pred, dtype=np.float64)
    centre = (p[:, :2] + grid) * strides
    size = np.exp(np.minimum(p[:, 2:4], 30.0)) * strides  # exp of an int8-wrecked logit stays finite
    cls_scores = p[:, 5:] if p.shape[1] > 5 else np.ones((p.shape[0], 1))
    classes = np.argmax(cls_scores, axis=1)
    scores = p[:, 4] * cls_scores[np.arange(p.shape[0]), classes]
    return np.concatenate([centre - size / 2, centre + size / 2], axis=1), scores, classes


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[n, m] IoU of xyxy boxes (zero-area boxes overlap nothing)."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float) -> np.ndarray:
    """Greedy class-wise NMS: indices kept, best score first."""
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    suppressed = np.zeros(len(order), dtype=bool)
    overlaps = box_iou(boxes[order], boxes[order])
    same = classes[order][:, None] == classes[order][None, :]
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(int(order[i]))
        suppressed |= (overlaps[i] > iou) & same[i]
    return np.array(keep, dtype=np.int64)


def match_boxes(ref: np.ndarray, ref_cls: np.ndarray, test: np.ndarray, test_cls: np.ndarray,
                threshold: float = BOX_MATCH_IOU) -> list[tuple[int, int, float]]:
    """Greedy one-to-one matching, highest IoU first, same class, IoU ≥ threshold: (ref i, test j, IoU)."""
    iou = box_iou(ref, test) * (np.asarray(ref_cls)[:, None] == np.asarray(test_cls)[None, :])
    pairs = [(float(iou[i, j]), i, j) for i, j in zip(*np.nonzero(iou >= threshold), strict=True)]
    used_r: set[int] = set()
    used_t: set[int] = set()
    matched = []
    for value, i, j in sorted(pairs, reverse=True):
        if i not in used_r and j not in used_t:
            used_r.add(i)
            used_t.add(j)
            matched.append((int(i), int(j), value))
    return matched


@dataclass
class BoxAccumulator:
    """Detections of the int8 head against the FP32 head's, both through the same decode and NMS.

    `decode` "yolox": [N, A, 5+C] raw YOLOX head (cell offsets, log sizes, objectness, class scores,
    strides 8/16/32); "xywh": already decoded [N, A, 5+C] centre boxes (YOLOv5-style exports);
    "yolov8": [N, 4+C, A] decoded centre boxes and class scores, channels first, no objectness (see
    `box_layout`). A box is a detection when objectness·class score (the class score alone for
    "yolov8") ≥ `score_threshold`; `box_agreement` is the F1 of the one-to-one matching (IoU ≥ 0.5,
    same class): 1 when both sides detect nothing.
    """

    decode: str = "yolox"
    input_hw: tuple[int, int] | None = None
    score_threshold: float = DEFAULT_BOX_SCORE
    nms_iou: float = DEFAULT_NMS_IOU
    match_iou: float = BOX_MATCH_IOU
    kind: str = "box"
    sample_metric: str = "box_agreement"
    higher_is_worse: bool = False
    _s: dict[str, float] = field(default_factory=dict)
    _samples: list[float] = field(default_factory=list)

    def detections(self, head: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One sample's [A, 5+C] head → its kept (boxes, scores, classes)."""
        if self.decode == "yolov8":
            pred = np.asarray(head, np.float64).reshape(np.shape(head)[-2], -1).T  # [A, 4+C]
            cls_scores = pred[:, 4:]
            classes = np.argmax(cls_scores, axis=1)
            scores = cls_scores[np.arange(pred.shape[0]), classes]
            boxes = np.concatenate([pred[:, :2] - pred[:, 2:4] / 2, pred[:, :2] + pred[:, 2:4] / 2], axis=1)
            return self._kept(boxes, scores, classes)
        pred = np.asarray(head, np.float64).reshape(-1, np.shape(head)[-1])
        if self.decode == "yolox":
            grid = yolox_grid(pred.shape[0], self.input_hw)
            if grid is None:
                raise UsageError(f"--task box: expected a YOLOX head whose {pred.shape[0]} predictions fit "
                                 f"strides 8/16/32 of the input, found none that do")
            boxes, scores, classes = decode_yolox(pred, *grid)
        else:
            cls_scores = pred[:, 5:] if pred.shape[1] > 5 else np.ones((pred.shape[0], 1))
            classes = np.argmax(cls_scores, axis=1)
            scores = pred[:, 4] * cls_scores[np.arange(pred.shape[0]), classes]
            boxes = np.concatenate([pred[:, :2] - pred[:, 2:4] / 2, pred[:, :2] + pred[:, 2:4] / 2], axis=1)
        return self._kept(boxes, scores, classes)

    def _kept(
        self, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The detections above the score threshold that survive NMS."""
        hit = np.nonzero(np.isfinite(scores) & (scores >= self.score_threshold))[0]
        kept = hit[nms(boxes[hit], scores[hit], classes[hit], self.nms_iou)]
        return boxes[kept], scores[kept], classes[kept]

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        r_all, t_all = np.asarray(ref), np.asarray(test)
        r_all = r_all[None] if r_all.ndim == 2 else r_all
        t_all = t_all[None] if t_all.ndim == 2 else t_all
        for r_head, t_head in zip(r_all, t_all, strict=True):
            rb, _, rc = self.detections(r_head)
            tb, _, tc = self.detections(t_head)
            matched = match_boxes(rb, rc, tb, tc, self.match_iou)
            same = len(matched) == len(rb) == len(tb)
            add_sums(self._s, {"samples": 1.0, "ref_boxes": float(len(rb)), "test_boxes": float(len(tb)),
                                "matched": float(len(matched)), "matched_iou": float(sum(m[2] for m in matched)),
                                "samples_same": float(same), **self._group_sums(r_head, t_head)})
            both = len(rb) + len(tb)
            self._samples.append(2 * len(matched) / both if both else 1.0)

    def take_samples(self) -> list[float]:
        """Per image of the batches fed since the last call: its box_agreement (worst samples by it)."""
        out, self._samples = self._samples, []
        return out

    def _group_sums(self, ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
        """Σx², Σ(x−y)², Σxy, Σy² of the head's box coordinates and of its scores, apart.

        Why: one head pools 4 coordinates in pixels with scores in [0, 1]; the pixels carry the energy, so
        the pooled cosine (0.99945 on a YOLOv8 head) hides scores at 14.5 dB."""
        r, t = np.asarray(ref, np.float64), np.asarray(test, np.float64)
        if self.decode == "yolov8":
            r, t = r.reshape(r.shape[-2], -1).T, t.reshape(t.shape[-2], -1).T
        r, t = r.reshape(-1, r.shape[-1]), t.reshape(-1, t.shape[-1])
        out: dict[str, float] = {}
        for group, cols in (("coords", slice(0, 4)), ("scores", slice(4, None))):
            x, y = r[:, cols], t[:, cols]
            ok = np.isfinite(x) & np.isfinite(y)
            x, y = np.where(ok, x, 0.0), np.where(ok, y, 0.0)
            out.update({f"{group}_sxx": float((x * x).sum()), f"{group}_sdd": float(((x - y) ** 2).sum()),
                        f"{group}_sxy": float((x * y).sum()), f"{group}_syy": float((y * y).sum())})
        return out

    def merge(self, other: BoxAccumulator) -> None:
        add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        both = s.get("ref_boxes", 0) + s.get("test_boxes", 0)
        return {
            "box_agreement": 2 * s.get("matched", 0) / both if both else 1.0,
            "box_recall": ratio(s.get("matched", 0), s.get("ref_boxes", 0)),
            "box_precision": ratio(s.get("matched", 0), s.get("test_boxes", 0)),
            "box_matched_iou": ratio(s.get("matched_iou", 0), s.get("matched", 0)),
            "box_sample_agreement": ratio(s.get("samples_same", 0), s.get("samples", 0)),
            "fp32_boxes": s.get("ref_boxes", 0.0),
            **{f"{g}_{k}": v for g in ("coords", "scores") for k, v in group_figures(s, g).items()},
            "box_score_threshold": self.score_threshold,
        }
