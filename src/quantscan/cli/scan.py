"""`quantscan MODEL --calib DIR` / `quantscan scan`: the sensitivity scan.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from quantscan.cli.args import (
    EXIT_OK,
    EXIT_THRESHOLD,
    GainArgs,
    SampleArgs,
    TaskArgs,
    default_out,
    deployed_samples,
    executor_choice,
    print_case_matches,
    progress_factory,
    refuse_out_in_data,
)
from quantscan.cli.notes import print_warnings
from quantscan.columns import Col
from quantscan.errors import UsageError


def cmd_scan(args: argparse.Namespace) -> int:
    from quantscan.api import scan

    out = Path(args.out) if args.out else default_out(args.model)
    options: dict[str, Any] = {
        **SampleArgs.parse(args, "scan").scan_options(),
        **executor_choice(args),
        "calib_advice": args.calib_advice,
        "save_qdq": args.save_qdq,
        "force": args.force,
        "no_report": args.no_report,
        "tensors": args.tensors,
        "recover_check": not getattr(args, "no_recover_check", False),
        "split_isolated": not getattr(args, "no_isolated_split", False),
        **deployed_samples(args.deployed_samples),
        **GainArgs.parse(args).scan_options(),
        **TaskArgs.parse(args).scan_options(),
    }
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: expected a folder, found a file at {out}")
    refuse_out_in_data(out, args.calib, args.eval)
    from quantscan.runfolder import claim_out_dir

    with claim_out_dir(out, force=args.force):
        result = scan(args.model, args.calib, out=out, progress=progress_factory(args.quiet), **options)
    print_warnings(result.warnings, str(out / "run.json"))
    head = result.headline
    top = result.layers.head(5)
    top1 = head.metrics.top1_agreement
    deployed = head.deployed.cosine if head.deployed is not None else math.nan
    partial = "" if head.measured else " NOT MEASURED on the int8 model (bodies float):"
    print(f"{result.model.path.name}: {len(result.sites)} sites, output '{head.output}'{partial} "
          f"cosine {head.cosine:.5f}, SQNR {head.sqnr_db:.2f} dB"
          + (f", top-1 agreement {top1:.3f}" if top1 is not None else "")
          + f" (deployed ORT_ENABLE_ALL cosine {deployed:.5f})")
    if not head.measured:
        print(f"quantscan: warning: the cosine above is NOT the int8 model's: the quantizable nodes inside "
              f"{', '.join(head.unmeasured)} stayed float, in the fake-quant and the deployed check alike; "
              f"fold an If first (`quantscan check {args.model}` names the rewrite flags; no flag folds a Loop "
              "or Scan)", file=sys.stderr)
    if head.metrics.task:
        print("  task: " + ", ".join(f"{k} {v:.4g}" for k, v in head.metrics.task.items()))
    from quantscan.report.taskverdict import task_verdict

    for name, metrics in result.output_metrics.items():
        verdict = task_verdict(metrics.task)
        if verdict is not None:
            print(f"  output '{name}': {verdict}")
    if result.calib_advice is not None:
        print("  " + result.calib_advice.summary_line())
    for r in top.to_dict("records"):
        gain = float(r.get(Col.GAIN_IF_FLOAT, math.nan))
        stderr = float(r.get(Col.GAIN_IF_FLOAT_STDERR, math.nan))
        spread = f" ± {stderr:.2g}" if math.isfinite(stderr) else ""
        print(f"  #{r[Col.RANK]} {r[Col.NODE]} ({r[Col.KERNEL]}): isolated {r[Col.ISOLATED_SQNR_DB]:.1f} dB, "
              f"cumulative {r[Col.CUMULATIVE_SQNR_DB]:.1f} dB, {r[Col.CAUSE]}"
              + (f", gain if float {gain:+.4g}{spread}" if math.isfinite(gain) else ""))
    extra = ", compat.csv, partitions.csv" if result.compat is not None else ""
    extra += "" if args.no_report else ", report.html"
    extra += ", calib_advice.csv" if result.calib_advice is not None else ""
    print(f"wrote {out}/ (layers.csv, tensors.csv, ops.csv, channels.csv, hist.npz, summary.md, run.json{extra})")
    if result.compat is not None:
        print_case_matches(result.compat.findings, args.cases)
    if args.fail_below_cosine is not None and not head.measured:
        # a gate cannot pass on a figure that is not the int8 model's: the quantizable bodies stayed float
        print(f"quantscan: --fail-below-cosine {args.fail_below_cosine}: the headline was not measured on the "
              f"int8 model (float inside {', '.join(head.unmeasured)}); fold the control flow first", file=sys.stderr)
        return EXIT_THRESHOLD
    if args.fail_below_cosine is not None and not head.cosine >= args.fail_below_cosine:
        print(f"quantscan: output cosine {head.cosine:.5f} is below --fail-below-cosine "
              f"{args.fail_below_cosine}", file=sys.stderr)
        return EXIT_THRESHOLD
    return EXIT_OK
