"""`quantscan calib-advice MODEL --calib DIR`: is the calibration set big enough, which samples decide.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from quantscan.cli.args import EXIT_OK, SampleArgs, default_out, progress_factory, refuse_out_in_data


def cmd_calib_advice(args: argparse.Namespace) -> int:
    from quantscan.api import calib_advice

    out = Path(args.out) if args.out else default_out(args.model)
    refuse_out_in_data(out, args.calib, args.eval)
    from quantscan.runfolder import claim_out_dir

    with claim_out_dir(out, force=args.force):
        advice = calib_advice(args.model, args.calib, pick=args.pick, out=out, progress=progress_factory(args.quiet),
                              **SampleArgs.parse(args, "calib-advice").scan_options())
    print(advice.summary_line())
    print(f"  wrote {out / 'calib_advice.csv'}" + (f" and {out / 'picked'}/" if args.pick else ""))
    return EXIT_OK
