"""One verdict sentence per output in its task's terms (summary.md, the CLI's first screen).

Why: task.csv lists every figure, but a user reads "int8 loses 1 face in 8" or "landmarks move 11.9 px",
not eight numbers; the sentence picks the figures the application depends on. It is chosen by the keys
an output's task figures carry, so a run folder read back (run.json) gives the same sentence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping


def _g(value: float, digits: int = 4) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _keypoints(f: Mapping[str, float]) -> str:
    worst = _g(f.get("worst_keypoint_mean_px", math.nan), 3)
    if "worst_keypoint_row" in f:  # a planar grid: the point said where it sits
        which = f"grid point row {int(f['worst_keypoint_row'])}, column {int(f['worst_keypoint_column'])}"
        moved = "grid points move"
    else:
        which, moved = f"keypoint {int(f.get('worst_keypoint', -1))}", "landmarks move"
    text = (f"{moved} {_g(f['keypoint_mean_px'], 3)} px on average, "
            f"{_g(f.get('keypoint_max_px', math.nan), 3)} px at worst ({which} "
            f"moves {worst} px on average); {_g(100 * f.get('keypoint_pck', math.nan), 3)}% stay within "
            f"{_g(f.get('keypoint_pck_px', math.nan), 3)} px")
    flips = [f"{key} decisions flip on {_g(100 * f[f'keypoint_{key}_flips'], 3)}% of keypoints"
             for key in ("visibility", "presence") if f"keypoint_{key}_flips" in f]
    return text + ("; " + ", ".join(flips) if flips else "")


def _anchors(f: Mapping[str, float]) -> str:
    fp32 = int(f.get("detections_fp32", 0))
    return (f"of {fp32} FP32 detections int8 keeps {int(f['detections_kept'])}, loses {int(f['detections_lost'])} "
            f"and adds {int(f['detections_added'])}; matched boxes at IoU {_g(f.get('matched_iou', math.nan))}, "
            f"score change {_g(f.get('score_change', math.nan), 3)}")


def _presence(f: Mapping[str, float]) -> str:
    return (f"the decision at {_g(f.get('presence_threshold', math.nan), 3)} flips on "
            f"{_g(100 * f['presence_flip_rate'], 3)}% of samples ({int(f.get('presence_flips', 0))})")


def _decoder(f: Mapping[str, float]) -> str:
    return (f"{_g(100 * f['sequence_agreement'], 4)}% of sequences identical up to the end token, token error "
            f"rate {_g(100 * f.get('token_error_rate', math.nan), 3)}%, scores' cosine over the steps read "
            f"{_g(f.get('cosine_to_end', math.nan), 5)}")


def _ctc(f: Mapping[str, float]) -> str:
    return f"{_g(100 * f['string_agreement'], 4)}% of strings identical, CER {_g(100 * f.get('cer', math.nan), 3)}%"


def _classify(f: Mapping[str, float]) -> str:
    return f"top-1 agrees on {_g(100 * f['top1_agreement'], 4)}% of samples"


def _mask(f: Mapping[str, float]) -> str:
    return (f"mask IoU {_g(f['mask_iou'])} (mean over samples), {_g(f.get('mask_iou_worst', math.nan))} on the "
            "worst sample")


def _box(f: Mapping[str, float]) -> str:
    return (f"detections agree at box_agreement {_g(f['box_agreement'])}, matched IoU "
            f"{_g(f.get('box_matched_iou', math.nan))}")


def _heatmap(f: Mapping[str, float]) -> str:
    return f"peaks at the same pixel {_g(100 * f['peak_agreement'], 3)}% of the time"


VERDICTS: tuple[tuple[str, Callable[[Mapping[str, float]], str]], ...] = (
    ("keypoint_mean_px", _keypoints), ("detections_kept", _anchors), ("presence_flip_rate", _presence),
    ("sequence_agreement", _decoder), ("string_agreement", _ctc), ("top1_agreement", _classify),
    ("mask_iou", _mask), ("box_agreement", _box), ("peak_agreement", _heatmap),
)
"""The key that says which task measured an output, and its sentence."""


def task_verdict(figures: Mapping[str, float]) -> str | None:
    """The sentence for one output's task figures; None when no task measured it."""
    for key, sentence in VERDICTS:
        if key in figures:
            return sentence(figures)
    return None
