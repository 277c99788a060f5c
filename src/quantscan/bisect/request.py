"""What a bisection is asked to do, parsed once: `BisectRequest` beside the scan's `ScanOptions`.

Why: `bisect_model` took 29 keywords and a free options dict read by string key, and a resume re-read 17
stored options by hand. The request is typed and checked before any work; the session stores it (and the
scan options that decide what is measured) and gives both back on resume (`resumed`, `resumed_scan`), so a
resumed search measures exactly what the first run measured. `BisectHooks` carry what is not a request:
callbacks, the runner, the summary block and the toolchain factory. `from_keywords` reads the old keyword
spelling (`quantscan.api.run_bisect(model, calib, target_cosine=..., threads=...)`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantscan.bisect.judges import SIMULATION
from quantscan.bisect.objective import Objective
from quantscan.bisect.robust import DEFAULT_REALISATIONS, DEFAULT_SPREAD, DEFAULT_Z, Rounding
from quantscan.bisect.state import FALLBACKS, MODES, StepCallback, Target
from quantscan.bisect.targets import parse_target
from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.runfolder import jsonable
from quantscan.scanning.options import MEASUREMENT_OPTIONS, ProgressFactory, ScanOptions, no_progress

if TYPE_CHECKING:
    from quantscan.bisect.external import ToolchainFactory
    from quantscan.bisect.plan import SummaryBlock
    from quantscan.runner import Runner


@dataclass(frozen=True)
class BisectRequest:
    """One bisection: the target and how to reach it, who judges, where the files go.

    `target` is None only on resume (the session's target is the search's). `keep_float`/`force_quant` are
    marks: a new session records them, a resumed one applies them as new marks."""

    target: Target | None = None
    fallback: str = "float"
    mode: str = "search"
    keep_float: tuple[str, ...] = ()
    force_quant: tuple[str, ...] = ()
    loss_if_only: bool = False
    rounding: Rounding = field(default_factory=Rounding)
    judge: str = SIMULATION
    """`--evaluator`: the registered judge (bisect/judges.py) that measures the search's candidates."""
    verify: bool = False
    """`--verify`: the toolchain applies the plan and its Pareto points once the search is done."""
    max_minutes: float | None = None
    objective: Objective = field(default_factory=Objective)
    exports: tuple[str, ...] | None = None
    out: Path | None = None
    save_qdq: Path | None = None
    session: Path | None = None
    resume: Path | None = None
    graph: str | None = None
    """The simulated judge's graph strategy (bisect/targets.GRAPH_STRATEGIES); None: the judge chooses
    once, a resumed session gives back the one it recorded."""

    def checked(self) -> BisectRequest:
        """Refuse an unknown fallback or mode, a bad time budget or a new search without a target."""
        if self.fallback not in FALLBACKS or self.mode not in MODES:
            raise UsageError(f"bisect: expected --fallback float|int16|int8 and mode search|first_bad, found "
                             f"{self.fallback}, {self.mode}")
        if self.max_minutes is not None and not (math.isfinite(self.max_minutes) and self.max_minutes > 0):
            raise UsageError(f"--max-minutes: expected a positive number of minutes, found {self.max_minutes}")
        if self.target is None and self.resume is None:
            raise UsageError("bisect: expected exactly one of --target METRIC=VALUE, --target-cosine, --target-sqnr, "
                             "--target-top1, found none")
        return self

    def deadline(self, started: float) -> float | None:
        """The perf_counter value the search stops at (`--max-minutes` from `started`), None without one."""
        return None if self.max_minutes is None else started + 60.0 * self.max_minutes

    def session_options(self, outputs: Sequence[str], opts: ScanOptions) -> dict[str, Any]:
        """session.json's `options` for a new session: this request's search and the scan options that decide
        what is measured (validated, defaults included), so a resume measures the same."""
        assert self.target is not None
        return {
            "target_metric": self.target.metric,
            "target_value": self.target.value,
            Col.OUTPUT: outputs[0] if len(outputs) == 1 else ",".join(outputs),
            "fallback": self.fallback,
            "mode": self.mode,
            Col.LOSS_IF_ONLY: self.loss_if_only,
            "early_stop": self.loss_if_only,  # bisect/state.py EARLY_STOP_SHARE: only an order that saw each loss alone
            "keep_float": list(self.keep_float),
            "force_quant": list(self.force_quant),
            "scan": scan_record(opts),
            "rounding": self.rounding.as_dict(),
        }

    def recorded(self) -> dict[str, Any]:
        """What a new session records once its gains are in: the judge and the objective."""
        return {"evaluator": self.judge, **self.objective.as_dict()}

    def resumed(self, options: Mapping[str, Any]) -> BisectRequest:
        """This request continuing a session with `options`: the session's target, fallback, mode, roundings,
        objective and graph strategy; this run's marks, files, budget and --verify. That the judge is the
        session's is the registry's check (bisect/judges.continuing), made before this."""
        target = Target(str(options["target_metric"]), float(options["target_value"]), options.get(Col.OUTPUT))
        # a session from before issue 32 searched with one rounding and no split (Rounding.from_dict)
        return replace(self, target=target, fallback=str(options["fallback"]),
                       mode=str(options.get("mode", "search")), loss_if_only=bool(options.get(Col.LOSS_IF_ONLY, False)),
                       rounding=Rounding.from_dict(options.get("rounding")),
                       objective=Objective.stored(options) or self.objective,
                       graph=options.get("graph_strategy") or self.graph)


