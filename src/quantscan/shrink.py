"""`until_fails(model, predicate)`: shrink a node set while a user predicate keeps failing.

By delta debugging (Zeller's ddmin). ddmin only ever moves to a set it has seen fail, so it needs no
monotonicity along the graph (the reason bisection-style reducers stall), and it ends 1-minimal:
removing any single node of the result makes the predicate pass. Every try is logged (set size,
verdict, seconds) and reported to a progress callback; `command_predicate` turns a shell command with
`{model}` into a predicate (exit code != 0 = fails). One of the three jobs of `quantscan extract`.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import onnx

from quantscan.calib import CalibSet
from quantscan.compare import load_side
from quantscan.cut import Extractor, UntypedError, save_extracted
from quantscan.errors import UsageError
from quantscan.model import ModelArg
from quantscan.runner import Runner

T = TypeVar("T")
Predicate = Callable[[onnx.ModelProto], bool]


@dataclass(frozen=True)
class TryRecord:
    """One evaluation of the predicate during `until_fails`."""

    index: int
    size: int
    verdict: str  # "fails" | "passes" | "invalid" (the node set does not make a valid model)
    seconds: float
    best: int  # size of the smallest failing set known after this try
    note: str = ""  # why a set was invalid


@dataclass
class ShrinkResult:
    """The smallest failing subgraph found, and the log of every try that led there."""

    model: onnx.ModelProto
    nodes: list[str]  # every node of the model, carried constants included
    core: list[str]  # the failing set itself: removing any one of these makes the predicate pass
    start_size: int
    tries: list[TryRecord]
    minimal: bool  # False when `max_tries` stopped the search before 1-minimality was shown
    seconds: float
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    source: onnx.ModelProto = field(default_factory=onnx.ModelProto, repr=False)
    source_path: Path | None = None

    @property
    def n_tries(self) -> int:
        return len(self.tries)

    def save(self, out: str | Path, *, force: bool = False) -> Path:
        """Write the model atomically; refuses the source model's own path and files quantscan did not write."""
        return save_extracted(self.model, Path(out), self.source_path, force)

    def log_lines(self) -> list[str]:
        """The try log as text lines (for a `.log` file beside the model)."""
        return [
            f"try {t.index}: {t.size} nodes, {t.verdict}, {t.seconds:.3f} s (best {t.best})"
            + (f": {t.note}" if t.note else "")
            for t in self.tries
        ]


class _Budget(Exception):
    """Raised inside ddmin when the try budget is spent."""


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool]) -> list[T]:
    """A 1-minimal failing subset of `items` (which must fail as a whole), by delta debugging.

    The complement form of Zeller's ddmin: remove contiguous chunks (half the set, then quarters, ...
    down to single items), keeping a removal whenever the rest still fails, then repeat single-item
    removals until none succeeds. It only ever moves to a set it has seen fail, so it never assumes
    that failure is monotone along the graph, and it ends 1-minimal: removing any one item of the
    result makes it pass. Why this form and not the classic subset-then-complement loop: with a
    cause made of k separate nodes, testing chunks on their own is wasted work (no chunk holds all
    k), and the classic loop re-tests them at every granularity; on 49-300 items with 2-4 scattered
    culprits this form needs 1.5-2.5x fewer tries (21 vs 30 tries for 2 of 49). Items keep their
    order (topological for nodes), so chunks are graph regions. Results are cached by set.
    """
    cache: dict[frozenset[T], bool] = {}

    def test(subset: list[T]) -> bool:
        key = frozenset(subset)
        if key not in cache:
            cache[key] = fails(subset)
        return cache[key]

    current = list(items)
    size = len(current) // 2
    while size > 1:
        current = _remove_chunks(current, size, test)
        size //= 2
    while True:
        shrunk = _remove_chunks(current, 1, test)
        if shrunk == current:
            return current
        current = shrunk


def _remove_chunks(current: list[T], size: int, test: Callable[[list[T]], bool]) -> list[T]:
    """One pass dropping each chunk of `size` items whose removal keeps the set failing."""
    i = 0
    while i < len(current) and len(current) > 1:
        candidate = current[:i] + current[i + size:]
        if candidate and test(candidate):
            current = candidate
        else:
            i += size
    return current


