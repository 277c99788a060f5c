"""What a rule sees: the model analysis and one profile, with a few shared helpers."""

from __future__ import annotations

from dataclasses import dataclass

from quantscan.compat.analysis import ModelAnalysis
from quantscan.compat.profiles import Profile, Sourced
from quantscan.graph.index import GraphIndex
from quantscan.records import Severity


@dataclass(frozen=True)
class RuleContext:
    analysis: ModelAnalysis
    profile: Profile

    @property
    def view(self) -> GraphIndex:
        return self.analysis.view

    def name(self, i: int) -> str:
        return self.view.names[i]

    def op(self, i: int) -> str:
        return self.view.nodes[i].op_type

    def on_npu_path(self, i: int) -> bool:
        """A live node the profile would place on the NPU (before any limit is checked)."""
        return self.op(i) in self.profile.npu_ops

    def severity(self, on_violation: str, origin: Sourced) -> Severity:
        """`reject` -> error, `cpu` fallback -> warn; an unverified source never exceeds warn."""
        if on_violation == "reject" and not origin.unverified:
            return Severity.ERROR
        return Severity.WARN
