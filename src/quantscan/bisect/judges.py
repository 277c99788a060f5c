"""Who measures a bisection's candidates: one `Judge` seam and a registry of judges (name -> factory).

Why one seam: quantscan's simulation (bisect/simulated.py) and a vendor toolchain (bisect/external.py)
answer the same question, "does this precision assignment meet the target?". The driver asks every judge
the same things and never asks which judge it is (as Polygraphy's runners behind one `infer`):

- `judge(precisions) -> Judged`: one candidate, as the search compares it with the target;
- `round(candidates)` and `width`: a round of speculative sets measured at once (bisect/speculate.py);
- `claims(sets)`: the figures a plan may claim, held out from the search (quantscan's roundings on the
  held-out samples), or None when the judge's own figures are the claim (a toolchain's simulator is what
  the plan is for; it is judged on the search's samples);
- `note()`: what the session records about how the judge measured (the simulation's graph strategy);
- `release()`: free what only evaluations needed (before the output gains, and once the search is done).

The registry (`JUDGES`) gives `bisect --evaluator` and `--verify` their choices. A toolchain judge is one
line: `register(JudgeSpec("tool", toolchain_judge, builds=True))`; the toolchain itself (the `Toolchain`
protocol, bisect/external.py) comes from toolchains/ through the CLI, so the search never imports a vendor
(bisect/exports.py reads toolchains/ only for the plan files each tool takes).
This module stays light (the CLI builds its parser from it): the judges are imported when one is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from quantscan.bisect.judge import Judge, JudgeSetup
from quantscan.bisect.state import SessionFileError
from quantscan.errors import UsageError

SIMULATION = "quantscan"
"""The default judge: quantscan's own simulation of the chip's rounding."""


JudgeFactory = Callable[[JudgeSetup], Judge]


@dataclass(frozen=True)
class JudgeSpec:
    """A registered judge: its name (`--evaluator NAME`), its factory, and whether its evaluations are
    toolchain builds (it needs a toolchain, can `--verify` a plan, and its builds run in threads or on Ray
    nodes offering the toolchain rather than in a process pool)."""

    name: str
    make: JudgeFactory
    builds: bool = False


def simulated_judge(setup: JudgeSetup) -> Judge:
    """quantscan's simulation (bisect/simulated.py; onnxruntime is loaded only when a search runs)."""
    from quantscan.bisect.simulated import SimulatedJudge

    return SimulatedJudge(setup)


def toolchain_judge(setup: JudgeSetup) -> Judge:
    """A vendor toolchain: each candidate one build in it (bisect/external.py)."""
    from quantscan.bisect.external import ToolchainJudge

    return ToolchainJudge.of(setup)


JUDGES: dict[str, JudgeSpec] = {}


def register(spec: JudgeSpec) -> None:
    """Add a judge to the registry (`--evaluator` and, for a toolchain, `--verify` offer it)."""
    JUDGES[spec.name] = spec


register(JudgeSpec(SIMULATION, simulated_judge))
register(JudgeSpec("rknn", toolchain_judge, builds=True))
register(JudgeSpec("tpu-mlir", toolchain_judge, builds=True))


def judge_spec(name: str) -> JudgeSpec:
    """The registered judge `name`; UsageError naming the choices otherwise."""
    if name not in JUDGES:
        raise UsageError(f"bisect --evaluator: expected one of {', '.join(JUDGES)}, found {name!r}")
    return JUDGES[name]


def continuing(spec: JudgeSpec, options: Mapping[str, Any]) -> JudgeSpec:
    """`spec`, when it is the judge that measured the session whose `options` these are; SessionFileError
    otherwise. Why: a session's steps are one judge's figures, and resuming under another would compare two
    simulators' figures in one search. The registry compares its own entries (the stored name looked up, the
    entry itself compared), so no caller compares judges by name. A session from before the registry
    recorded none: quantscan's simulation measured it."""
    recorded = str(options.get("evaluator", SIMULATION))
    if JUDGES.get(recorded) is not spec:
        raise SessionFileError(f"session was measured with --evaluator {recorded}, found --evaluator {spec.name}: "
                               "resume with the same evaluator")
    return spec


def judge_names() -> list[str]:
    """`--evaluator` choices."""
    return list(JUDGES)


def verify_names() -> list[str]:
    """`--verify` choices: the judges that build in a toolchain."""
    return [name for name, spec in JUDGES.items() if spec.builds]
