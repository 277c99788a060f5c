"""summary.md's device section: what the dumps say, in a few lines a user can act on.

The section sits between markers so `quantscan dumps` can add it to a scan's summary.md in the same run
folder, or replace its own from an earlier run, without touching the rest of the file.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from quantscan.columns import Col

BEGIN = "<!-- quantscan:device -->"
END = "<!-- /quantscan:device -->"
_ROWS = 8


def with_section(text: str, section: str) -> str:
    """`text` with its device section replaced by `section` (appended when it has none)."""
    block = f"{BEGIN}\n{section.rstrip()}\n{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1].lstrip("\n")
    return (text.rstrip() + "\n\n" if text.strip() else "") + block


def _db(value: Any) -> str:
    v = float(value)
    return "inf" if v == math.inf else ("" if math.isnan(v) else f"{v:.1f}")


def device_markdown(result: Any) -> str:
    """The section for a `device.DeviceResult` (typed loosely: report/ does not import the core)."""
    table = result.table
    measured = table[table["dump"] != ""]
    lines = [
        "## Device dumps",
        "",
        f"{result.format} dumps of {len(result.samples)} sample(s) lined up with {result.aligned_sites} of "
        f"{result.sites} quantization sites ({100.0 * result.aligned_sites / max(result.sites, 1):.0f}%); "
        f"{len(result.alignment.unmatched)} dump tensor(s) matched nothing.",
        "",
    ]
    first = measured[measured["first_departure"].astype(bool)]
    if first.empty:
        lines.append("The device follows the simulation at every measured site: what it loses is quantization "
                     "loss as simulated (layers.csv says where and why).")
    else:
        row = first.iloc[0]
        lines.append(
            f"**The device departs from the simulation first at `{row[Col.NODE]}` ({row[Col.KERNEL]}, tensor "
            f"`{row['tensor']}`)**: simulation vs device SQNR {_db(row['sim_device_sqnr_db'])} dB where FP32 vs "
            f"simulation is {_db(row['fp32_sim_sqnr_db'])} dB. Rounding does not explain that: look for a "
            "deployment or conversion bug there (layout, scale, a fused op, an unsupported attribute).")
    lines += ["", "| site | tensor | FP32↔sim dB | FP32↔device dB | sim↔device dB | verdict |",
              "|---|---|---|---|---|---|"]
    worst = measured.nsmallest(_ROWS, "sim_device_sqnr_db") if not measured.empty else measured
    for _, row in worst.sort_values(Col.ORDER).iterrows():
        lines.append(f"| {row[Col.NODE]} | {row['tensor']} | {_db(row['fp32_sim_sqnr_db'])} | "
                     f"{_db(row['fp32_device_sqnr_db'])} | {_db(row['sim_device_sqnr_db'])} | {row['verdict']} |")
    lines += ["", f"The {min(_ROWS, len(measured))} sites with the lowest simulation↔device SQNR; all in device.csv. "
              "A site departs when the device's noise against the simulation exceeds 4× the simulation's "
              "noise against FP32 (plus a -40 dB floor)."]
    return "\n".join(lines) + "\n"


def device_body(table: pd.DataFrame, plots: Any) -> str:
    """report.html's device section body (report.html wraps it): the three lines along the network and
    the departing sites."""
    from quantscan.report.cells import esc
    from quantscan.report.plots import device_figure, svg

    measured = table[table["dump"].fillna("").astype(str) != ""]
    first = measured[measured["first_departure"].astype(bool)]
    if first.empty:
        verdict = "<p>The device follows the simulation at every measured site: quantization loss as simulated.</p>"
    else:
        row = first.iloc[0]
        verdict = (f"<p><b>First departure: {esc(str(row[Col.NODE]))}</b> (tensor {esc(str(row['tensor']))}): "
                   f"simulation↔device {_db(row['sim_device_sqnr_db'])} dB where FP32↔simulation is "
                   f"{_db(row['fp32_sim_sqnr_db'])} dB: a deployment or conversion bug, not rounding.</p>")
    counts = ", ".join(f"{k} {v}" for k, v in measured["verdict"].value_counts().items())
    return (f"<p>{len(measured)} of {len(table)} sites lined up with a dump ({esc(counts)}); device.csv has "
            f"every figure.</p>{verdict}{svg(device_figure(table), plots, 'device dumps along the network')}")
