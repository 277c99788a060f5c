"""Task metrics beside cosine: does the product still work after int8, not only how close the numbers are.

Why its own pure-numpy module: a score map at cosine 0.74 says nothing about whether a class, a string
or a mask survives; these figures do. Every accumulator keeps plain sums (`sums()`), so two of them
built on different batches or worker processes combine exactly with `merge()`, and the figures
(`results()`) are ratios of those sums. Reference (`ref`) is the FP32 output, `test` the int8 one.

Tasks: `classify` (top-1 / top-5 agreement, accuracy when labels exist), `ctc` (greedy-decoded string
agreement and character error rate for recognisers), `mask` (IoU of the thresholded score map for
segmentation and DB-style text detectors), `box` (matched-box agreement for detection heads, after a
documented decode and NMS written out in numpy), `none`; `--metric module:function` adds a plugin that
returns named sums per batch.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from quantscan.errors import UsageError
from quantscan.runfolder import parse_json

TASKS = ("auto", "classify", "ctc", "mask", "box", "none")
DEFAULT_MASK_THRESHOLD = 0.5
CHARSET_FILES = ("charset.json", "charset.txt")
LABEL_FILE = "labels.json"
YOLOX_STRIDES = (8, 16, 32)
"""YOLOX heads (and their [1, N, 5+C] exports without decode) predict on these three grids."""
DEFAULT_BOX_SCORE = 0.3
"""obj·cls score a box needs to count as a detection (YOLOX demo: 0.3 for display)."""
DEFAULT_NMS_IOU = 0.45
"""Class-wise NMS overlap, as YOLOX's multiclass_nms and ddddocr use."""
BOX_MATCH_IOU = 0.5
"""An int8 box agrees with an FP32 box of the same class when their IoU reaches this."""


class TaskAccumulator(Protocol):
    """What evaluate feeds per batch and reads at the end; `merge` adds another's sums exactly."""

    kind: str

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None: ...
    def merge(self, other: Any) -> None: ...
    def sums(self) -> dict[str, float]: ...
    def results(self) -> dict[str, float]: ...


def _group_figures(s: Mapping[str, float], group: str) -> dict[str, float]:
    """SQNR (dB) and cosine of one channel group from its sums (`BoxAccumulator._group_sums`)."""
    sxx, sdd, sxy, syy = (s.get(f"{group}_{k}", 0.0) for k in ("sxx", "sdd", "sxy", "syy"))
    sqnr = math.inf if sdd == 0 else (10 * math.log10(sxx / sdd) if sxx > 0 else -math.inf)
    cosine = sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float(sxx == syy == 0)
    return {"sqnr_db": sqnr, "cosine": cosine}


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def _add_sums(into: dict[str, float], other: Mapping[str, float]) -> None:
    for key, value in other.items():
        into[key] = into.get(key, 0.0) + float(value)


# --- classification ----------------------------------------------------------------------------------


def class_scores(a: np.ndarray) -> np.ndarray:
    """[N, C] from [N, C] or [N, C, 1, 1]: the layout classifiers emit."""
    arr = np.asarray(a)
    return arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(1, -1)


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores per row (order within the k does not matter here)."""
    k = min(k, scores.shape[1])
    return np.argpartition(-scores, k - 1, axis=1)[:, :k]


@dataclass
class ClassifyAccumulator:
    """Top-1 / top-5 agreement (FP32's top-1 among int8's top-k) and accuracy against labels."""

    kind: str = "classify"
    _s: dict[str, float] = field(default_factory=dict)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        r, t = class_scores(ref).astype(np.float64), class_scores(test).astype(np.float64)
        r1, t1 = np.argmax(r, axis=1), np.argmax(t, axis=1)
        t5 = _topk(t, 5)
        r5 = _topk(r, 5)
        sums = {"samples": r1.size, "top1_agree": np.count_nonzero(r1 == t1),
                "top5_agree": np.count_nonzero((t5 == r1[:, None]).any(axis=1))}
        if labels is not None:
            known = np.array([lab is not None for lab in labels], dtype=bool)
            truth = np.array([-1 if lab is None else int(lab) for lab in labels], dtype=np.int64)
            sums.update({
                "labelled": np.count_nonzero(known),
                "top1_correct": np.count_nonzero(known & (t1 == truth)),
                "fp32_top1_correct": np.count_nonzero(known & (r1 == truth)),
                "top5_correct": np.count_nonzero(known & (t5 == truth[:, None]).any(axis=1)),
                "fp32_top5_correct": np.count_nonzero(known & (r5 == truth[:, None]).any(axis=1)),
            })
        _add_sums(self._s, {k: float(v) for k, v in sums.items()})

    def merge(self, other: ClassifyAccumulator) -> None:
        _add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        out = {"top1_agreement": _ratio(s.get("top1_agree", 0), s.get("samples", 0)),
               "top5_agreement": _ratio(s.get("top5_agree", 0), s.get("samples", 0))}
        if s.get("labelled"):
            for key in ("top1", "top5"):
                out[f"{key}_accuracy"] = _ratio(s[f"{key}_correct"], s["labelled"])
                out[f"fp32_{key}_accuracy"] = _ratio(s[f"fp32_{key}_correct"], s["labelled"])
        return out


# --- CTC recognisers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Charset:
    """The class table of a CTC head: `symbols[i]` is class i's text, `blank` the class that emits nothing."""

    symbols: tuple[str, ...]
    blank: int = 0

    def fitted(self, classes: int) -> Charset:
        """PP-OCR keys files omit the trailing space class their models add (use_space_char)."""
        if len(self.symbols) + 1 == classes:
            return Charset((*self.symbols, " "), self.blank)
        return self


