"""Structural NPU compatibility: chip profiles (TOML), one rule per file, NPU/CPU partitions.

Public API: `check(model, profiles, input_shapes=...) -> CheckResult`, `list_profiles()`,
`load_profile(name_or_path)`.
"""

from quantscan.compat.check import check
from quantscan.compat.profiles import DEFAULT_PROFILE, Profile, ProfileInfo, list_profiles, load_profile
from quantscan.compat.result import CheckResult
from quantscan.graph.index import stable_node_names
from quantscan.records import FINDING_COLUMNS as COLUMNS
from quantscan.records import Finding

__all__ = [
    "COLUMNS",
    "DEFAULT_PROFILE",
    "CheckResult",
    "Finding",
    "Profile",
    "ProfileInfo",
    "check",
    "list_profiles",
    "load_profile",
    "stable_node_names",
]
