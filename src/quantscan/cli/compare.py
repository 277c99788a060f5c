"""`quantscan compare A B --calib DIR`: two models side by side.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quantscan.cli.args import (
    EXIT_OK,
    EXIT_THRESHOLD,
    common,
    finite,
    parse_const,
    parse_input_shape,
    positive_int,
    refuse_out_in_data,
)
from quantscan.cli.notes import print_warnings
from quantscan.columns import Col
from quantscan.errors import UsageError


def compare_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help="numeric comparison of two models on the same data")
    p.add_argument("model_a")
    p.add_argument("model_b")
    p.add_argument("--calib", default=None, help="data folder (default: 8 seeded random samples)")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME:D0,D1,...")
    p.add_argument("--limit", type=positive_int, default=None)
    p.add_argument("--fail-below-cosine", type=finite, default=None)
    p.add_argument("--force", action="store_true", help="replace files in --out quantscan did not write")
    common(p)


def cmd_compare(args: argparse.Namespace) -> int:
    from quantscan.compare import compare
    from quantscan.runner import Runner

    out = Path(args.out) if args.out else Path("reports") / f"{Path(args.model_a).stem}_vs_{Path(args.model_b).stem}"
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: expected a folder, found a file at {out}")
    refuse_out_in_data(out, args.calib)
    from quantscan.runfolder import RUN_NAMES, claim_out_dir, refuse_inputs

    refuse_inputs([out / n for n in RUN_NAMES], [args.model_a, args.model_b], "--out")
    with claim_out_dir(out, force=args.force):
        result = compare(args.model_a, args.model_b, args.calib, limit=args.limit, seed=args.seed,
                         runner=Runner(threads=args.threads), consts=parse_const(args.const),
                         input_shapes=parse_input_shape(args.input_shape), out=out)
    print_warnings(result.warnings, str(out / "compare.json"))
    print(f"compared on {result.data}")
    for r in result.outputs.to_dict("records"):
        print(f"  output '{r[Col.OUTPUT]}': cosine {r['cosine']:.6f}, SQNR {r['sqnr_db']:.2f} dB, "
              f"max_abs {r['max_abs']:.3g}")
    print(f"  {len(result.tensors)} intermediate tensors matched, {len(result.unmatched)} unmatched; wrote {out}/")
    if args.fail_below_cosine is not None:
        below = result.outputs_below(args.fail_below_cosine)
        if below:
            print(f"quantscan: outputs below --fail-below-cosine {args.fail_below_cosine}: {', '.join(below)}",
                  file=sys.stderr)
            return EXIT_THRESHOLD
    return EXIT_OK