def greedy_decode(logits: np.ndarray, charset: Charset) -> list[str]:
    """[N, T, C] (or [T, C]) → strings: argmax per step, collapse repeats, drop blanks."""
    arr = np.asarray(logits)
    arr = arr[None] if arr.ndim == 2 else arr
    best = np.argmax(arr, axis=-1)
    texts = []
    for row in best:
        keep = np.ones(row.shape, dtype=bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != charset.blank
        texts.append("".join(charset.symbols[i] if i < len(charset.symbols) else "\ufffd" for i in row[keep]))
    return texts


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insert, delete, substitute all cost 1), one row at a time."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


@dataclass
class CtcAccumulator:
    """String agreement and character error rate of the int8 decode against the FP32 decode."""

    charset: Charset
    kind: str = "ctc"
    _s: dict[str, float] = field(default_factory=dict)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        charset = self.charset.fitted(np.shape(ref)[-1])
        r, t = greedy_decode(ref, charset), greedy_decode(test, charset)
        _add_sums(self._s, {
            "samples": float(len(r)),
            "string_agree": float(sum(a == b for a, b in zip(r, t, strict=True))),
            "char_errors": float(sum(edit_distance(a, b) for a, b in zip(r, t, strict=True))),
            "ref_chars": float(sum(len(a) for a in r)),
        })

    def merge(self, other: CtcAccumulator) -> None:
        _add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        return {"string_agreement": _ratio(s.get("string_agree", 0), s.get("samples", 0)),
                "cer": _ratio(s.get("char_errors", 0), s.get("ref_chars", 0))}


# --- masks / score maps ------------------------------------------------------------------------------


@dataclass
class MaskIouAccumulator:
    """IoU of `ref > threshold` and `test > threshold`: mean per sample (empty/empty counts 1) and pooled."""

    threshold: float = DEFAULT_MASK_THRESHOLD
    kind: str = "mask"
    _s: dict[str, float] = field(default_factory=dict)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        r = np.asarray(ref).reshape(np.shape(ref)[0], -1) > self.threshold
        t = np.asarray(test).reshape(np.shape(test)[0], -1) > self.threshold
        inter = np.count_nonzero(r & t, axis=1).astype(np.float64)
        union = np.count_nonzero(r | t, axis=1).astype(np.float64)
        per_sample = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
        _add_sums(self._s, {"samples": float(r.shape[0]), "iou_sum": float(per_sample.sum()),
                            "intersection": float(inter.sum()), "union": float(union.sum())})

    def merge(self, other: MaskIouAccumulator) -> None:
        _add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        pooled = _ratio(s.get("intersection", 0), s.get("union", 0)) if s.get("union") else 1.0
        return {"mask_iou": _ratio(s.get("iou_sum", 0), s.get("samples", 0)), "mask_iou_pooled": pooled,
                "mask_threshold": self.threshold}


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
    _s: dict[str, float] = field(default_factory=dict)

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
            _add_sums(self._s, {"samples": 1.0, "ref_boxes": float(len(rb)), "test_boxes": float(len(tb)),
                                "matched": float(len(matched)), "matched_iou": float(sum(m[2] for m in matched)),
                                "samples_same": float(same), **self._group_sums(r_head, t_head)})

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
        _add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        both = s.get("ref_boxes", 0) + s.get("test_boxes", 0)
        return {
            "box_agreement": 2 * s.get("matched", 0) / both if both else 1.0,
            "box_recall": _ratio(s.get("matched", 0), s.get("ref_boxes", 0)),
            "box_precision": _ratio(s.get("matched", 0), s.get("test_boxes", 0)),
            "box_matched_iou": _ratio(s.get("matched_iou", 0), s.get("matched", 0)),
            "box_sample_agreement": _ratio(s.get("samples_same", 0), s.get("samples", 0)),
            "fp32_boxes": s.get("ref_boxes", 0.0),
            **{f"{g}_{k}": v for g in ("coords", "scores") for k, v in _group_figures(s, g).items()},
            "box_score_threshold": self.score_threshold,
        }