def scan_record(opts: ScanOptions) -> dict[str, Any]:
    """The measurement options of validated scan options, as JSON values (enums by value)."""
    return {k: jsonable(getattr(getattr(opts, k), "value", getattr(opts, k))) for k in MEASUREMENT_OPTIONS}


def resumed_scan(given: ScanOptions, stored: Mapping[str, Any]) -> ScanOptions:
    """The scan options of a resumed session: what it measured with (`stored`: `scan_record`), and this run's
    choices of how to run (threads when given, --force, workers, executor)."""
    names = {f.name for f in fields(ScanOptions)}
    measured = {k: v for k, v in stored.items() if k in names}
    threads = given.threads if given.threads is not None else measured.get("threads")
    return replace(given, **{**measured, "threads": threads})


@dataclass(frozen=True)
class BisectHooks:
    """What a bisection calls or is handed that is not part of the request (never stored in a session)."""

    progress: ProgressFactory = no_progress
    on_step: StepCallback | None = None
    runner: Runner | None = None
    summary_block: SummaryBlock | None = None
    """`quantscan.api.run_bisect`: puts the plan into a scan's summary.md in `out`."""
    toolchain: ToolchainFactory | None = None
    """Makes the vendor toolchain a toolchain judge or `--verify` builds in (toolchains/, through the CLI)."""


def target_from_flags(
    target_cosine: float | None = None,
    target_sqnr: float | None = None,
    target_top1: float | None = None,
    target: str | None = None,
) -> Target:
    """One target: `--target METRIC=VALUE` (any metric, bisect/targets.py) or one of the older flags."""
    given = [
        (m, v)
        for m, v in (("cosine", target_cosine), ("sqnr", target_sqnr), ("top1", target_top1))
        if v is not None
    ]
    if len(given) + (target is not None) != 1:
        raise UsageError(
            "bisect: expected exactly one of --target METRIC=VALUE, --target-cosine, --target-sqnr, "
            f"--target-top1, found {len(given) + (target is not None) or 'none'}"
        )
    return parse_target(target) if target is not None else Target(given[0][0], float(given[0][1]))


_TARGET_KEYS = ("target_cosine", "target_sqnr", "target_top1", "target")
_ROUNDING_KEYS = {"realisations": ("realisations", DEFAULT_REALISATIONS),
                  "rounding_spread": ("spread", DEFAULT_SPREAD), "bound_z": ("z", DEFAULT_Z),
                  "holdout": ("holdout", "interleave")}
"""The keyword spelling of `Rounding`'s fields (the CLI flags' names)."""
_PATHS = ("out", "save_qdq", "session", "resume")


def from_keywords(options: Mapping[str, Any]) -> tuple[BisectRequest, BisectHooks, dict[str, Any]]:
    """The keyword spelling of `run_bisect(model, calib, **options)`: the request, the hooks, and the rest
    (the scan options: `ScanOptions(**rest)`). The keyword names are the dataclasses' own fields, plus
    the target flags, the rounding flags and `evaluator` (the judge's flag name)."""
    rest = dict(options)
    targets = {k: rest.pop(k) for k in _TARGET_KEYS if k in rest}
    hooks = BisectHooks(**{f.name: rest.pop(f.name) for f in fields(BisectHooks) if f.name in rest})
    rounding = {name: rest.pop(key, default) for key, (name, default) in _ROUNDING_KEYS.items()}
    request: dict[str, Any] = {f.name: rest.pop(f.name) for f in fields(BisectRequest)
                               if f.name in rest and f.name not in ("target", "rounding", "objective", "judge")}
    for key in _PATHS:
        request[key] = Path(request[key]) if request.get(key) is not None else None
    for key in ("keep_float", "force_quant", "exports"):
        if request.get(key) is not None:
            request[key] = tuple(request[key])
    request["judge"] = rest.pop("evaluator", SIMULATION)
    request["objective"] = Objective.parse(rest.pop("objective", None), rest.pop("max_extra_ms", None))
    request["rounding"] = Rounding(seed=int(rest.get("seed") or 0), **rounding)
    resuming = request.get("resume") is not None and not any(v is not None for v in targets.values())
    request["target"] = None if resuming else target_from_flags(**targets)
    return BisectRequest(**request), hooks, rest
