"""The command line: the only module that parses arguments, prints, or exits.

Every command builds API objects and renders what they return. Exit codes (CONTRACT.md): 0 done,
1 a user threshold failed, 2 bad input or usage (one line on stderr, no traceback unless --debug),
3 an internal error (a quantscan bug: one line naming the file that holds the traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import errno
import math
import os
import sys
import tempfile
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantscan.columns import Col
from quantscan.errors import QuantscanError, UsageError

COMMANDS = ("scan", "calib-advice", "check", "rewrite", "compare", "extract", "bisect", "report", "profiles",
            "bundle", "overlay", "log", "case", "vendor", "dumps")
EXIT_OK, EXIT_THRESHOLD, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; make its message the contract's one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


# --- flag parsing --------------------------------------------------------------------------------------


def _positive_int(raw: str) -> int:
    """`--limit`, `--batch-size`, `--threads`, `--opset`: a count, so at least 1."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {raw!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {raw!r}")
    return value


def _non_negative_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, found {raw!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, found {raw!r}")
    return value


def _finite(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, found {raw!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, found {raw!r}")
    return value


def _positive_float(raw: str) -> float:
    value = _finite(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, found {raw!r}")
    return value


def _cosine_target(raw: str) -> float:
    """A cosine target a plan can reach: in (0, 1] (`--target-cosine 99` is a slip for 0.99)."""
    value = _finite(raw)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a cosine in (0, 1], found {raw!r}")
    return value


def _fraction(raw: str) -> float:
    """`--target-top1`: an agreement rate in [0, 1]."""
    value = _finite(raw)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], found {raw!r}")
    return value


def split_input_shapes(values: Sequence[str]) -> tuple[dict[str, list[int]], list[str]]:
    """`--input-shape` takes full shapes (`NAME:1,3,224,224`) and dim settings (`x:0=4`, `batch=8`)."""
    settings = [v for v in values if "=" in v]
    return parse_input_shape([v for v in values if "=" not in v]), settings


def parse_input_shape(values: Sequence[str]) -> dict[str, list[int]]:
    """`NAME:1,3,224,224` (repeatable)."""
    shapes: dict[str, list[int]] = {}
    for raw in values:
        name, sep, dims = raw.rpartition(":")
        try:
            parsed = [int(d) for d in dims.split(",")]
        except ValueError:
            parsed = []
        if not sep or not name or not parsed or any(d <= 0 for d in parsed):
            raise UsageError(f"--input-shape: expected NAME:D0,D1,... with positive integers, found {raw!r}")
        shapes[name] = parsed
    return shapes


def parse_const(values: Sequence[str]) -> dict[str, float]:
    """`NAME=VALUE` (repeatable): an input the data does not cover, filled with VALUE."""
    consts: dict[str, float] = {}
    for raw in values:
        name, sep, value = raw.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not name or math.isnan(number):
            raise UsageError(f"--const: expected NAME=NUMBER, found {raw!r}")
        consts[name] = number
    return consts


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="run folder (default reports/<model stem>/)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--threads", type=_positive_int, default=None, help="onnxruntime intra-op threads")
    p.add_argument("--seed", type=int, default=0)


def _data_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calib", required=True, help="calibration folder (images + preprocess.json, or .npy/.npz)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME:D0,D1,... | INPUT:AXIS=V | batch=V",
                   help="full shape, or a dim setting in the contract's syntax (repeatable)")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--state", action="append", default=[], metavar="OUT=IN",
                   help="feed output OUT back as input IN of the next sample, in file order (recurrent models)")
    p.add_argument("--limit", type=_positive_int, default=None, help="use the first N samples")
    p.add_argument("--eval", default=None, help="separate evaluation folder (default: the calibration set)")
    p.add_argument("--calib-method", default="minmax")
    p.add_argument("--activations", default=None, metavar="uint8|int8",
                   help="activation scheme (default: the --profile's, else uint8)")
    p.add_argument("--output", action="append", default=[], help="graph output for the headline metric")
    p.add_argument("--save-qdq", default=None, help="write the fake-quant model here")
    p.add_argument("--profile", action="append", default=[], help="chip profile name or TOML path")
    p.add_argument("--fail-below-cosine", type=_finite, default=None)
    p.add_argument("--batch-size", type=_positive_int, default=None,
                   help="samples per run when the batch dim is free (default: largest up to 8 fitting --max-memory)")
    p.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="memory budget, e.g. 8G or 512M (default: half the available RAM)")
    p.add_argument("--preprocess", default=None, help="preprocess.json for an image folder")
    p.add_argument("--layout", default=None)
    p.add_argument("--channel-order", default=None)
    p.add_argument("--scale", type=_positive_float, default=None)
    p.add_argument("--mean", default=None, help="comma-separated per-channel mean")
    p.add_argument("--std", default=None, help="comma-separated per-channel std")
    p.add_argument("--resize", default=None)
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.add_argument("--force", action="store_true", help="replace --out or --save-qdq files quantscan did not write")
    p.add_argument("--tensors", default="all", choices=["all", "sites"],
                   help="tensors.csv rows: every float tensor (default) or quantization points only (faster)")


def _task_options(p: argparse.ArgumentParser, plugins: bool = True) -> None:
    """Task metrics beside cosine (quantscan.taskmetrics); bisect takes no plugins (it cannot target them)."""
    p.add_argument("--task", default="auto", choices=["auto", "classify", "ctc", "mask", "box", "none"],
                   help="task metrics on the outputs (default: detected from output shape and files)")
    if plugins:
        p.add_argument("--metric", action="append", default=[], metavar="MODULE:FUNCTION",
                       help="plugin called with FP32 and int8 outputs per batch, returning named sums (repeatable)")
    p.add_argument("--charset", default=None,
                   help="CTC charset (.json list or PP-OCR .txt keys); default charset.json/.txt beside the data")
    p.add_argument("--mask-threshold", type=float, default=0.5, help="score-map threshold for --task mask IoU")


