"""`--task NAME[:KEY=VALUE,...]`: the declarative task spec, for what auto-detection cannot know.

Why a spec and not more flags: a keypoint head's layout ([N, K*d] or [N, K, d], which columns are
visibility and presence), an SSD head's anchors, a decoder's start and end tokens are facts about the
model that no shape says; one spec per head names its output(s) and those facts, and every output a
spec does not name keeps auto-detection. `--task` may be given more than once (one spec per head).

Spellings (CONTRACT.md; external checks use them):
- `keypoints:output=NAME,count=K,dims=D,scale=S[,pck=P][,layout=interleaved|planar][,scale_x=SX,scale_y=SY]`
- `anchors:boxes=NAME,scores=NAME[,anchors=FILE.npy][,score_threshold=T,iou=I,scale=S,box=xyxy|cxcywh]`
- `decoder:output=NAME,bos=K,eos=K`
- `presence:output=NAME[,threshold=T]` (alias `scalar`)
- any plain task name (`classify`, `ctc`, `decoder`, `mask`, `heatmap`, `box`, `none`, `auto`), which
  applies to every output a spec does not name, as `--task NAME` always did; `NAME:output=OUT` binds
  it to one output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from quantscan.errors import UsageError
from quantscan.taskmetrics.base import TASKS
from quantscan.taskmetrics.keypoints import LAYOUTS

SPEC_KEYS: dict[str, tuple[str, ...]] = {
    "keypoints": ("output", "count", "dims", "scale", "pck", "layout", "scale_x", "scale_y"),
    "anchors": ("boxes", "scores", "anchors", "score_threshold", "iou", "scale", "box", "sigmoid"),
    "decoder": ("output", "bos", "eos"),
    "presence": ("output", "threshold"),
}
"""The keys each spec'd task takes; plain tasks take `output` only."""
REQUIRED_KEYS = {"keypoints": ("output",), "anchors": ("boxes", "scores"), "presence": ("output",)}
ALIASES = {"scalar": "presence", "landmarks": "keypoints", "ssd": "anchors"}
SPEC_TASKS = tuple(SPEC_KEYS)
"""Tasks that only a spec (or, for presence, auto-detection) gives: never the default for every output."""


@dataclass(frozen=True)
class TaskSpec:
    """One parsed `--task` value: the task and its KEY=VALUE facts."""

    kind: str
    params: Mapping[str, str] = field(default_factory=dict)

    def outputs(self) -> tuple[str, ...]:
        """The graph outputs this spec binds (the first is where its figures land)."""
        keys = ("boxes", "scores") if self.kind == "anchors" else ("output",)
        return tuple(self.params[k] for k in keys if k in self.params)

    def number(self, key: str, default: float | None = None) -> float | None:
        """A numeric parameter; usage error naming the spec when it is not a number."""
        raw = self.params.get(key)
        if raw is None:
            return default
        try:
            return float(raw)
        except ValueError:
            raise UsageError(f"--task {self.kind}: expected a number for {key}, found {raw!r}") from None

    def integer(self, key: str, default: int | None = None) -> int | None:
        """A non-negative integer parameter (a count, a token id)."""
        value = self.number(key)
        if value is None:
            return default
        if value != int(value) or value < 0:
            raise UsageError(f"--task {self.kind}: expected a non-negative integer for {key}, "
                             f"found {self.params[key]!r}")
        return int(value)


def parse_task_spec(text: str) -> TaskSpec:
    """`NAME[:KEY=VALUE,...]` → TaskSpec; usage error naming what was expected."""
    name, _, body = text.strip().partition(":")
    kind = ALIASES.get(name.strip(), name.strip())
    known = tuple(t for t in TASKS) + SPEC_TASKS
    if kind not in known:
        raise UsageError(f"--task: expected one of {', '.join(known)} (optionally NAME:KEY=VALUE,...), found {text!r}")
    params: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"--task {kind}: expected KEY=VALUE pairs separated by commas, found {part!r}")
        params[key.strip()] = value.strip()
    allowed = SPEC_KEYS.get(kind, ("output",))
    unknown = [k for k in params if k not in allowed]
    if unknown:
        raise UsageError(f"--task {kind}: expected keys {', '.join(allowed)}, found {', '.join(unknown)}")
    missing = [k for k in REQUIRED_KEYS.get(kind, ()) if k not in params]
    if missing:
        raise UsageError(f"--task {kind}: expected {', '.join(k + '=...' for k in missing)}, found {text!r}")
    spec = TaskSpec(kind, params)
    for key in ("count", "dims", "bos", "eos"):
        spec.integer(key)
    layout = params.get("layout")
    if kind == "keypoints" and layout is not None and layout not in LAYOUTS:
        raise UsageError(f"--task keypoints: expected layout={' or layout='.join(LAYOUTS)}, found {layout!r}")
    for key in ("scale", "pck", "scale_x", "scale_y"):
        number = spec.number(key)
        if number is not None and not number > 0:
            raise UsageError(f"--task {kind}: expected a positive {key}, found {params[key]!r}")
    for key in ("score_threshold", "iou"):
        number = spec.number(key)
        if number is not None and not 0 <= number <= 1:
            raise UsageError(f"--task {kind}: expected {key} in [0, 1], found {params[key]!r}")
    spec.number("threshold")
    return spec


@dataclass(frozen=True)
class TaskPlan:
    """Every `--task` value, parsed: the specs bound to outputs, and the task of the other outputs."""

    bound: tuple[TaskSpec, ...]
    default: TaskSpec
    """The task of every output no spec names: the plain `--task NAME` (`decoder:bos=2,eos=3` keeps its
    tokens), else `auto`."""

    def spec_for(self, output: str) -> TaskSpec | None:
        """The spec whose figures land on `output` (the first output it names)."""
        return next((s for s in self.bound if s.outputs()[0] == output), None)

    def claimed(self) -> set[str]:
        """Every output some spec reads (an anchor head's scores too): auto-detection leaves them alone."""
        return {o for s in self.bound for o in s.outputs()}


def task_plan(task: str | Sequence[str]) -> TaskPlan:
    """The plan of `ScanOptions.task` (one value or several); usage error for two plain tasks."""
    values = [task] if isinstance(task, str) else list(task)
    specs = [parse_task_spec(v) for v in values] or [TaskSpec("auto")]
    bound = tuple(s for s in specs if s.outputs())
    plain = [s for s in specs if not s.outputs()]
    lone = [s.kind for s in plain if s.kind in SPEC_TASKS and s.kind != "decoder"]
    if lone:
        raise UsageError(f"--task {lone[0]}: expected the output(s) it reads "
                         f"({', '.join(k + '=NAME' for k in REQUIRED_KEYS[lone[0]])}), found none")
    if len(plain) > 1:
        raise UsageError(f"--task: expected one task for the outputs no spec names, found "
                         f"{', '.join(s.kind for s in plain)}")
    named = [o for s in bound for o in s.outputs()]
    twice = sorted({o for o in named if named.count(o) > 1})
    if twice:
        raise UsageError(f"--task: expected each output named by one spec, found {', '.join(twice)} in several")
    return TaskPlan(bound, plain[0] if plain else TaskSpec("auto"))
