"""Argument groups and value parsers shared by the commands.

Each group adds its flags once (`data_options`, `task_options`, `common`) and parses them once into a
frozen record (`SampleArgs`, `TaskArgs`, `GainArgs`) whose `scan_options()` are `ScanOptions` keywords:
the Polygraphy `tools/args` shape, where a command holds parsed groups rather than reading the namespace.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from quantscan.errors import UsageError
from quantscan.taskmetrics.base import TASKS

EXIT_OK, EXIT_THRESHOLD, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; make its message the contract's one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


# --- flag parsing --------------------------------------------------------------------------------------


def positive_int(raw: str) -> int:
    """`--limit`, `--batch-size`, `--threads`, `--opset`: a count, so at least 1."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {raw!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {raw!r}")
    return value


def non_negative_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, found {raw!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, found {raw!r}")
    return value


def finite(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, found {raw!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, found {raw!r}")
    return value


def positive_float(raw: str) -> float:
    value = finite(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, found {raw!r}")
    return value


def cosine_target(raw: str) -> float:
    """A cosine target a plan can reach: in (0, 1] (`--target-cosine 99` is a slip for 0.99)."""
    value = finite(raw)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a cosine in (0, 1], found {raw!r}")
    return value


def fraction(raw: str) -> float:
    """`--target-top1`: an agreement rate in [0, 1]."""
    value = finite(raw)
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


def common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="run folder (default reports/<model stem>/)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--threads", type=positive_int, default=None, help="onnxruntime intra-op threads")
    p.add_argument("--seed", type=int, default=0)


def data_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calib", required=True, help="calibration folder (images + preprocess.json, or .npy/.npz)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME:D0,D1,... | INPUT:AXIS=V | batch=V",
                   help="full shape, or a dim setting in the contract's syntax (repeatable)")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--state", action="append", default=[], metavar="OUT=IN",
                   help="feed output OUT back as input IN of the next sample, in file order (recurrent models)")
    p.add_argument("--limit", type=positive_int, default=None, help="use the first N samples")
    p.add_argument("--eval", default=None, help="separate evaluation folder (default: the calibration set)")
    p.add_argument("--calib-method", default="minmax")
    p.add_argument("--activations", default=None, metavar="uint8|int8|int16|float",
                   help="activation scheme, float = weight-only (default: the --scheme's, the --profile's, else uint8)")
    p.add_argument("--weights", default=None, metavar="int8|int4", help="weight type (default int8)")
    p.add_argument("--group-size", type=positive_int, default=None, metavar="G",
                   help="one weight scale per G inputs of each output channel (default: per output channel)")
    p.add_argument("--scheme", default=None, metavar="NAME",
                   help="scheme shorthand: w8a8, w8a16, w4a16-g128, w8a8-g128, ... (a16 as the --profile means it)")
    p.add_argument("--output", action="append", default=[], help="graph output for the headline metric")
    p.add_argument("--save-qdq", default=None, help="write the fake-quant model here")
    p.add_argument("--profile", action="append", default=[], help="chip profile name or TOML path")
    p.add_argument("--fail-below-cosine", type=finite, default=None)
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="samples per run when the batch dim is free (default: largest up to 8 fitting --max-memory)")
    p.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="memory budget, e.g. 8G or 512M (default: half the available RAM)")
    p.add_argument("--preprocess", default=None, help="preprocess.json for an image folder")
    p.add_argument("--layout", default=None)
    p.add_argument("--channel-order", default=None)
    p.add_argument("--scale", type=positive_float, default=None)
    p.add_argument("--mean", default=None, help="comma-separated per-channel mean")
    p.add_argument("--std", default=None, help="comma-separated per-channel std")
    p.add_argument("--resize", default=None)
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.add_argument("--force", action="store_true", help="replace --out or --save-qdq files quantscan did not write")
    p.add_argument("--tensors", default="all", choices=["all", "sites"],
                   help="tensors.csv rows: every float tensor (default) or quantization points only (faster)")
    p.add_argument("--deployed-samples", default=None, metavar="N|all",
                   help="run the deployed check (QDQ model at ORT_ENABLE_ALL) on the first N evaluation samples "
                        "(default 32; all: every sample; 0: skip it)")


