"""The command line's dispatch: the parser, the table of one module per command, exit codes.

Every command builds API objects and renders what they return. Exit codes (CONTRACT.md): 0 done,
1 a user threshold failed, 2 bad input or usage (one line on stderr, no traceback unless --debug),
3 an internal error (a quantscan bug: one line naming the file that holds the traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import errno
import os
import sys
import tempfile
import traceback
import warnings
from collections.abc import Sequence

from quantscan.cli.args import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Parser,
    common,
    data_options,
    executor_options,
    positive_int,
    task_options,
)
from quantscan.cli.bisect import bisect_parser, cmd_bisect
from quantscan.cli.bundle import cmd_bundle
from quantscan.cli.calib_advice import cmd_calib_advice
from quantscan.cli.case import case_parser, cmd_case
from quantscan.cli.check import cmd_check
from quantscan.cli.compare import cmd_compare, compare_parser
from quantscan.cli.cost import cmd_cost, cost_parser
from quantscan.cli.dumps import cmd_dumps, dumps_parser
from quantscan.cli.extract import cmd_extract, extract_parser
from quantscan.cli.log import cmd_log, log_parser
from quantscan.cli.overlay import cmd_overlay
from quantscan.cli.profiles import cmd_profiles
from quantscan.cli.report import cmd_report
from quantscan.cli.rewrite import cmd_rewrite, rewrite_parser
from quantscan.cli.scan import cmd_scan
from quantscan.cli.vendor import cmd_vendor, vendor_parser
from quantscan.errors import QuantscanError, UsageError

COMMANDS = ("scan", "calib-advice", "check", "rewrite", "compare", "extract", "bisect", "report", "profiles",
            "bundle", "overlay", "log", "case", "vendor", "dumps", "cost")


def build_parser() -> argparse.ArgumentParser:
    from quantscan import __version__

    parser = Parser(prog="quantscan", description="int8 sensitivity and NPU compatibility for ONNX models")
    parser.add_argument("--version", action="version", version=f"quantscan {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    scan = sub.add_parser("scan", help="per-layer int8 sensitivity (the default command)")
    scan.add_argument("model")
    data_options(scan)
    task_options(scan)
    scan.add_argument("--cases", default=None, metavar="DIR", help="case library matched when --profile is given")
    common(scan)
    scan.add_argument("--gain-candidates", default=None, metavar="N|all",
                      help="sites per ordering whose output gain is measured to rank by impact (default 16; "
                           "all: every site, the ranking without a candidate rule)")
    scan.add_argument("--no-gain", action="store_true", help="skip the output-gain measurement (= --gain-candidates 0)")
    scan.add_argument("--no-isolated-split", action="store_true",
                      help="skip the weight-only / activation-only isolated twins (layers.csv isolated_weight_only_*, "
                           "isolated_act_only_*): two more twins per weighted site in the evaluation pass")
    scan.add_argument("--no-recover-check", action="store_true",
                      help="skip measuring bias correction (the fix summary.md puts first when it helps)")
    scan.add_argument("--gain-samples", type=int, default=None, metavar="N",
                      help="evaluation samples the output gain is measured on: those that carry the most all-int8 "
                           "output error (default 8; 0: all)")
    executor_options(scan)
    scan.add_argument("--calib-advice", action="store_true",
                      help="also write calib_advice.csv: is the calibration set big enough, which samples set ranges")
    advice = sub.add_parser("calib-advice", help="is the calibration set big enough, which samples decide ranges")
    advice.add_argument("model")
    data_options(advice)
    common(advice)
    advice.add_argument("--pick", type=positive_int, default=None, metavar="N",
                        help="copy the N samples that best reproduce the full set's scales to OUT/picked/")
    check = sub.add_parser("check", help="structural compatibility with chip profiles")
    check.add_argument("model")
    check.add_argument("--profile", action="append", default=[])
    check.add_argument("--fail-on", choices=["error", "warn"], default=None)
    check.add_argument("--input-shape", action="append", default=[], metavar="NAME:D0,D1,...")
    check.add_argument("--cases", default=None, metavar="DIR", help="case library (default ~/.quantscan/cases)")
    check.add_argument("--force", action="store_true", help="replace files in --out quantscan did not write")
    common(check)
    sub.add_parser("profiles", help="list shipped chip profiles")
    report = sub.add_parser("report", help="rebuild report.html from a run folder")
    report.add_argument("run_dir")
    report.add_argument("--debug", action="store_true")
    rewrite_parser(sub)
    compare_parser(sub)
    extract_parser(sub)
    bisect_parser(sub)
    vendor_parser(sub)
    dumps_parser(sub)
    bundle = sub.add_parser("bundle", help="zip a run folder with rewritten/extracted models for a vendor")
    bundle.add_argument("run_dir")
    bundle.add_argument("--include", nargs="+", default=[], metavar="FILE",
                        help="models to add (their .rewrite.json / .inputs.npz / .expected.npz come along)")
    bundle.add_argument("-o", "--output", dest="bundle_out", required=True)
    bundle.add_argument("--force", action="store_true", help="replace an existing -o file quantscan did not write")
    bundle.add_argument("--debug", action="store_true")
    overlay = sub.add_parser("overlay", help="per-node SQNR/gain/findings as Model Explorer node data")
    overlay.add_argument("run_dir")
    overlay.add_argument("-o", "--output", dest="overlay_out", default="nodes.json",
                         help="main node-data file (cumulative SQNR); other metrics go beside it")
    overlay.add_argument("--force", action="store_true", help="replace -o files quantscan did not write")
    overlay.add_argument("--debug", action="store_true")
    case_parser(sub)
    log_parser(sub)
    cost_parser(sub)
    return parser


HANDLERS = {
    "scan": cmd_scan,
    "calib-advice": cmd_calib_advice,
    "check": cmd_check,
    "profiles": cmd_profiles,
    "rewrite": cmd_rewrite,
    "report": cmd_report,
    "compare": cmd_compare,
    "extract": cmd_extract,
    "bisect": cmd_bisect,
    "case": cmd_case,
    "bundle": cmd_bundle,
    "overlay": cmd_overlay,
    "log": cmd_log,
    "vendor": cmd_vendor,
    "dumps": cmd_dumps,
    "cost": cmd_cost,
}


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """`quantscan MODEL --calib DIR` means `quantscan scan MODEL --calib DIR`.

    Only a first word that is a command name selects that command, so a model file named like a
    command is reached with the explicit `scan` form (CONTRACT.md).
    """
    args = list(argv)
    if not args or args[0] in ("-h", "--help", "--version") or args[0] in COMMANDS:
        return args
    _refuse_typo(args[0])
    return ["scan", *args]


def _refuse_typo(word: str) -> None:
    """`quantscan chek MODEL` is a slip for `check`, not a scan of a model named "chek".

    Only a word that names no existing file and is close to a command is refused, so a real model
    file keeps the short `quantscan MODEL` form.
    """
    if word.startswith("-") or os.path.exists(word):
        return
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    if close:
        raise UsageError(f"unknown command {word!r} (and no file of that name); did you mean {close[0]!r}?")


def _crash_report(exc: BaseException, raw: Sequence[str]) -> str:
    """Write the traceback of a quantscan bug to a file and return its path (the one line names it).

    The temp dir, not the run folder: a crash may come from the run folder itself, and the file must
    exist whatever state the out dir is in.
    """
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    fd, name = tempfile.mkstemp(prefix=f"quantscan-crash-{stamp}-", suffix=".txt")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("quantscan " + " ".join(raw) + "\n\n")
        fh.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    return name


def _internal_error_line(exc: BaseException, raw: Sequence[str]) -> str:
    try:
        where = f"the full traceback is in {_crash_report(exc, raw)}"
    except OSError:
        where = "the traceback could not be written to the temp dir"
    what = " ".join(str(exc).split())[:200] or "no message"
    return (f"quantscan: internal error ({type(exc).__name__}: {what}); this is a quantscan bug, please report "
            f"it; {where}; rerun with --debug to see it here")


ENVIRONMENT_ERRNOS = frozenset({
    errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.ELOOP,
    errno.ENAMETOOLONG, errno.EMFILE, errno.ENFILE, errno.EIO, errno.ENOTDIR, errno.EISDIR, errno.EXDEV,
})
"""OSErrors the user's environment causes (permissions, a read-only or full disk, a symlink loop, a
path too long): bad input to fix on their side (exit 2, one line), not a quantscan bug (exit 3)."""


def _environment_line(exc: OSError) -> str:
    """`<what the system said>: <path>` and what it means for the user, on one line."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None) or "a file"
    hint = {errno.ENOSPC: "free some space (nothing was half written)", errno.EDQUOT: "free some space",
            errno.EFBIG: "the file size limit was reached (nothing was half written)",
            errno.ELOOP: "a symbolic link points back at itself", errno.EROFS: "choose a writable --out",
            errno.EACCES: "check the permissions", errno.EPERM: "check the permissions"}.get(exc.errno or 0, "")
    return " ".join(f"expected a usable file system, found {exc.strerror or exc} at {where}"
                    f"{'; ' + hint if hint else ''}".split())


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in raw
    try:
        args = build_parser().parse_args(normalize_argv(raw))
        if args.command is None:
            build_parser().print_help()
            return EXIT_BAD_INPUT
        handler = HANDLERS.get(args.command)
        if handler is None:
            raise UsageError(f"'{args.command}' is not available in this version")
        with warnings.catch_warnings():
            if not debug:  # numpy/onnx warnings would add lines around the contract's one-line error
                warnings.simplefilter("ignore")
            return handler(args)
    except KeyboardInterrupt:
        print("quantscan: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except QuantscanError as exc:
        if debug:  # the traceback, but the exit code stays the contract's (a script keys on 2, not 1)
            traceback.print_exc(file=sys.stderr)
        print("quantscan: error: " + " ".join(str(exc).split()), file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        if debug:  # the traceback, the contract's exit code all the same
            traceback.print_exc(file=sys.stderr)
        if exc.errno in ENVIRONMENT_ERRNOS:
            print("quantscan: error: " + _environment_line(exc), file=sys.stderr)
            return EXIT_BAD_INPUT
        print(_internal_error_line(exc, raw), file=sys.stderr)
        return EXIT_INTERNAL
    except Exception as exc:  # every other exception is a quantscan bug: exit 3, never a bare traceback
        if debug:
            traceback.print_exc(file=sys.stderr)
        if isinstance(exc, RuntimeError) and str(exc).startswith("Symlink loop from"):  # Path.resolve (3.11)
            print(f"quantscan: error: expected a path without a symbolic link loop, found {str(exc)[18:]}",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        print(_internal_error_line(exc, raw), file=sys.stderr)
        return EXIT_INTERNAL