def build_parser() -> argparse.ArgumentParser:
    from quantscan import __version__

    parser = _Parser(prog="quantscan", description="int8 sensitivity and NPU compatibility for ONNX models")
    parser.add_argument("--version", action="version", version=f"quantscan {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    scan = sub.add_parser("scan", help="per-layer int8 sensitivity (the default command)")
    scan.add_argument("model")
    _data_options(scan)
    _task_options(scan)
    scan.add_argument("--cases", default=None, metavar="DIR", help="case library matched when --profile is given")
    _common(scan)
    scan.add_argument("--gain-candidates", default=None, metavar="N|all",
                      help="sites per ordering whose output gain is measured to rank by impact (default 16; "
                           "all: every site, the ranking without a candidate rule)")
    scan.add_argument("--no-gain", action="store_true", help="skip the output-gain measurement (= --gain-candidates 0)")
    scan.add_argument("--gain-samples", type=int, default=None, metavar="N",
                      help="evaluation samples the output gain is measured on: those that carry the most all-int8 "
                           "output error (default 8; 0: all)")
    scan.add_argument("--workers", type=_positive_int, default=1, metavar="N",
                      help="measure in N local processes over disjoint samples, merged exactly (capped by the CPUs)")
    scan.add_argument("--calib-advice", action="store_true",
                      help="also write calib_advice.csv: is the calibration set big enough, which samples set ranges")
    advice = sub.add_parser("calib-advice", help="is the calibration set big enough, which samples decide ranges")
    advice.add_argument("model")
    _data_options(advice)
    _common(advice)
    advice.add_argument("--pick", type=_positive_int, default=None, metavar="N",
                        help="copy the N samples that best reproduce the full set's scales to OUT/picked/")
    check = sub.add_parser("check", help="structural compatibility with chip profiles")
    check.add_argument("model")
    check.add_argument("--profile", action="append", default=[])
    check.add_argument("--fail-on", choices=["error", "warn"], default=None)
    check.add_argument("--input-shape", action="append", default=[], metavar="NAME:D0,D1,...")
    check.add_argument("--cases", default=None, metavar="DIR", help="case library (default ~/.quantscan/cases)")
    check.add_argument("--force", action="store_true", help="replace files in --out quantscan did not write")
    _common(check)
    sub.add_parser("profiles", help="list shipped chip profiles")
    report = sub.add_parser("report", help="rebuild report.html from a run folder")
    report.add_argument("run_dir")
    report.add_argument("--debug", action="store_true")
    _rewrite_parser(sub)
    _compare_parser(sub)
    _extract_parser(sub)
    _bisect_parser(sub)
    _vendor_parser(sub)
    _dumps_parser(sub)
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
    _case_parser(sub)
    _log_parser(sub)
    return parser


def _case_parser(sub: Any) -> None:
    case = sub.add_parser("case", help="the case library: rewrite recipes with their proofs, reused across models")
    actions = case.add_subparsers(dest="case_action", parser_class=_Parser, required=True)
    save = actions.add_parser("save", help="record a run (a scan of the rewritten model) as a case")
    save.add_argument("run_dir")
    save.add_argument("--note", required=True, help="what the problem was and why the recipe fixes it")
    save.add_argument("--rewrite", action="append", default=[], metavar="FILE",
                      help="rewrite record(s) (default: <model>.rewrite.json beside the run's model)")
    save.add_argument("--profile", default=None, help="chip profile (default: the run's --profile)")
    listing = actions.add_parser("list", help="the library's cases, one per line, id first")
    show = actions.add_parser("show", help="one case as JSON")
    show.add_argument("case_id")
    for p in (save, listing, show):
        p.add_argument("--cases", default=None, metavar="DIR",
                       help="library folder (default $QUANTSCAN_CASES or ~/.quantscan/cases)")
        p.add_argument("--debug", action="store_true")


def _bisect_parser(sub: Any) -> None:
    p = sub.add_parser("bisect", help="output gain per site + resumable bisection to a target")
    p.add_argument("model", nargs="?", default=None)
    _data_options(p)
    p.set_defaults(calib=None)
    for action in p._actions:
        if action.dest == "calib":
            action.required = False
    p.add_argument("--target", default=None, metavar="METRIC=VALUE",
                   help="e.g. top1=0.99, box=0.9, string=0.95, mask_iou=0.9, top5=0.99, cosine=0.995, sqnr=30")
    p.add_argument("--target-cosine", type=_cosine_target, default=None, help="in (0, 1]")
    p.add_argument("--target-sqnr", type=_finite, default=None, help="dB")
    p.add_argument("--target-top1", type=_fraction, default=None, help="in [0, 1]")
    p.add_argument("--fallback", default="float", choices=["float", "int16"])
    p.add_argument("--first-bad", action="store_true", help="find the first site (in topological order) that breaks it")
    p.add_argument("--session", default=None, help="session file (default <out>/session.json)")
    p.add_argument("--resume", default=None, metavar="FILE", help="continue a session without repeating steps")
    p.add_argument("--show", default=None, metavar="FILE", help="print where a session stands")
    p.add_argument("--keep-float", nargs="+", default=[], metavar="NAME")
    p.add_argument("--force-quant", nargs="+", default=[], metavar="NAME")
    p.add_argument("--loss-if-only", action="store_true")
    p.add_argument("--export", nargs="+", default=None, metavar="FORMAT",
                   help="onnxruntime rknn horizon tpu-mlir tidl tidl-rt (default: all)")
    _task_options(p, plugins=False)
    _common(p)


def _compare_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help="numeric comparison of two models on the same data")
    p.add_argument("model_a")
    p.add_argument("model_b")
    p.add_argument("--calib", default=None, help="data folder (default: 8 seeded random samples)")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME:D0,D1,...")
    p.add_argument("--limit", type=_positive_int, default=None)
    p.add_argument("--fail-below-cosine", type=_finite, default=None)
    p.add_argument("--force", action="store_true", help="replace files in --out quantscan did not write")
    _common(p)


