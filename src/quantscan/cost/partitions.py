"""`check --profile P`'s partitions.csv with board time: what each NPU/CPU island costs on the chip.

A CPU island's `est_ms` is its ops at the CPU's rate plus the partition crossings into it (transfer and
synchronisation); an NPU island's is its kernels plus the crossings into it. Only profiles with a
`[cost]` table are priced; the others' rows keep an empty cell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
import pandas as pd

from quantscan.columns import Col
from quantscan.compat.analysis import analyse
from quantscan.compat.profiles import load_profile
from quantscan.cost.estimate import Pricer
from quantscan.cost.table import CostTable


def with_board_time(
    partitions: pd.DataFrame, model: onnx.ModelProto | str | Path, profiles: Sequence[str | Path],
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> pd.DataFrame:
    """`partitions` with an `est_ms` column (NaN where the profile has no cost table)."""
    out = partitions.copy()
    out[Col.EST_MS] = float("nan")
    if out.empty:
        return out
    analysis = None
    for spec in profiles:
        profile = load_profile(spec)
        if not profile.cost:
            continue
        analysis = analysis or analyse(model, input_shapes)
        pricer = Pricer(analysis, profile, CostTable.of(profile))
        estimate = pricer.price({})
        rows = out["profile"] == profile.name
        out.loc[rows, Col.EST_MS] = [round(pricer.island_ms(set(str(n).split(";")), estimate), 6)
                                     for n in out.loc[rows, "nodes"]]
    return out
