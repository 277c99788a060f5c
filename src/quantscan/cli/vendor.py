"""`quantscan vendor rknn|tpu-mlir MODEL ...`: the real vendor toolchain beside the scan.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quantscan.cli.args import EXIT_OK, common, default_out, non_negative_int, positive_int, refuse_out_in_data
from quantscan.columns import Col
from quantscan.errors import InternalError, UsageError
from quantscan.heldout import same_samples_text
from quantscan.toolchains import TOOLCHAINS
from quantscan.toolchains.folder import VendorRequest

# --- vendor: a real toolchain out of process, lined up with quantscan ----------------------------------


def vendor_parser(sub: Any) -> None:
    p = sub.add_parser("vendor", help="run a real vendor toolchain out of process, line it up with quantscan")
    p.add_argument("tool", choices=[name for name, tool in TOOLCHAINS.items() if tool.vendor is not None])
    p.add_argument("model")
    p.add_argument("--calib", required=True, help="calibration folder (the samples both tools get)")
    p.add_argument("--target", required=True,
                   help="chip, e.g. rk3588 or bm1684x (also the quantscan profile)")
    p.add_argument("--python", default=None, metavar="PATH",
                   help="the vendor's Python (default: $QUANTSCAN_RKNN_PYTHON, venv-rknn nearby, python3)")
    p.add_argument("--limit", type=positive_int, default=None, help="use the first N samples")
    p.add_argument("--analysis-samples", type=non_negative_int, default=None, metavar="N",
                   help="rknn: samples through accuracy_analysis (default: all; each one is slow); "
                        "tpu-mlir dumps every sample")
    p.add_argument("--plan", default=None, metavar="plan.json",
                   help="also apply a bisect plan through the vendor's mixed precision (RKNN hybrid "
                        "quantization, a tpu-mlir qtable), report what it reaches")
    p.add_argument("--calib-method", choices=["kl", "minmax"], default=None,
                   help="tpu-mlir: its run_calibration's thresholds, KL (its default; quantscan then scans with "
                        "entropy) or minmax (use_max; quantscan minmax): the same kind of ranges on both sides")
    p.add_argument("--force", action="store_true", help="replace files in --out quantscan did not write")
    common(p)


def _run(args: argparse.Namespace, out: Path, say: Any) -> Any:
    """The tool's run, through its folder's entry point (RKNN: build, simulator, accuracy_analysis;
    tpu-mlir: transform .. model_runner); each tool refuses the options it does not take."""
    run = TOOLCHAINS[args.tool].vendor
    if run is None:  # the parser offers only tools with a vendor run: ours to fix, not the user's
        raise InternalError(f"vendor: {args.tool} was offered but its folder has no vendor run")
    from quantscan.api import scan  # the scan beside the toolkit: onnxruntime and pandas, only when it runs

    request = VendorRequest(target=args.target, out=out, scan=scan, python=args.python, limit=args.limit,
                            analysis_samples=args.analysis_samples, plan=args.plan, threads=args.threads,
                            progress=say, calib_method=args.calib_method)
    return run(args.model, args.calib, request)


def plan_warnings(plan: dict[str, Any], tool: str) -> list[str]:
    """One line per kind of planned site the toolchain did not run as asked: sites it has no name for
    (`warning`; the list is in vendor.json), and sites its own layer table shows at int8 (`honoured`
    False: read back, never inferred). A list `dropped` (tpu-mlir: sites none of whose ops it knows) is
    said in one line too; RKNN's `dropped` maps a site to the kernel tensors step 1 folded away (a Conv
    before its BatchNormalization), which the site runs without: no warning."""
    lines = [str(plan["warning"])] if plan.get("warning") else []
    dropped = plan.get("dropped")
    if isinstance(dropped, list) and dropped:
        lines.append(f"{len(dropped)} planned site(s) name no op {tool} knows (every tensor of the kernel "
                     f"vanished in conversion), so they stayed int8: {', '.join(map(str, dropped))}")
    rows = [h for h in plan.get("honoured") or [] if isinstance(h, dict)]
    at_int8 = [str(h.get(Col.NODE)) for h in rows if h.get("honoured") is False]
    if at_int8:
        lines.append(f"{len(at_int8)} planned site(s) ran below the planned precision in {tool}'s layer table "
                     f"(vendor.json plan.honoured): {', '.join(at_int8)}")
    return lines


def cmd_vendor(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else default_out(args.model) / f"vendor-{args.tool}"
    refuse_out_in_data(out, args.calib)
    from quantscan.runfolder import claim_out_dir

    def say(message: str) -> None:
        if not args.quiet:
            print(f"quantscan vendor: {message}", file=sys.stderr)

    from quantscan.model import ensure_not_quantized, load_model

    loaded = load_model(args.model)
    ensure_not_quantized(loaded.proto, loaded.path.name)  # before the folder is claimed and samples written
    with claim_out_dir(out, force=args.force):
        run = _run(args, out, say)
    output, qs, vendor = run.headline
    print(f"{run.tool} {run.version} ({run.target}): stage reached {run.stage_reached}"
          + (f", stopped in {run.error['stage']}: {run.error['message']}" if run.error else ""))
    if output:
        print(f"  output '{output}' cosine: quantscan {qs:.5f}, {run.tool} simulator {vendor:.5f} "
              f"(delta {vendor - qs:+.5f})")
    loss = ", ".join(f"{k} {v}" for k, v in sorted(run.loss_counts().items()))
    print(f"  {len(run.table)} vendor layers ({loss or 'no per-layer figures'}); placement mismatches: "
          f"{run.unexplained_placements} unexplained, {run.explained_placements} explained")
    if run.plan is not None:
        got = ", ".join(f"{k} {v:.5f}" for k, v in run.plan["vendor_output_cosine"].items())
        print(f"  plan {run.plan['plan']}: quantscan claims cosine {run.plan['quantscan_claimed_cosine']:.5f}, "
              f"{run.tool} mixed precision gives {got or 'nothing (' + str(run.plan['error']) + ')'} on all samples")
        if isinstance(run.plan.get("held_out"), dict):
            print(f"    {same_samples_text(run.plan['held_out'], run.tool)}")
        for line in plan_warnings(run.plan, run.tool):
            print(f"quantscan: warning: {line}", file=sys.stderr)
    print(f"wrote {out}/ (vendor.csv, vendor_findings.csv, vendor.json, {Path(run.log).name}, quantscan/)")
    if not run.stages:  # the toolkit never ran: an empty vendor.csv is no comparison (CONTRACT: not exit 0)
        raise UsageError(f"vendor {args.tool}: expected the toolkit to run, found it never reached a stage "
                         f"({(run.error or {}).get('message', 'no result')}); see {run.log}")
    return EXIT_OK
