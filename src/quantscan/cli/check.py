"""`quantscan check MODEL --profile NAME`: structural compatibility.

`--profile all` checks every shipped profile on one analysis of the model and prints the chip table
(errors, warnings, CPU islands per chip, the chips that take the model most nearly as it is first);
profiles.csv holds the same table whenever more than one profile is checked.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from quantscan.cli.args import (
    EXIT_OK,
    EXIT_THRESHOLD,
    default_out,
    parse_input_shape,
    print_case_matches,
    profile_label,
)

CHIP_TABLE = (("chip", "profile"), ("errors", "errors"), ("warnings", "warnings"), ("CPU islands", "cpu_islands"),
              ("CPU nodes", "cpu_nodes"))
"""The printed chip table: (header, profiles.csv column)."""


def cmd_check(args: argparse.Namespace) -> int:
    from quantscan.compat.check import check
    from quantscan.compat.profiles import ALL_PROFILES, expand
    from quantscan.cost.partitions import with_board_time
    from quantscan.model import ensure_not_quantized, load_model
    from quantscan.runfolder import claim_out_dir, refuse_inputs, write_csv

    out = Path(args.out) if args.out else default_out(args.model)
    refuse_inputs([out / "compat.csv", out / "partitions.csv", out / "profiles.csv"], [args.model], "--out")
    loaded = load_model(args.model)
    ensure_not_quantized(loaded.proto, loaded.path.name)  # before --out is claimed: nothing written
    profiles = expand(args.profile or ["generic-npu"])
    with claim_out_dir(out, force=args.force):
        shapes = parse_input_shape(args.input_shape)
        result = check(loaded.proto, profiles, input_shapes=shapes or None)
        partitions = with_board_time(result.partitions, loaded.proto, profiles, shapes or None)
        write_csv(out / "compat.csv", result.findings)
        write_csv(out / "partitions.csv", partitions)
        written = ["compat.csv", "partitions.csv"]
        if len(result.profiles) > 1:
            write_csv(out / "profiles.csv", result.profile_table())
            written.append("profiles.csv")
    if ALL_PROFILES in args.profile:
        _print_chip_table(result.profile_table())
    else:
        _print_counts([str(p) for p in profiles], result.findings)
    print(f"wrote {out}/{', '.join(written[:-1])} and {written[-1]}")
    if result.fold_flags:
        print(f"fold the If nodes: quantscan rewrite {args.model} {' '.join(result.fold_flags)} -o OUT.onnx"
              + (" (VALUE/V: what you deploy with)" if any(f.endswith(("=V", "=VALUE")) for f in result.fold_flags)
                 else ""))
    print_case_matches(result.findings, args.cases)
    if args.fail_on and result.fails(args.fail_on):
        return EXIT_THRESHOLD
    return EXIT_OK


def _print_counts(profiles: list[str], findings: Any) -> None:
    """One line per profile named on the command line: its errors, warnings and notes."""
    for profile in profiles:
        rows = findings[findings["profile"] == profile_label(profile, findings)] if not findings.empty else findings
        counts = rows["severity"].value_counts().to_dict() if not rows.empty else {}
        print(f"{profile}: {counts.get('error', 0)} errors, {counts.get('warn', 0)} warnings, "
              f"{counts.get('info', 0)} notes")


def _print_chip_table(table: Any) -> None:
    """The chip table, aligned: one row per profile, in profiles.csv's order (best first)."""
    cells = [[h for h, _ in CHIP_TABLE]] + [[str(row[c]) for _, c in CHIP_TABLE] for _, row in table.iterrows()]
    widths = [max(len(r[k]) for r in cells) for k in range(len(CHIP_TABLE))]
    for r in cells:
        print("  ".join(v.ljust(w) if k == 0 else v.rjust(w) for k, (v, w) in enumerate(zip(r, widths, strict=True))))
