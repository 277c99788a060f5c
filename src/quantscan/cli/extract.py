"""`quantscan extract MODEL --node NAME -o OUT`: the minimal subgraph around a node.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quantscan.cli.args import (
    EXIT_OK,
    common,
    non_negative_int,
    parse_const,
    parse_input_shape,
    positive_float,
    positive_int,
)
from quantscan.errors import UsageError


def extract_parser(sub: Any) -> None:
    p = sub.add_parser("extract", help="minimal subgraph around a node, with its real inputs")
    p.add_argument("model")
    p.add_argument("--node", default=None, help="node (or tensor) name; optional with --until-fails")
    p.add_argument("--context", type=non_negative_int, default=1, help="producer depth")
    p.add_argument("--calib", default=None, help="data: saves the subgraph's real inputs beside it")
    p.add_argument("--samples", type=positive_int, default=8,
                   help="how many samples' inputs to keep beside the model (default 8)")
    p.add_argument("--run", default=None, metavar="RUN_DIR",
                   help="a scan's run folder: the sidecar .extract.json records the kernel's finding there")
    p.add_argument("--worst", default=None, metavar="RUN_DIR",
                   help="keep the samples that scan found worst by output cosine (implies --run RUN_DIR)")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME:D0,D1,...")
    p.add_argument("--until-fails", default=None, metavar="CMD",
                   help="shrink while CMD (with {model} replaced) keeps failing (exit != 0)")
    p.add_argument("--fail-regex", default=None, help="with --until-fails: output must also match this")
    p.add_argument("--timeout", type=positive_float, default=None, help="with --until-fails: seconds per try")
    p.add_argument("--prefixes", action="store_true",
                   help="write the first-N-kernel models (one per kernel boundary) into the -o folder, for "
                        "compilers that cannot dump layers; with --calib also their inputs and FP32 outputs")
    p.add_argument("--every", type=positive_int, default=1, metavar="K",
                   help="with --prefixes: a prefix at every K-th kernel (and the last one)")
    p.add_argument("-o", "--output-model", dest="output_model", required=True,
                   help="the extracted model; with --prefixes, the kit's folder")
    p.add_argument("--force", action="store_true", help="replace an existing -o file quantscan did not write")
    common(p)


def cmd_extract(args: argparse.Namespace) -> int:
    from quantscan.extract import (
        command_predicate,
        extract,
        save_inputs,
        save_samples,
        until_fails,
        worst_sample_indices,
        write_record,
    )

    consts, shapes = parse_const(args.const), parse_input_shape(args.input_shape)
    out = Path(args.output_model)
    if args.prefixes:
        return _prefix_kit(args, out, consts, shapes)
    if args.until_fails is None:
        if not args.node:
            raise UsageError("extract: expected --node NAME (or --until-fails CMD), found neither")
        result = extract(args.model, args.node, context=args.context, calib=args.calib, consts=consts,
                         input_shapes=shapes, seed=args.seed)
        result.save(out, force=args.force)
        print(f"wrote {out} ({len(result.model.graph.node)} nodes, kernel {result.kernel_name})")
        if args.worst and not args.calib:
            raise UsageError("--worst: expected --calib DIR (the data the scan evaluated), found none")
        saved = None
        if args.calib:
            picked = worst_sample_indices(args.worst) if args.worst else None
            saved = save_samples(result, args.calib, out, samples=picked, count=args.samples, consts=consts)
            note = f" ({saved.note})" if saved.note else ""
            print(f"wrote {saved.inputs_path} and {saved.expected_path}: {len(saved.indices)} sample(s){note}")
        record = write_record(result, out, saved, run_dir=args.worst or args.run)
        print(f"wrote {record}")
        return EXIT_OK
    start = extract(args.model, args.node, context=args.context).nodes if args.node else None
    predicate = command_predicate(args.until_fails, timeout=args.timeout, fail_regex=args.fail_regex)

    def show(record: Any) -> None:
        if not args.quiet:
            print(f"  try {record.index}: {record.size} nodes, {record.verdict}", file=sys.stderr)

    shrunk = until_fails(args.model, predicate, nodes=start, progress=show, calib=args.calib, consts=consts,
                         input_shapes=shapes, seed=args.seed)
    shrunk.save(out, force=args.force)
    from quantscan.runfolder import atomic_write_text

    atomic_write_text(Path(str(out) + ".log"), "\n".join(shrunk.log_lines()) + "\n")
    print(f"wrote {out} ({len(shrunk.nodes)} nodes after {shrunk.n_tries} tries) and {out}.log")
    if args.calib:
        written = save_inputs(shrunk, args.calib, out, consts=consts)
        print("wrote " + " and ".join(str(p) for p in written))
    return EXIT_OK


def _prefix_kit(args: argparse.Namespace, out: Path, consts: dict[str, float], shapes: dict[str, Any]) -> int:
    """`extract MODEL --prefixes [--every K] [--calib DIR] -o DIR`: the prefix kit (quantscan.prefixes)."""
    from quantscan.prefixes import PREFIXES_JSON, write_kit
    from quantscan.runfolder import claim_out_dir

    if args.node or args.until_fails:
        raise UsageError("extract --prefixes: expected no --node/--until-fails (prefixes cover every kernel), "
                         f"found {'--node' if args.node else '--until-fails'}")
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o: expected a folder for --prefixes, found a file at {out}")
    with claim_out_dir(out, force=args.force):
        kit = write_kit(args.model, out, every=args.every, calib=args.calib, samples=args.samples, consts=consts,
                        input_shapes=shapes, seed=args.seed)
    said = f", inputs and FP32 outputs of {len(kit.samples)} sample(s)" if kit.samples else ""
    print(f"wrote {out}/ ({len(kit.prefixes)} prefix models of {kit.kernels} kernels{said}, {PREFIXES_JSON})")
    print(f"  compile and run each prefix on the board, save its output as OUTPUTS/<prefix>/<sample>.npy "
          f"(inputs: {out}/inputs/<sample>.npz), then: quantscan dumps {args.model} --calib CALIB "
          f"--dumps OUTPUTS --format npy --prefixes {out}")
    return EXIT_OK