def task_options(p: argparse.ArgumentParser, plugins: bool = True) -> None:
    """Task metrics beside cosine (quantscan.taskmetrics); bisect takes no plugins (it cannot target them)."""
    p.add_argument("--task", action="append", default=None, metavar="NAME[:KEY=VALUE,...]",
                   help=f"task metrics on the outputs: {'|'.join(TASKS)} (default auto: detected from output "
                        "shape, ops and files), or a spec naming outputs, e.g. keypoints:output=NAME,count=K,dims=D,"
                        "scale=S; anchors:boxes=NAME,scores=NAME,anchors=FILE.npy; decoder:output=NAME,bos=K,eos=K; "
                        "presence:output=NAME[,threshold=T] (repeatable, one spec per head)")
    if plugins:
        p.add_argument("--metric", action="append", default=[], metavar="MODULE:FUNCTION",
                       help="plugin called with FP32 and int8 outputs per batch, returning named sums (repeatable)")
        p.add_argument("--channel-groups", action="append", default=[], metavar="OUTPUT[@AXIS]=LABEL:A-B,...",
                       help="an output's channels measured per named group, e.g. output0=box:0-3,scores:4-21 "
                            "(axis 1 unless @AXIS; repeatable)")
    p.add_argument("--charset", default=None,
                   help="CTC charset (.json list or PP-OCR .txt keys); default charset.json/.txt beside the data")
    p.add_argument("--mask-threshold", type=float, default=0.5, help="score-map threshold for --task mask IoU")


def floats(raw: str | None, flag: str) -> list[float] | None:
    if raw is None:
        return None
    try:
        return [float(v) for v in raw.split(",")]
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated numbers, found {raw!r}") from None


def progress_factory(quiet: bool) -> Any:
    from quantscan.scanning.options import no_progress

    if quiet or not sys.stderr.isatty():
        return no_progress
    from tqdm import tqdm

    def factory(desc: str, total: int | None) -> Any:
        return tqdm(total=total, desc=desc, unit="batch", leave=False, file=sys.stderr)

    return factory


def refuse_out_in_data(out: Path, *data: str | None) -> None:
    """Our files written into a calibration folder would mix with the data (and be read as data next run)."""
    from quantscan.runfolder import out_inside_data

    for folder in data:
        if folder and out_inside_data(out, Path(folder)):
            raise UsageError(f"--out: expected a run folder outside the data folder {folder}, found {out}")


def default_out(model: str) -> Path:
    return Path("reports") / Path(model).stem


# --- commands ------------------------------------------------------------------------------------------


def deployed_samples(raw: str | None) -> dict[str, int | str]:
    """`--deployed-samples N|all` as an API option ({} when not given: the scan's default)."""
    if raw is None:
        return {}
    if raw == "all":
        return {"deployed_samples": raw}
    try:  # a negative count is refused with the API's own message (ScanOptions.validate)
        return {"deployed_samples": int(raw)}
    except ValueError:
        raise UsageError(f"--deployed-samples: expected a non-negative integer or 'all', found {raw}") from None


def executor_options(p: argparse.ArgumentParser, *, workers: bool = True) -> None:
    """`--workers N`, `--executor serial|process|ray`, `--ray-address ADDR` (scan and bisect)."""
    if workers:
        p.add_argument("--workers", type=positive_int, default=1, metavar="N",
                       help="measure over N disjoint sample shards, merged exactly (local: capped by the CPUs)")
    p.add_argument("--executor", choices=["serial", "process", "ray"], default=None,
                   help="where the shards run (default: process when --workers > 1); ray needs "
                        "pip install 'quantscan[ray]'")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="the Ray cluster --executor ray joins (e.g. HEAD_IP:6379; default: a local Ray)")


def executor_choice(args: argparse.Namespace) -> dict[str, object]:
    """The executor flags as API options; `--executor ray` without Ray installed is refused here, before
    any folder is claimed."""
    if args.executor == "ray":
        from quantscan.executors import check_reachable, import_ray

        import_ray()
        check_reachable(args.ray_address)
    return {"workers": args.workers, "executor": args.executor, "ray_address": args.ray_address}


def _scan_keywords(group: Any) -> dict[str, Any]:
    """A parsed group's fields as `ScanOptions` keywords (the field names are the option names)."""
    return {f.name: getattr(group, f.name) for f in fields(group)}