def until_fails(
    model: ModelArg,
    predicate: Predicate,
    *,
    nodes: Iterable[str] | None = None,
    progress: Callable[[TryRecord], None] | None = None,
    max_tries: int | None = None,
    calib: CalibSet | str | Path | None = None,
    consts: Mapping[str, float] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    runner: Runner | None = None,
) -> ShrinkResult:
    """Shrink a node set (default: every non-constant node) while `predicate(model)` stays True.

    `predicate` gets a standalone model of the candidate set (constants carried along, full_check
    passed) and returns True when the problem still shows ("fails"). The starting set must fail
    (else UsageError: nothing to shrink). `max_tries` bounds the predicate calls; the result then
    holds the smallest failing set seen, with `minimal=False`. calib/consts/input_shapes/seed are
    used only if shape inference leaves a cut tensor's type unknown (see `extract`).
    """
    _, proto, inputs = load_side(model)
    ex = Extractor(
        proto, inputs, calib=calib, consts=consts, input_shapes=input_shapes, seed=seed, runner=runner
    )
    start = ex.searchable() if nodes is None else sorted({ex.index(n) for n in nodes} - ex.const_nodes)
    if not start:
        raise UsageError("--until-fails: expected at least one non-constant node to start from, found none")
    log: list[TryRecord] = []
    best: list[list[int]] = []
    began = time.perf_counter()

    def fails(subset: list[int]) -> bool:
        if max_tries is not None and len(log) >= max_tries:
            raise _Budget
        t = time.perf_counter()
        verdict, note = _verdict(ex, subset, predicate)
        if verdict == "fails" and (not best or len(subset) < len(best[-1])):
            best.append(list(subset))
        record = TryRecord(len(log) + 1, len(subset), verdict, time.perf_counter() - t,
                           len(best[-1]) if best else len(start), note)
        log.append(record)
        if progress is not None:
            progress(record)
        return verdict == "fails"

    if not fails(start):
        raise UsageError(
            f"--until-fails: expected the predicate to fail on the starting model ({len(start)} nodes), "
            f"found it {log[-1].verdict} {log[-1].note}".rstrip() + ": nothing to shrink"
        )
    try:
        final, minimal = ddmin(start, fails), True
    except _Budget:
        final, minimal = best[-1], False
    sub, _, sub_inputs, sub_outputs = ex.build(final)
    return ShrinkResult(
        model=sub,
        nodes=[ex.nodes[i].name for i in ex._with_constants(set(final))],
        core=[ex.nodes[i].name for i in final],
        start_size=len(start),
        tries=log,
        minimal=minimal,
        seconds=time.perf_counter() - began,
        inputs=sub_inputs,
        outputs=sub_outputs,
        source=proto,
        source_path=None if isinstance(model, onnx.ModelProto) else Path(model),
    )


def _verdict(ex: Extractor, subset: list[int], predicate: Predicate) -> tuple[str, str]:
    """("fails"|"passes", "") from the predicate; ("invalid", why) when the set makes no valid model
    (e.g. a cut tensor without a rank and no data to find it): the search treats it as passing."""
    try:
        sub = ex.build(subset)[0]
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, UntypedError) as exc:
        return "invalid", str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ("fails" if predicate(sub) else "passes"), ""


def command_predicate(
    cmd: str, *, timeout: float | None = None, fail_regex: str | None = None, cwd: str | Path | None = None
) -> Predicate:
    """A predicate running `cmd` through the shell with `{model}` replaced by a temporary model path.

    Exit code != 0 means "fails"; with `fail_regex`, the output (stdout + stderr) must also match it,
    so an unrelated crash on a strange subgraph is not mistaken for the bug being chased. A try that
    exceeds `timeout` seconds counts as passing. The command is the user's own, run as their shell
    would run it (pipes allowed); the path is shell-quoted.
    """
    if "{model}" not in cmd:
        raise UsageError(f"--until-fails: expected a command containing {{model}}, found {cmd!r}")
    pattern = re.compile(fail_regex) if fail_regex else None

    def predicate(model: onnx.ModelProto) -> bool:
        with tempfile.TemporaryDirectory(prefix="quantscan-extract-") as tmp:
            path = Path(tmp) / "model.onnx"
            onnx.save(model, str(path))
            command = cmd.replace("{model}", shlex.quote(str(path)))
            try:
                done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout,
                                      cwd=cwd, check=False)
            except subprocess.TimeoutExpired:
                return False
        if done.returncode == 0:
            return False
        return pattern is None or pattern.search(done.stdout + done.stderr) is not None

    return predicate
