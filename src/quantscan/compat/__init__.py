"""Structural NPU compatibility: chip profiles (TOML), one rule per file, NPU/CPU partitions.

Public API: `quantscan.compat.check.check(model, profiles, input_shapes=...) -> CheckResult` (also
`quantscan.check`), `list_profiles()`, `load_profile(name_or_path)`.

The package itself imports only the profile readers, so `quantscan profiles` and `check`'s argument
parsing never load pandas; `check` lives in its module (`compat/check.py`) and is imported from
there: re-exporting a function under its module's own name makes `quantscan.compat.check` mean the
function or the module depending on import order.
"""

from quantscan.compat.profiles import DEFAULT_PROFILE, Profile, ProfileInfo, list_profiles, load_profile
from quantscan.graph.index import stable_node_names
from quantscan.records import FINDING_COLUMNS as COLUMNS
from quantscan.records import Finding

__all__ = [
    "COLUMNS",
    "DEFAULT_PROFILE",
    "Finding",
    "Profile",
    "ProfileInfo",
    "list_profiles",
    "load_profile",
    "stable_node_names",
]
