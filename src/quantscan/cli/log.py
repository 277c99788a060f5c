"""`quantscan log FILE`: a vendor conversion log read into findings.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from quantscan.cli.args import EXIT_OK, default_out
from quantscan.toolchains import TOOLCHAINS

# --- log: a vendor conversion log read into findings -------------------------------------------------


def log_parser(sub: Any) -> None:
    labels = ", ".join(tool.label for tool in TOOLCHAINS.values() if tool.log is not None)
    p = sub.add_parser("log", help=f"read a vendor conversion log ({labels}) into findings")
    p.add_argument("log_file", metavar="FILE")
    p.add_argument("--model", default=None, help="the ONNX model that was converted: map vendor names to its nodes")
    p.add_argument("--profile", default=None, metavar="NAME|PATH",
                   help="with --model: the vendor's placements beside check --profile's (mismatches are findings)")
    p.add_argument("--out", help="folder for compat.csv and log_layers.csv (default reports/<log stem>/)")
    p.add_argument("--quiet", action="store_true", help="accepted for symmetry; log prints no progress")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--force", action="store_true", help="replace files in --out quantscan did not write")


def cmd_log(args: argparse.Namespace) -> int:
    from quantscan.runfolder import claim_out_dir, refuse_inputs, write_csv
    from quantscan.toolchains.logs import read_log

    out = Path(args.out) if args.out else default_out(args.log_file)
    refuse_inputs([out / "compat.csv", out / "log_layers.csv"], [args.log_file, args.model, args.profile], "--out")
    with claim_out_dir(out, force=args.force):
        reading = read_log(args.log_file, model=args.model, profile=args.profile)
        write_csv(out / "compat.csv", reading.findings)
        write_csv(out / "log_layers.csv", reading.layers)
    for line in reading.summary_lines():
        print(line)
    print(f"wrote {out}/compat.csv and log_layers.csv")
    return EXIT_OK