# --- plugins -----------------------------------------------------------------------------------------

MetricFunction = Callable[[np.ndarray, np.ndarray], Mapping[str, float]]


@dataclass
class PluginAccumulator:
    """`--metric module:function`: the function returns named sums per batch; results are those sums."""

    function: MetricFunction
    name: str
    kind: str = "plugin"
    _s: dict[str, float] = field(default_factory=dict)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        got = self.function(np.asarray(ref), np.asarray(test))
        if not isinstance(got, Mapping) or not all(isinstance(k, str) for k in got):
            raise UsageError(f"--metric {self.name}: expected a dict of named sums, found {type(got).__name__}")
        _add_sums(self._s, got)

    def merge(self, other: PluginAccumulator) -> None:
        _add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        return dict(self._s)


def load_plugin(spec: str) -> PluginAccumulator:
    """`module:function` → an accumulator; a bad spec is a usage error, not a traceback."""
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise UsageError(f"--metric: expected module:function, found {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"--metric: cannot import module {module_name!r} ({exc})") from None
    function = getattr(module, func_name, None)
    if not callable(function):
        raise UsageError(f"--metric: expected a function {func_name!r} in {module_name}, found none")
    return PluginAccumulator(function, spec)


# --- files beside the data and auto-detection --------------------------------------------------------


def load_charset(path: Path) -> Charset:
    """charset.json (a list of characters for classes 1.., or {"characters": [...], "blank": k}) or a
    PP-OCR style .txt (one character per line, blank 0 before them)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--charset: cannot read {path} ({exc})") from None
    if Path(path).suffix.lower() != ".json":
        return _with_blank([line.rstrip("\r\n") for line in text.splitlines()], 0)
    try:
        data = parse_json(text)
    except ValueError:
        raise UsageError(f"--charset: expected JSON in {path}") from None
    if isinstance(data, Mapping):
        chars, blank = data.get("characters"), data.get("blank", 0)
    else:
        chars, blank = data, 0
    if not isinstance(chars, list) or not all(isinstance(c, str) for c in chars) or not isinstance(blank, int):
        raise UsageError(f'--charset: expected a list of strings or {{"characters": [...], "blank": 0}} in {path}')
    return _with_blank(chars, blank)


def charset_from_text(text: str) -> Charset:
    """A model's own `character` metadata (PP-OCR exports): one character per line, blank 0 before them."""
    return _with_blank(text.splitlines(), 0)


def _with_blank(chars: Sequence[str], blank: int) -> Charset:
    symbols = list(chars)
    symbols.insert(min(max(blank, 0), len(symbols)), "")
    return Charset(tuple(symbols), blank)


def find_charset(data_dir: Path | None) -> Path | None:
    """charset.json / charset.txt beside the evaluation data, if any."""
    if data_dir is None or not data_dir.is_dir():
        return None
    return next((data_dir / n for n in CHARSET_FILES if (data_dir / n).is_file()), None)


def detect_task(shape: Sequence[int], charset: Charset | None, classifier: bool,
                input_hw: tuple[int, int] | None = None) -> str:
    """The task an output's shape and the files make clear; `none` when they do not.

    A [1, N, 5+C] output whose N is exactly the YOLOX cell count of the input (strides 8/16/32), a
    [1, 4+C, N] YOLOv8 head or a [1, 3N, 5+C] YOLOv5 head is a detection head (`box`, see `box_layout`);
    N alone would be ambiguous, so the input size must be known."""
    dims = [int(d) for d in shape]
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
    if task == "mask":
        return MaskIouAccumulator(threshold)
    if task == "box":
        return BoxAccumulator(decode=box_layout(shape or (), input_hw) or "yolox", input_hw=input_hw)
    return None


def check_task(task: str) -> str:
    if task not in TASKS:
        raise UsageError(f"--task: expected one of {', '.join(TASKS)}, found {task!r}")
    return task