@dataclass(frozen=True)
class SampleArgs:
    """The data flags (`data_options`) parsed once: which samples feed the model, how, and on which chip.

    Why a record: scan, bisect and calib-advice each used to build the same options dict from the
    namespace (bisect by hand, with its own key list); now each command parses the group here and hands
    `scan_options()` on, so a flag added to `data_options` reaches all three the same way."""

    calib_method: str
    activations: str | None
    weights: str | None
    group_size: int | None
    scheme: str | None
    input_shape: dict[str, list[int]]
    input_dims: list[str]
    const: dict[str, float]
    state: dict[str, str]
    limit: int | None
    eval: str | None
    output: list[str]
    preprocess: str | None
    preprocess_overrides: dict[str, Any]
    threads: int | None
    seed: int
    batch_size: int | None
    max_memory: str | None
    profile: str | None

    @classmethod
    def parse(cls, args: argparse.Namespace, command: str) -> SampleArgs:
        from quantscan.calib.recurrent import parse_state

        if len(args.profile) > 1:
            raise UsageError(f"{command}: expected one --profile (the chip to simulate), found {len(args.profile)}; "
                             "compare several with `quantscan check MODEL --profile A --profile B`")
        overrides = {"layout": args.layout, "channel_order": args.channel_order, "scale": args.scale,
                     "mean": floats(args.mean, "--mean"), "std": floats(args.std, "--std"), "resize": args.resize}
        shapes, dims = split_input_shapes(args.input_shape)
        return cls(
            calib_method=args.calib_method, activations=args.activations, weights=args.weights,
            group_size=args.group_size, scheme=args.scheme, input_shape=shapes, input_dims=dims,
            const=parse_const(args.const), state=parse_state(args.state), limit=args.limit, eval=args.eval,
            output=args.output, preprocess=args.preprocess,
            preprocess_overrides={k: v for k, v in overrides.items() if v is not None},
            threads=args.threads, seed=args.seed, batch_size=args.batch_size, max_memory=args.max_memory,
            profile=args.profile[0] if args.profile else None,
        )

    def scan_options(self) -> dict[str, Any]:
        return _scan_keywords(self)


@dataclass(frozen=True)
class TaskArgs:
    """The task-metric flags (`task_options`) parsed once (bisect has no `--metric` plugins)."""

    task: str | tuple[str, ...]
    charset: str | None
    mask_threshold: float
    metric: list[str]
    channel_groups: list[str]

    @classmethod
    def parse(cls, args: argparse.Namespace) -> TaskArgs:
        given = tuple(args.task or ("auto",))
        return cls(given[0] if len(given) == 1 else given, args.charset, args.mask_threshold,
                   list(getattr(args, "metric", [])),
                   list(getattr(args, "channel_groups", None) or []))

    def scan_options(self) -> dict[str, Any]:
        return _scan_keywords(self)


@dataclass(frozen=True)
class GainArgs:
    """--no-gain / --gain-candidates N|all / --gain-samples N parsed once; None: the scan's default."""

    gain_candidates: int | str | None
    gain_samples: int | None

    @classmethod
    def parse(cls, args: argparse.Namespace) -> GainArgs:
        raw = args.gain_candidates
        if args.no_gain:
            return cls(0, args.gain_samples)
        if raw is None or raw == "all":
            return cls(raw, args.gain_samples)
        try:  # a negative count is refused with the API's own message (ScanOptions.validate)
            return cls(int(raw), args.gain_samples)
        except ValueError:
            raise UsageError(f"--gain-candidates: expected a non-negative integer or 'all', found {raw}") from None

    def scan_options(self) -> dict[str, Any]:
        return {k: v for k, v in _scan_keywords(self).items() if v is not None}


def print_case_matches(findings: Any, cases: str | None) -> None:
    """Library cases whose pattern this model's findings contain: the recipe that fixed it before."""
    from quantscan.cases import match_cases

    for match in match_cases(findings, cases):
        print(match.line())
        print(f"  replay: quantscan rewrite MODEL --case {match.case_id} -o OUT.onnx")


def profile_label(profile: str, findings: Any) -> str:
    if profile in set(findings["profile"]):
        return profile
    return Path(profile).stem