def _extract_parser(sub: Any) -> None:
    p = sub.add_parser("extract", help="minimal subgraph around a node, with its real inputs")
    p.add_argument("model")
    p.add_argument("--node", default=None, help="node (or tensor) name; optional with --until-fails")
    p.add_argument("--context", type=_non_negative_int, default=1, help="producer depth")
    p.add_argument("--calib", default=None, help="data: saves the subgraph's real inputs beside it")
    p.add_argument("--samples", type=_positive_int, default=8,
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
    p.add_argument("--timeout", type=_positive_float, default=None, help="with --until-fails: seconds per try")
    p.add_argument("-o", "--output-model", dest="output_model", required=True)
    p.add_argument("--force", action="store_true", help="replace an existing -o file quantscan did not write")
    _common(p)


class _StepAction(argparse.Action):
    """Collect rewrite flags in command-line order: rewrites apply in the order the user wrote them."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        steps = list(getattr(namespace, "steps", None) or [])
        if self.const is not None:
            steps.append(self.const)
        else:
            steps.append(f"{self.dest}-{values}")
        namespace.steps = steps


class _SmoothAction(argparse.Action):
    """`--smooth [ALPHA]`: a step like the others, plus the alpha (None: chosen per site)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        namespace.steps = [*(getattr(namespace, "steps", None) or []), "smooth"]
        if values is not None:
            try:
                alpha = _finite(values)
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentError(self, str(exc)) from None
            if not 0 <= alpha <= 1:
                raise argparse.ArgumentError(self, f"expected ALPHA in [0, 1], found {values}")
            namespace.smooth_alpha = alpha


def _clamp_value(args: argparse.Namespace) -> float | None:
    """`--clamp-mask-value`, else None: the rewrite picks the smallest value its proof shows exact."""
    return None if args.clamp_mask_value is None else float(args.clamp_mask_value)


def _rewrite_parser(sub: Any) -> None:
    p = sub.add_parser("rewrite", help="equivalence rewrites with a numeric proof")
    p.add_argument("model")
    p.add_argument("--fold-bn", nargs=0, action=_StepAction, const="fold-bn", dest="fold_bn")
    p.add_argument("--decompose", action=_StepAction, choices=["hardswish", "hardsigmoid", "layernorm"])
    p.add_argument("--fuse", action=_StepAction, choices=["hardswish", "layernorm"])
    p.add_argument("--cleanup", nargs=0, action=_StepAction, const="cleanup", dest="cleanup")
    p.add_argument("--gelu-tanh", nargs=0, action=_StepAction, const="gelu-tanh", dest="gelu_tanh")
    p.add_argument("--clamp-mask", nargs=0, action=_StepAction, const="clamp-mask", dest="clamp_mask",
                   help="float-min/-inf attention-mask constants -> a finite value (proven on data)")
    p.add_argument("--clamp-mask-value", type=float, default=None, metavar="V",
                   help="the finite mask value --clamp-mask writes (default: the smallest of -100, -1000 "
                        "whose proof is exact on the data, else -1e4)")
    p.add_argument("--div-to-mul", nargs=0, action=_StepAction, const="div-to-mul", dest="div_to_mul",
                   help="Div by a constant -> Mul by its reciprocal")
    p.add_argument("--reciprocal", nargs=0, action=_StepAction, const="reciprocal", dest="reciprocal",
                   help="Reciprocal(x) -> Div(1, x) for chips that run Div but not Reciprocal")
    p.add_argument("--fix-ceil-mode", nargs=0, action=_StepAction, const="fix-ceil-mode", dest="fix_ceil_mode",
                   help="pooling ceil_mode=1 -> 0 with the extra end padding explicit")
    p.add_argument("--equalize", nargs=0, action=_StepAction, const="equalize", dest="equalize",
                   help="cross-layer equalization of Conv/Gemm/MatMul pairs (BN folded first); exact in FP32")
    p.add_argument("--smooth", nargs="?", action=_SmoothAction, metavar="ALPHA",
                   help="move per-channel activation ranges into the next layer's weights (needs --calib); "
                        "ALPHA in [0, 1], default: chosen per site")
    p.add_argument("--bias-correct", nargs=0, action=_StepAction, const="bias-correct", dest="bias_correct",
                   help="remove the int8 weights' mean output shift from each bias (needs --calib; approximate)")
    p.add_argument("--recover", action="store_true",
                   help="try --equalize, --smooth, --bias-correct; keep each only where the measured all-int8 "
                        "output cosine rises (needs --calib; writes OUT.recover.json)")
    p.add_argument("--profile", default=None, metavar="P", help="with --recover: measure under P's int8 scheme")
    p.add_argument("--fix-dim", action="append", default=[], metavar="SPEC",
                   help="INPUT:AXIS=V, DIMPARAM=V or batch=V (repeatable)")
    p.add_argument("--freeze-input", action="append", default=[], metavar="NAME=VALUE",
                   help="make input NAME the constant VALUE and fold what it decides (If, Shape, Where); repeatable")
    p.add_argument("--opset", type=_positive_int, default=None,
                   help="convert to this opset: up first, down last (opset-down)")
    p.add_argument("-o", "--output-model", dest="output_model", default=None)
    p.add_argument("--calib", default=None, help="data for the numeric proof (default: seeded random)")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--limit", type=_positive_int, default=None)
    p.add_argument("--tolerance", type=_positive_float, default=1e-4, help="max_abs / output range for exact rewrites")
    p.add_argument("--force", action="store_true",
                   help="write even when the proof fails, and replace an -o file quantscan did not write")
    p.add_argument("--all-for-profile", default=None, metavar="PROFILE",
                   help="apply every rewrite the compat findings for PROFILE suggest")
    p.add_argument("--case", default=None, metavar="ID", help="replay a library case's recipe (fresh proof)")
    p.add_argument("--cases", default=None, metavar="DIR", help="case library (default ~/.quantscan/cases)")
    p.set_defaults(steps=[], smooth_alpha=None)
    _common(p)


def _floats(raw: str | None, flag: str) -> list[float] | None:
    if raw is None:
        return None
    try:
        return [float(v) for v in raw.split(",")]
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated numbers, found {raw!r}") from None


def _progress_factory(quiet: bool) -> Any:
    from quantscan.scanning.options import no_progress

    if quiet or not sys.stderr.isatty():
        return no_progress
    from tqdm import tqdm

    def factory(desc: str, total: int | None) -> Any:
        return tqdm(total=total, desc=desc, unit="batch", leave=False, file=sys.stderr)

    return factory


def _refuse_out_in_data(out: Path, *data: str | None) -> None:
    """Our files written into a calibration folder would mix with the data (and be read as data next run)."""
    from quantscan.runfolder import out_inside_data

    for folder in data:
        if folder and out_inside_data(out, Path(folder)):
            raise UsageError(f"--out: expected a run folder outside the data folder {folder}, found {out}")


def default_out(model: str) -> Path:
    return Path("reports") / Path(model).stem


# --- commands ------------------------------------------------------------------------------------------


def _gain_option(args: argparse.Namespace) -> dict[str, int | str]:
    """--no-gain / --gain-candidates N / --gain-samples N as the scan's options (absent: the defaults)."""
    samples = {} if args.gain_samples is None else {"gain_samples": args.gain_samples}
    if args.no_gain:
        return {"gain_candidates": 0, **samples}
    if args.gain_candidates is None:
        return samples
    if args.gain_candidates == "all":
        return {"gain_candidates": "all", **samples}
    try:  # a negative count is refused with the API's own message (ScanOptions.validate)
        return {"gain_candidates": int(args.gain_candidates), **samples}
    except ValueError:
        raise UsageError(f"--gain-candidates: expected a non-negative integer or 'all', found "
                         f"{args.gain_candidates}") from None


def _sample_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options that say which samples feed the model and how (scan and calib-advice alike)."""
    from quantscan.calib.recurrent import parse_state

    overrides = {
        "layout": args.layout,
        "channel_order": args.channel_order,
        "scale": args.scale,
        "mean": _floats(args.mean, "--mean"),
        "std": _floats(args.std, "--std"),
        "resize": args.resize,
    }
    return {
        "calib_method": args.calib_method,
        "activations": args.activations,
        "input_shape": split_input_shapes(args.input_shape)[0],
        "input_dims": split_input_shapes(args.input_shape)[1],
        "const": parse_const(args.const),
        "state": parse_state(args.state),
        "limit": args.limit,
        "eval": args.eval,
        Col.OUTPUT: args.output,
        "preprocess": args.preprocess,
        "preprocess_overrides": {k: v for k, v in overrides.items() if v is not None},
        "threads": args.threads,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "max_memory": args.max_memory,
        "workers": args.workers,
        "save_qdq": args.save_qdq,
        "force": args.force,
        "profile": args.profile[0] if args.profile else None,
    }


def cmd_calib_advice(args: argparse.Namespace) -> int:
    from quantscan.api import calib_advice

    out = Path(args.out) if args.out else default_out(args.model)
    _refuse_out_in_data(out, args.calib, args.eval)
    advice = calib_advice(args.model, args.calib, pick=args.pick, out=out, progress=_progress_factory(args.quiet),
                          **_sample_options(args))
    print(advice.summary_line())
    print(f"  wrote {out / 'calib_advice.csv'}" + (f" and {out / 'picked'}/" if args.pick else ""))
    return EXIT_OK


def cmd_scan(args: argparse.Namespace) -> int:
    from quantscan.api import scan

    out = Path(args.out) if args.out else default_out(args.model)
    options: dict[str, Any] = {
        **_sample_options(args),
        "workers": args.workers,
        "calib_advice": args.calib_advice,
        "save_qdq": args.save_qdq,
        "no_report": args.no_report,
        "tensors": args.tensors,
        **_gain_option(args),
        "task": args.task,
        "metric": args.metric,
        "charset": args.charset,
        "mask_threshold": args.mask_threshold,
    }
    if len(args.profile) > 1:
        raise UsageError(f"scan: expected one --profile (the chip to simulate), found {len(args.profile)}; "
                         "compare several with `quantscan check MODEL --profile A --profile B`")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: expected a folder, found a file at {out}")
    _refuse_out_in_data(out, args.calib, args.eval)
    from quantscan.runfolder import claim_out_dir

    with claim_out_dir(out, force=args.force):
        result = scan(args.model, args.calib, out=out, progress=_progress_factory(args.quiet), **options)
    for warning in result.warnings:
        print(f"quantscan: warning: {warning}", file=sys.stderr)
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
              f"fold them first (`quantscan check {args.model}` names the rewrite flags)", file=sys.stderr)
    if head.metrics.task:
        print("  task: " + ", ".join(f"{k} {v:.4g}" for k, v in head.metrics.task.items()))
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
        _print_case_matches(result.compat.findings, args.cases)
    if args.fail_below_cosine is not None and not head.cosine >= args.fail_below_cosine:
        print(f"quantscan: output cosine {head.cosine:.5f} is below --fail-below-cosine "
              f"{args.fail_below_cosine}", file=sys.stderr)
        return EXIT_THRESHOLD
    return EXIT_OK


def cmd_profiles(args: argparse.Namespace) -> int:
    from quantscan.compat.profiles import list_profiles

    for info in list_profiles():
        fields = [getattr(info, "name", str(info))]
        for attr in ("vendor", "description"):
            value = getattr(info, attr, None)
            if value:
                fields.append(str(value))
        print("  ".join(fields))
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    from quantscan.compat.check import check
    from quantscan.model import load_model
    from quantscan.runfolder import claim_out_dir, refuse_inputs, write_csv

    out = Path(args.out) if args.out else default_out(args.model)
    refuse_inputs([out / "compat.csv", out / "partitions.csv"], [args.model], "--out")
    with claim_out_dir(out, force=args.force):
        loaded = load_model(args.model)
        profiles = args.profile or ["generic-npu"]
        shapes = parse_input_shape(args.input_shape)
        result = check(loaded.proto, profiles, input_shapes=shapes or None)
        write_csv(out / "compat.csv", result.findings)
        write_csv(out / "partitions.csv", result.partitions)
    findings = result.findings
    for profile in profiles:
        rows = findings[findings["profile"] == _profile_label(profile, findings)] if not findings.empty else findings
        counts = rows["severity"].value_counts().to_dict() if not rows.empty else {}
        print(f"{profile}: {counts.get('error', 0)} errors, {counts.get('warn', 0)} warnings, "
              f"{counts.get('info', 0)} notes")
    print(f"wrote {out}/compat.csv and partitions.csv")
    if result.fold_flags:
        print(f"fold the If nodes: quantscan rewrite {args.model} {' '.join(result.fold_flags)} -o OUT.onnx"
              + (" (VALUE/V: what you deploy with)" if any(f.endswith(("=V", "=VALUE")) for f in result.fold_flags)
                 else ""))
    _print_case_matches(findings, args.cases)
    if args.fail_on and result.fails(args.fail_on):
        return EXIT_THRESHOLD
    return EXIT_OK


def _print_case_matches(findings: Any, cases: str | None) -> None:
    """Library cases whose pattern this model's findings contain: the recipe that fixed it before."""
    from quantscan.cases import match_cases

    for match in match_cases(findings, cases):
        print(match.line())
        print(f"  replay: quantscan rewrite MODEL --case {match.case_id} -o OUT.onnx")


def cmd_case(args: argparse.Namespace) -> int:
    import json as _json

    from quantscan.cases import list_cases, load_case, save_case

    if args.case_action == "save":
        folder = save_case(args.run_dir, args.note, cases=args.cases, rewrite_records=args.rewrite,
                           profile=args.profile)
        case = load_case(folder.name, args.cases)
        print(f"saved case {case['id']} in {folder} (pattern: {len(case['pattern'])} finding kind(s), "
              f"recipe: {' + '.join(case['recipe'])})")
        return EXIT_OK
    if args.case_action == "list":
        for case in list_cases(args.cases):
            print(f"{case['id']}  {case.get('profile', '')}  {' + '.join(case.get('recipe', []))}  "
                  f"{case.get('note', '')}")
        return EXIT_OK
    print(_json.dumps(load_case(args.case_id, args.cases), indent=1))
    return EXIT_OK


def _profile_label(profile: str, findings: Any) -> str:
    if profile in set(findings["profile"]):
        return profile
    return Path(profile).stem


def _print_before_after(before: Any, after: Any, profile: str) -> None:
    """`--all-for-profile`: the check run again on the rewritten model, counts side by side."""
    from quantscan.compat.check import check

    rows = [check(m, [profile]).summary_rows()[0] for m in (before, after)]
    print(f"check {profile}: " + ", ".join(
        f"{key} {rows[0][key]} -> {rows[1][key]}" for key in ("errors", "warnings", "cpu_islands")))


def _free_sizes(model: str, calib: Any, given: list[str]) -> list[str]:
    """`--all-for-profile`: sizes for the free input dims (H, W, ...) from the data or the model's metadata,
    printed with their source; the dims neither sizes are named as the exact --fix-dim to add."""
    from quantscan.model import load_model
    from quantscan.rewrites.sizes import plan_sizes

    sizes = plan_sizes(load_model(model).proto, calib.samples() if calib is not None else None, given)
    for line in sizes.sources:
        print(f"  sizes {line}")
    for line in sizes.notes:
        print(f"  note: {line}")
    if sizes.missing:
        print("  add " + " ".join(f"--fix-dim {m}" for m in sizes.missing) + " (V: the size you deploy; "
              "neither the data" + ("" if calib is not None else " (no --calib)") + " nor the model's metadata "
              "gives it): without it the shapes that depend on it stay dynamic")
    return sizes.settings


def _cmd_recover(args: argparse.Namespace) -> int:
    """`rewrite --recover`: the measured loop of recover.py, one line per pass tried."""
    from quantscan.recover import recover

    if not args.calib:
        raise UsageError("rewrite --recover: expected --calib (the int8 cosine is measured on it), found none")
    if args.steps or args.all_for_profile or args.case:
        raise UsageError("rewrite --recover: expected no other rewrite flag (it chooses its own), found "
                         f"{', '.join(args.steps) or '--all-for-profile/--case'}")
    report = recover(args.model, args.calib, profile=args.profile, out=args.output_model, limit=args.limit,
                     tolerance=args.tolerance)
    print(f"all-int8 output cosine of '{report.output}' ({args.profile or 'default scheme'}): {report.baseline:.6f} "
          f"(noise floor {report.noise:.2g}: the change one float32 ulp on the weights makes)")
    for t in report.trials:
        measured = t.applied and t.proof_passed
        figures = f"{t.cosine_after:.6f} ({t.cosine_after - report.baseline:+.6f} vs the input)" if measured else ""
        verdict = "kept" if t.kept else (t.note or "dropped")
        print(f"  {' + '.join(t.recipe)}: {t.changes} sites, {figures + ', ' if figures else ''}{verdict}")
    kept = " + ".join(report.kept) or "nothing (the output is the input unchanged)"
    print(f"kept: {kept}; all-int8 cosine {report.baseline:.6f} -> {report.final:.6f}")
    if report.written:
        print(f"wrote {report.out}, {report.out}.recover.json and {report.out}.rewrite.json")
    return EXIT_OK


def cmd_rewrite(args: argparse.Namespace) -> int:
    if args.recover:
        return _cmd_recover(args)
    from quantscan.calib import load_calibration
    from quantscan.compat.rewrite_plan import plan_for_profile, split_applicable
    from quantscan.model import load_model
    from quantscan.rewrites.pipeline import rewrite

    steps = list(args.steps)
    fix_dims = list(args.fix_dim)
    if args.case:
        from quantscan.cases import recipe

        replay, case_opset = recipe(args.case, args.cases)
        steps += [s for s in replay if s not in steps]
        if args.opset is None and case_opset is not None:
            args.opset = case_opset
        print(f"case {args.case}: replaying {' + '.join(replay) or 'nothing'} with a fresh proof")
        steps, skipped = split_applicable(args.model, steps)
        for name in skipped:
            print(f"  {name}: applies nowhere in this model, skipped")
    calib = None
    if args.calib:
        from quantscan.model import graph_inputs
        from quantscan.rewrites.fix_dim import fix_dim

        loaded = load_model(args.model)
        consts = {**parse_const(args.freeze_input), **parse_const(args.const)}  # a frozen input needs no data
        specs = graph_inputs(fix_dim(loaded.proto, fix_dims).model) if fix_dims else loaded.inputs  # sized as asked
        calib = load_calibration(args.calib, specs, consts=consts, limit=args.limit)
    if args.all_for_profile:
        sizes = _free_sizes(args.model, calib, fix_dims)
        plan = plan_for_profile(args.model, args.all_for_profile, sizes)
        steps += [s.value for s in plan.rewrites if s not in steps]
        fix_dims += [d for d in plan.fix_dims if d not in fix_dims]
        if args.opset is None and plan.opset is not None:
            args.opset = plan.opset
        named = ([r.value for r in plan.rewrites] + [f"fix-dim {d}" for d in plan.fix_dims]
                 + ([f"opset-down {plan.opset}"] if plan.opset is not None else []))
        print(f"{args.all_for_profile} suggests: {', '.join(named) or 'nothing'}")
        for needed in plan.needs_value:
            if not any(needed.split()[1].startswith(f.split("=")[0] + "=") for f in args.freeze_input):
                print(f"  {needed}: give --freeze-input with the value you deploy with to fold it")
        steps, skipped = split_applicable(args.model, steps)
        for name in skipped:
            print(f"  {name}: applies nowhere in this model, skipped")
        if not steps and not fix_dims and args.opset is None and not args.freeze_input:
            print(f"nothing to rewrite for {args.all_for_profile}: no finding names a rewrite that applies")
            return EXIT_OK
    args.fix_dim = fix_dims
    if args.fix_dim and "fix-dim" not in steps:
        steps.insert(0, "fix-dim")
    if args.clamp_mask_value is not None and "clamp-mask" not in steps:
        steps.append("clamp-mask")
    if not steps and args.opset is None and not args.freeze_input:
        raise UsageError("rewrite: expected at least one of --fold-bn, --decompose, --fuse, --fix-dim, --cleanup, "
                         "--gelu-tanh, --clamp-mask, --div-to-mul, --reciprocal, --fix-ceil-mode, --freeze-input, "
                         "--equalize, --smooth, --bias-correct, --recover, --opset, --all-for-profile; "
                         "found none that applies")
    report = rewrite(args.model, steps, fix_dim=args.fix_dim, opset=args.opset, out=args.output_model,
                     calib=calib, seed=args.seed, limit=args.limit, tolerance=args.tolerance, force=args.force,
                     runner=None, clamp_mask_value=_clamp_value(args), freeze_input=args.freeze_input,
                     smooth_alpha=args.smooth_alpha)
    for step in report.steps:
        print(f"{step.rewrite}: {len(step.changes)} changes, {len(step.refusals)} left alone"
              + ("" if step.exact else " (approximate)") + (f" (no-op, skipped: {step.noop})" if step.noop else ""))
        for refusal in step.refusals[:5] if not step.noop else []:
            print(f"  - {refusal.node}: {refusal.reason}")
    for o in report.proof.outputs:
        print(f"proof '{o.output}': cosine {o.cosine:.8f}, max_abs {o.max_abs:.3g}, max_rel {o.max_rel:.3g} "
              f"({o.threshold}) {'ok' if o.passed else 'FAILED'}")
    print(f"proof data: {report.proof.data}")
    if report.written:
        print(f"wrote {report.out} and {report.out}.rewrite.json" if report.out else "wrote the model")
    if args.all_for_profile:
        _print_before_after(args.model, report.model, args.all_for_profile)
    if not report.passed:
        print("quantscan: the numeric proof failed its threshold"
              + ("; written anyway (--force)" if report.written else "; nothing written (use --force)"),
              file=sys.stderr)
        return EXIT_THRESHOLD
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from quantscan.compare import compare
    from quantscan.runner import Runner

    out = Path(args.out) if args.out else Path("reports") / f"{Path(args.model_a).stem}_vs_{Path(args.model_b).stem}"
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: expected a folder, found a file at {out}")
    _refuse_out_in_data(out, args.calib)
    from quantscan.runfolder import RUN_NAMES, claim_out_dir, refuse_inputs

    refuse_inputs([out / n for n in RUN_NAMES], [args.model_a, args.model_b], "--out")
    with claim_out_dir(out, force=args.force):
        result = compare(args.model_a, args.model_b, args.calib, limit=args.limit, seed=args.seed,
                         runner=Runner(threads=args.threads), consts=parse_const(args.const),
                         input_shapes=parse_input_shape(args.input_shape), out=out)
    for warning in result.warnings:
        print(f"quantscan: warning: {warning}", file=sys.stderr)
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


def cmd_bisect(args: argparse.Namespace) -> int:
    if args.show:
        return _show_session(Path(args.show))
    from quantscan.api import run_bisect
    from quantscan.bisect.driver import progress_of
    from quantscan.calib.recurrent import parse_state

    model = args.model
    if model is None and args.resume is None:
        raise UsageError("bisect: expected MODEL --calib DIR --target-cosine X, or --resume FILE / --show FILE")
    out = Path(args.out) if args.out else (default_out(model) if model else Path(args.resume).parent)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: expected a folder, found a file at {out}")
    _refuse_out_in_data(out, args.calib, args.eval)
    overrides = {"layout": args.layout, "channel_order": args.channel_order, "scale": args.scale,
                 "mean": _floats(args.mean, "--mean"), "std": _floats(args.std, "--std"), "resize": args.resize}
    options: dict[str, Any] = {"threads": args.threads, "seed": args.seed, "force": args.force}
    if args.resume is None:
        shapes, dims = split_input_shapes(args.input_shape)
        options.update({
            "calib_method": args.calib_method, "activations": args.activations, "input_shape": shapes,
            "input_dims": dims, "const": parse_const(args.const), "state": parse_state(args.state),
            "limit": args.limit, "eval": args.eval,
            Col.OUTPUT: args.output, "preprocess": args.preprocess, "batch_size": args.batch_size,
            "max_memory": args.max_memory,
            "preprocess_overrides": {k: v for k, v in overrides.items() if v is not None},
            "task": args.task, "charset": args.charset, "mask_threshold": args.mask_threshold,
            "profile": args.profile[0] if args.profile else None,
        })
        if len(args.profile) > 1:
            raise UsageError(f"bisect: expected one --profile (the chip to simulate), found {len(args.profile)}")

    def on_step(step: Any, machine: Any) -> None:
        if not args.quiet:
            verdict = "meets" if step.passed else "misses"
            print(f"  step {step.phase}: {len(step.sites)} float sites -> {step.value:.5f} ({verdict} target); "
                  f"{progress_of(machine).line()}", file=sys.stderr)

    from quantscan.runfolder import check_model_target, claim_out_dir

    if args.save_qdq:  # refused before the bisection, not after it
        check_model_target(Path(args.save_qdq), flag="--save-qdq", protect=[model], force=args.force)
    try:
        with claim_out_dir(out, force=args.force):
            result = run_bisect(
                model, args.calib, target_cosine=args.target_cosine, target_sqnr=args.target_sqnr,
                target_top1=args.target_top1, target=args.target, fallback=args.fallback,
                mode="first_bad" if args.first_bad else "search",
                session=args.session, resume=args.resume, keep_float=args.keep_float, force_quant=args.force_quant,
                loss_if_only=args.loss_if_only, out=out, save_qdq=args.save_qdq, exports=args.export,
                progress=_progress_factory(args.quiet), on_step=on_step, **options,
            )
    except KeyboardInterrupt:
        where = Path(args.session or args.resume or out / "session.json")
        if where.is_file():
            print(f"quantscan: interrupted; resume with: quantscan bisect --resume {where}", file=sys.stderr)
        else:  # interrupted before the first step was saved: naming a file that does not exist misleads
            print("quantscan: interrupted before the first step was saved; nothing to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    for warning in result.warnings:
        print(f"quantscan: warning: {warning}", file=sys.stderr)
    from quantscan.bisect.state import METRICS

    plan = result.plan
    metric = plan.target.metric

    def value(metrics: dict[str, float] | None) -> str:
        got = (metrics or {}).get(METRICS.get(metric, metric))
        return f"{got:.5f}" if isinstance(got, float) else str(got)

    print(f"{plan.status}: {len(plan.sites)} site(s) kept {args.fallback}; {metric} {value(plan.achieved)} "
          f"(all-int8 {value(plan.all_int8)}, all-float {value(plan.all_float)}); "
          f"{plan.evaluations} evaluations in {plan.seconds} s")
    for site in plan.sites:
        print(f"  {site.node} -> {site.precision}")
    print(f"wrote {out}/ (" + ", ".join(sorted(p.name for p in result.files.values())) + ")")
    return EXIT_OK if result.reached else EXIT_THRESHOLD


def _show_session(path: Path) -> int:
    from quantscan.bisect import BisectSession, describe

    info = describe(BisectSession.load(path))
    print(f"session {path}: {info['status']}, model {info['model']}, target {info['target']}")
    print(f"  {info['evaluations']} evaluations, {info['seconds']} s, {info['sites']} sites")
    if info["outcome"]:
        print(f"  outcome: {info['outcome']['status']}, float sites {info['outcome']['sites']}, "
              f"value {info['outcome']['value']}")
    if info["next"]:
        print(f"  next: {info['next']['phase']} with {len(info['next']['sites'])} float sites")
    for step in info["steps"][-10:]:
        if step.get("kind") == "eval":
            print(f"  - {step['phase']}: {len(step['sites'])} float sites -> {step['value']:.5f} "
                  f"({'meets' if step['passed'] else 'misses'})")
        else:
            print(f"  - {step.get('kind')}: {step}")
    return EXIT_OK


def cmd_bundle(args: argparse.Namespace) -> int:
    from quantscan.bundle import make_bundle

    bundle = make_bundle(args.run_dir, args.bundle_out, include=args.include, force=args.force)
    print(f"wrote {bundle.path} ({len(bundle.members)} files)")
    return EXIT_OK


def cmd_overlay(args: argparse.Namespace) -> int:
    from quantscan.overlay import write_overlay

    paths = write_overlay(Path(args.run_dir), Path(args.overlay_out), force=args.force)
    print(f"wrote {', '.join(str(p) for p in paths)} (Model Explorer node data: load beside the model)")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from quantscan.report.html import write_report

    path = write_report(Path(args.run_dir))
    print(f"wrote {path}")
    return EXIT_OK


# --- vendor: a real toolchain out of process, lined up with quantscan ----------------------------------


def _vendor_parser(sub: Any) -> None:
    p = sub.add_parser("vendor", help="run a real vendor toolchain out of process, line it up with quantscan")
    p.add_argument("tool", choices=["rknn", "tpu-mlir"])
    p.add_argument("model")
    p.add_argument("--calib", required=True, help="calibration folder (the samples both tools get)")
    p.add_argument("--target", required=True, help="chip, e.g. rk3588 (also the quantscan profile)")
    p.add_argument("--python", default=None, metavar="PATH",
                   help="the vendor's Python (default: $QUANTSCAN_RKNN_PYTHON, venv-rknn nearby, python3)")
    p.add_argument("--limit", type=_positive_int, default=None, help="use the first N samples")
    p.add_argument("--analysis-samples", type=_non_negative_int, default=None, metavar="N",
                   help="samples through the vendor's per-layer analysis (default: all; each one is slow)")
    p.add_argument("--plan", default=None, metavar="plan.json",
                   help="also apply a bisect plan through the vendor's mixed precision, report its simulator")
    p.add_argument("--force", action="store_true", help="replace files in --out quantscan did not write")
    _common(p)


def cmd_vendor(args: argparse.Namespace) -> int:
    if args.tool != "rknn":
        raise UsageError(f"vendor: expected rknn, found {args.tool} (tpu-mlir is not driven by this version)")
    from quantscan.vendor.rknn import run_rknn

    out = Path(args.out) if args.out else default_out(args.model) / "vendor-rknn"
    _refuse_out_in_data(out, args.calib)
    from quantscan.runfolder import claim_out_dir

    def say(message: str) -> None:
        if not args.quiet:
            print(f"quantscan vendor: {message}", file=sys.stderr)

    with claim_out_dir(out, force=args.force):
        run = run_rknn(args.model, args.calib, target=args.target, out=out, python=args.python, limit=args.limit,
                       analysis_samples=args.analysis_samples, plan=args.plan, threads=args.threads, progress=say)
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
              f"{run.tool} hybrid quantization gives {got or 'nothing (' + str(run.plan['error']) + ')'}")
    print(f"wrote {out}/ (vendor.csv, vendor_findings.csv, vendor.json, {Path(run.log).name}, quantscan/)")
    if not run.stages:  # the toolkit never ran: an empty vendor.csv is no comparison (CONTRACT: not exit 0)
        raise UsageError(f"vendor {args.tool}: expected the toolkit to run, found it never reached a stage "
                         f"({(run.error or {}).get('message', 'no result')}); see {run.log}")
    return EXIT_OK


# --- dumps: what the chip computed, beside FP32 and the simulation -----------------------------------


def _dumps_parser(sub: Any) -> None:
    p = sub.add_parser("dumps", help="a board's or vendor runtime's per-layer dumps beside FP32 and the simulation")
    p.add_argument("model")
    p.add_argument("--calib", required=True, help="calibration folder (the samples the dumps were made on)")
    p.add_argument("--dumps", required=True, metavar="DIR", help="per-sample dumps (see --format)")
    p.add_argument("--format", default=None, choices=["rknn", "tpu-mlir", "npy"],
                   help="dump format (default: detected; npy = one .npz per sample keyed by ONNX tensor names)")
    for flag, default in (("--calib-method", "minmax"), ("--activations", None), ("--profile", None)):
        p.add_argument(flag, default=default, help="as for scan: how the simulation quantizes")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME:D0,D1,...")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
    _common(p)


def cmd_dumps(args: argparse.Namespace) -> int:
    from quantscan.device import compare_dumps

    out = Path(args.out) if args.out else default_out(args.model)
    _refuse_out_in_data(out, args.calib, args.dumps)
    shapes, dims = split_input_shapes(args.input_shape)
    result = compare_dumps(args.model, args.calib, args.dumps, fmt=args.format, progress=_progress_factory(args.quiet),
                           calib_method=args.calib_method, activations=args.activations, profile=args.profile,
                           input_shape=shapes, input_dims=dims, const=parse_const(args.const), threads=args.threads,
                           seed=args.seed)
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


# --- log: a vendor conversion log read into findings -------------------------------------------------


def _log_parser(sub: Any) -> None:
    p = sub.add_parser("log", help="read a vendor conversion log (RKNN-Toolkit2, hb_mapper, tpu-mlir) into findings")
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
    from quantscan.vendorlog import read_log

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
