"""`quantscan check MODEL --profile NAME`: structural compatibility.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from quantscan.cli.args import (
    EXIT_OK,
    EXIT_THRESHOLD,
    default_out,
    parse_input_shape,
    print_case_matches,
    profile_label,
)


def cmd_check(args: argparse.Namespace) -> int:
    from quantscan.compat.check import check
    from quantscan.cost.partitions import with_board_time
    from quantscan.model import ensure_not_quantized, load_model
    from quantscan.runfolder import claim_out_dir, refuse_inputs, write_csv

    out = Path(args.out) if args.out else default_out(args.model)
    refuse_inputs([out / "compat.csv", out / "partitions.csv"], [args.model], "--out")
    loaded = load_model(args.model)
    ensure_not_quantized(loaded.proto, loaded.path.name)  # before --out is claimed: nothing written
    with claim_out_dir(out, force=args.force):
        profiles = args.profile or ["generic-npu"]
        shapes = parse_input_shape(args.input_shape)
        result = check(loaded.proto, profiles, input_shapes=shapes or None)
        partitions = with_board_time(result.partitions, loaded.proto, profiles, shapes or None)
        write_csv(out / "compat.csv", result.findings)
        write_csv(out / "partitions.csv", partitions)
    findings = result.findings
    for profile in profiles:
        rows = findings[findings["profile"] == profile_label(profile, findings)] if not findings.empty else findings
        counts = rows["severity"].value_counts().to_dict() if not rows.empty else {}
        print(f"{profile}: {counts.get('error', 0)} errors, {counts.get('warn', 0)} warnings, "
              f"{counts.get('info', 0)} notes")
    print(f"wrote {out}/compat.csv and partitions.csv")
    if result.fold_flags:
        print(f"fold the If nodes: quantscan rewrite {args.model} {' '.join(result.fold_flags)} -o OUT.onnx"
              + (" (VALUE/V: what you deploy with)" if any(f.endswith(("=V", "=VALUE")) for f in result.fold_flags)
                 else ""))
    print_case_matches(findings, args.cases)
    if args.fail_on and result.fails(args.fail_on):
        return EXIT_THRESHOLD
    return EXIT_OK
