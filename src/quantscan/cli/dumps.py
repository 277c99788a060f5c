"""`quantscan dumps MODEL --calib DIR --dumps DIR`: a device's per-layer dumps beside FP32 and the simulation.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from quantscan.cli.args import (
    EXIT_OK,
    common,
    default_out,
    parse_const,
    progress_factory,
    refuse_out_in_data,
    split_input_shapes,
)
from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.toolchains import TOOLCHAINS

# --- dumps: what the chip computed, beside FP32 and the simulation -----------------------------------


def dumps_parser(sub: Any) -> None:
    p = sub.add_parser("dumps", help="a board's or vendor runtime's per-layer dumps beside FP32 and the simulation")
    p.add_argument("model")
    p.add_argument("--calib", required=True, help="calibration folder (the samples the dumps were made on)")
    p.add_argument("--dumps", required=True, metavar="DIR", help="per-sample dumps (see --format)")
    dump_tools = [name for name, tool in TOOLCHAINS.items() if tool.dumps is not None]
    p.add_argument("--format", default=None, choices=[*dump_tools, "npy"],
                   help="dump format (default: detected; npy = one .npz per sample keyed by ONNX tensor names)")
    for flag, default in (("--calib-method", "minmax"), ("--activations", None), ("--profile", None)):
        p.add_argument(flag, default=default, help="as for scan: how the simulation quantizes")
    p.add_argument("--prefixes", default=None, metavar="KIT",
                   help="--dumps holds the board's outputs of the prefix models of KIT (extract --prefixes): "
                        "DUMPS/<prefix>/<sample>.npy, gathered into npy dumps")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME:D0,D1,...")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--force", action="store_true", help="replace files in --out quantscan did not write")
    common(p)


def cmd_dumps(args: argparse.Namespace) -> int:
    from quantscan.device import compare_dumps

    out = Path(args.out) if args.out else default_out(args.model)
    refuse_out_in_data(out, args.calib, args.dumps)
    shapes, dims = split_input_shapes(args.input_shape)
    dumps: Any = args.dumps
    if args.prefixes:
        from quantscan.prefixes import board_dumps, read_kit

        if args.format not in (None, "npy"):
            raise UsageError(f"--prefixes: expected --format npy (prefix outputs are numpy files), found {args.format}")
        from quantscan.model import file_sha256

        kit = read_kit(args.prefixes)
        if Path(args.model).is_file() and file_sha256(Path(args.model)) != kit.model_sha256:
            raise UsageError(f"--prefixes: expected a kit cut from {args.model}, found one cut from {kit.model} "
                             "(another sha256): its tensors would be compared with another network's")
        dumps = board_dumps(kit, args.dumps)
    result = compare_dumps(args.model, args.calib, dumps, fmt=args.format, progress=progress_factory(args.quiet),
                           calib_method=args.calib_method, activations=args.activations, profile=args.profile,
                           input_shape=shapes, input_dims=dims, const=parse_const(args.const), threads=args.threads,
                           seed=args.seed)
    from quantscan.runfolder import claim_out_dir

    with claim_out_dir(out, force=args.force):
        result.save(out)
    table = result.table
    print(f"{result.format} dumps of {len(result.samples)} sample(s): {result.aligned_sites} of {result.sites} sites "
          f"aligned, {len(result.alignment.unmatched)} dump tensor(s) matched nothing")
    first = table[table["first_departure"].astype(bool)]
    if first.empty:
        print("  the device follows the simulation: quantization loss as simulated")
    else:
        row = first.iloc[0]
        print(f"  first departure: {row[Col.NODE]} ({row['tensor']}): sim<->device SQNR "
              f"{row['sim_device_sqnr_db']:.1f} dB, FP32<->sim {row['fp32_sim_sqnr_db']:.1f} dB")
    print(f"wrote {out}/ (device.csv, summary.md, report.html)")
    return EXIT_OK
