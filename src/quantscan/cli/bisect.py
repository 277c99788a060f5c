"""`quantscan bisect MODEL --calib DIR --target-cosine X`: output gain and the bisection.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quantscan.bisect.judges import SIMULATION, judge_names, judge_spec, verify_names
from quantscan.bisect.robust import DEFAULT_REALISATIONS, DEFAULT_SPREAD, DEFAULT_Z, HOLDOUTS
from quantscan.bisect.verdict import order_hint
from quantscan.cli.args import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_THRESHOLD,
    SampleArgs,
    TaskArgs,
    common,
    cosine_target,
    data_options,
    default_out,
    executor_choice,
    executor_options,
    finite,
    fraction,
    progress_factory,
    refuse_out_in_data,
    task_options,
)
from quantscan.cli.notes import print_warnings
from quantscan.columns import Col
from quantscan.errors import InternalError, UsageError
from quantscan.heldout import same_samples_text


def bisect_parser(sub: Any) -> None:
    p = sub.add_parser("bisect", help="output gain per site + resumable bisection to a target")
    p.add_argument("model", nargs="?", default=None)
    data_options(p)
    p.set_defaults(calib=None)
    for action in p._actions:
        if action.dest == "calib":
            action.required = False
    p.add_argument("--target", default=None, metavar="METRIC=VALUE",
                   help="e.g. top1=0.99, box=0.9, string=0.95, mask_iou=0.9, top5=0.99, cosine=0.995, sqnr=30")
    p.add_argument("--target-cosine", type=cosine_target, default=None, help="in (0, 1]")
    p.add_argument("--target-sqnr", type=finite, default=None, help="dB")
    p.add_argument("--target-top1", type=fraction, default=None, help="in [0, 1]")
    p.add_argument("--fallback", default="float", choices=["float", "int16", "int8"],
                   help="what a kept site becomes; int8: 8-bit weights under a w4 scheme (RKLLM hybrid layers)")
    p.add_argument("--first-bad", action="store_true", help="find the first site (in topological order) that breaks it")
    p.add_argument("--session", default=None, help="session file (default <out>/session.json)")
    p.add_argument("--resume", default=None, metavar="FILE", help="continue a session without repeating steps")
    p.add_argument("--show", default=None, metavar="FILE", help="print where a session stands")
    p.add_argument("--keep-float", nargs="+", default=[], metavar="NAME")
    p.add_argument("--force-quant", nargs="+", default=[], metavar="NAME")
    p.add_argument("--loss-if-only", action="store_true")
    p.add_argument("--verify", default=None, choices=verify_names(),
                   help="apply the plan and Pareto points in the real toolchain (chip: --profile)")
    p.add_argument("--evaluator", default=SIMULATION, choices=judge_names(),
                   help="who measures each candidate of the search (a toolchain: one build each)")
    p.add_argument("--vendor-python", default=None, metavar="PATH",
                   help="the toolchain's Python for --verify/--evaluator (as vendor --python)")
    p.add_argument("--export", nargs="+", default=None, metavar="FORMAT",
                   help="onnxruntime rknn horizon tpu-mlir tidl tidl-rt hailo pulsar2 qnn amct atc rkllm qdq-blocked "
                        "matmulnbits (default: the first six, plus the chip's own under --profile hailo8/ax650/"
                        "qnn-htp/ascend310/hisilicon-svp/rk3588-llm)")
    p.add_argument("--from-plan", default=None, metavar="plan.json",
                   help="write the --export files of an existing plan (no search); MODEL, if given, must be the "
                        "plan's model (default: the model path the plan records)")
    p.add_argument("--hailo-hn", default=None, metavar="FILE",
                   help="with --from-plan: the parsed Hailo model (.hn or .har) whose layer names the .alls uses "
                        "(default: names predicted from the ONNX graph)")
    p.add_argument("--realisations", type=int, default=DEFAULT_REALISATIONS, metavar="N",
                   help="rounding realisations each candidate is judged under (1: quantscan's rounding only)")
    p.add_argument("--rounding-spread", type=float, default=DEFAULT_SPREAD, metavar="S",
                   help="std of log(activation scale factor) in realisations 1.. (default %(default)s)")
    p.add_argument("--bound-z", type=finite, default=DEFAULT_Z, metavar="Z",
                   help="the search's lower bound lies Z jackknife standard errors below each realisation's figure")
    p.add_argument("--max-minutes", type=finite, default=None, metavar="M",
                   help="time budget: after M minutes the search stops and the plan is the smallest measured set "
                        "that meets the target (status budget, not reduced to minimal; --resume goes on)")
    p.add_argument("--objective", default=None, choices=["sites", "latency"],
                   help="sites (default): the fewest-sites plan; latency: among the measured sets that meet the "
                        "target held out, the least estimated board time (needs a --profile with a cost table)")
    p.add_argument("--max-extra-ms", type=finite, default=None, metavar="X",
                   help="the best held-out figure among measured sets whose estimated extra time over all-int8 "
                        "is at most X ms (needs a --profile with a cost table)")
    p.add_argument("--menu", action="store_true",
                   help="mixed bit widths: each weighted site int4/int8/int16/float as the profile's schemes "
                        "offer; writes the Pareto front over the target metric and weight bytes (menu.json, "
                        "menu.csv) and the cheapest point meeting the target (docs/schemes.md)")
    p.add_argument("--holdout", default="interleave", choices=list(HOLDOUTS),
                   help="interleave: search on even samples, claim on odd ones (--eval: that folder is held out)")
    task_options(p, plugins=False)
    executor_options(p)
    common(p)


def cmd_bisect(args: argparse.Namespace) -> int:
    if args.show:
        return _show_session(Path(args.show))
    if args.from_plan:
        return _export_from_plan(args)
    if args.menu:
        return _menu(args)
    if args.hailo_hn:
        raise UsageError("--hailo-hn: expected --from-plan plan.json (the HN names a plan's layers), found none")
    from quantscan.api import run_bisect
    from quantscan.bisect.driver import progress_of

    model = args.model
    if model is None and args.resume is None:
        raise UsageError("bisect: expected MODEL --calib DIR --target-cosine X, or --resume FILE / --show FILE")
    out = Path(args.out) if args.out else (default_out(model) if model else Path(args.resume).parent)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: expected a folder, found a file at {out}")
    refuse_out_in_data(out, args.calib, args.eval)
    options: dict[str, Any] = {"threads": args.threads, "seed": args.seed, "force": args.force,
                               "max_minutes": args.max_minutes, "objective": args.objective,
                               "max_extra_ms": args.max_extra_ms, **executor_choice(args)}
    if args.resume is None:
        options.update({**SampleArgs.parse(args, "bisect").scan_options(), **TaskArgs.parse(args).scan_options(),
                        "realisations": args.realisations, "rounding_spread": args.rounding_spread,
                        "holdout": args.holdout, "bound_z": args.bound_z})

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
                progress=progress_factory(args.quiet), on_step=on_step, verify=args.verify is not None,
                evaluator=args.evaluator, toolchain=_toolchain(args, out), **options,
            )
    except KeyboardInterrupt:
        where = Path(args.session or args.resume or out / "session.json")
        if where.is_file():
            print(f"quantscan: interrupted; resume with: quantscan bisect --resume {where}", file=sys.stderr)
        else:  # interrupted before the first step was saved: naming a file that does not exist misleads
            print("quantscan: interrupted before the first step was saved; nothing to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    print_warnings(result.warnings, None)
    _print_plan(result.plan, args, out)
    hint = order_hint(result.plan.steps, len(result.plan.sites), Col.LOSS_IF_ONLY in result.gains.columns)
    if hint:
        print(f"  hint: {hint}")
    print(f"wrote {out}/ (" + ", ".join(sorted(p.name for p in result.files.values())) + ")")
    return EXIT_OK if result.reached else EXIT_THRESHOLD


def _menu(args: argparse.Namespace) -> int:
    """`bisect MODEL --calib DIR --menu --target-cosine X`: the mixed-bit-width front (bisect/menu.py);
    exit 1 unless the cheapest point meeting the target on the searched samples meets it held out too."""
    from quantscan.bisect.menu_run import MENU_EXPORTS, run_menu, write_menu
    from quantscan.bisect.request import target_from_flags
    from quantscan.bisect.robust import Rounding
    from quantscan.runfolder import claim_out_dir
    from quantscan.scanning.prepare import prepare_scan

    if args.model is None or args.calib is None or args.resume is not None:
        raise UsageError("--menu: expected MODEL --calib DIR and a target (no --resume: a menu search keeps no "
                         f"session), found {'--resume' if args.resume else 'no MODEL/--calib'}")
    target = target_from_flags(args.target_cosine, args.target_sqnr, args.target_top1, args.target)
    other = [e for e in args.export or () if e not in MENU_EXPORTS]
    if other:
        raise UsageError(f"--export with --menu: expected {' or '.join(MENU_EXPORTS)} (the chosen point's weights), "
                         f"found {', '.join(other)}")
    out = Path(args.out) if args.out else default_out(args.model)
    refuse_out_in_data(out, args.calib, args.eval)
    options = {**SampleArgs.parse(args, "bisect").scan_options(), **TaskArgs.parse(args).scan_options(),
               "threads": args.threads, "seed": args.seed}
    with claim_out_dir(out, force=args.force):
        ctx = prepare_scan(args.model, args.calib, progress=progress_factory(args.quiet), **options)
        result = run_menu(ctx, target, Rounding(seed=args.seed or 0, holdout=args.holdout))
        files = write_menu(result, ctx, out, args.export or ())
    menu = result.menu
    print(f"menu {'/'.join(menu.precisions)} under {result.scheme} ({menu.source}): {len(result.points)} "
          f"assignments measured in {result.seconds} s; front (weight bytes, sites per precision, "
          f"{target.metric} searched / held out):")
    for p in result.front:
        counts = " ".join(f"{k}={v}" for k, v in p.counts(menu.precisions).items())
        ms = f", {p.est_ms:.3f} ms" if p.est_ms is not None else ""
        mark = "  <- cheapest meeting the target" if p is result.chosen else ""
        print(f"  {p.bytes:>10} B  {counts}  {p.value:.5f} / {p.held_value:.5f}{ms}{mark}")
    if result.chosen is None:
        print(f"no front point meets {target.metric} >= {target.value} on the searched samples")
    elif not result.reached:
        print(f"the cheapest point meeting {target.metric} >= {target.value} on the searched samples misses it held "
              f"out ({result.chosen.held_value:.5f})")
    print(f"wrote {out}/ (" + ", ".join(sorted(p.name for p in files.values())) + ")")
    return EXIT_OK if result.reached else EXIT_THRESHOLD


def _print_plan(plan: Any, args: argparse.Namespace, out: Path) -> None:
    """stdout after a bisection: the status line, the scheme, what is unmeasured, the verdict, the objective,
    the budget, the planned sites and the toolchain's check."""
    from quantscan.bisect.state import METRICS

    metric = plan.target.metric

    def value(metrics: dict[str, float] | None) -> str:
        got = (metrics or {}).get(METRICS.get(metric, metric))
        return f"{got:.5f}" if isinstance(got, float) else str(got)

    interval = f" [{plan.interval['low']:.5f}, {plan.interval['high']:.5f}]" if plan.interval is not None else ""
    print(f"{plan.status}: {len(plan.sites)} site(s) kept {args.fallback}; {metric} {value(plan.achieved)}{interval} "
          f"(all-int8 {value(plan.all_int8)}, all-float {value(plan.all_float)}); "
          f"{plan.evaluations} evaluations in {plan.seconds} s{_rounds(plan.speculation)}")
    if plan.scheme and plan.scheme.get("name") != "w8a8":
        name = plan.scheme.get("name")
        ceiling = f", all-float every site at --fallback {plan.fallback}" if plan.fallback != "float" else ""
        print(f"  scheme {name}: all-int8 is every site at {name}{ceiling}")
    if plan.unmeasured:
        print(f"  NOT the int8 model: every figure above leaves {', '.join(plan.unmeasured)} float inside "
              "(no site there was searched)")
    if plan.early_stop:
        print(f"  stopped early: {plan.early_stop}")
    _print_verdict(plan.verdict)
    _print_objective(plan.objective)
    _print_budget(plan.status, out / "session.json" if args.session is None and args.resume is None
                  else Path(args.session or args.resume))
    for site in plan.sites:
        print(f"  {site.node} -> {site.precision}")
    _print_verified(plan)


def _export_from_plan(args: argparse.Namespace) -> int:
    """`bisect --from-plan plan.json [--export ...] [MODEL] [--out DIR]`: exports of a plan already made."""
    from quantscan.bisect.exports import export_from_plan
    from quantscan.runfolder import claim_out_dir

    out = Path(args.out) if args.out else Path(args.from_plan).parent
    with claim_out_dir(out, force=args.force):
        files = export_from_plan(args.from_plan, out, args.export, args.model, args.hailo_hn)
    print(f"wrote {out}/ (" + ", ".join(sorted(p.name for p in files.values())) + ")")
    return EXIT_OK


def _print_objective(record: Any) -> None:
    """`--objective latency` / `--max-extra-ms`: what was chosen against the fewest-sites plan (estimated)."""
    from quantscan.bisect.objective import objective_line

    line = objective_line(record)
    if line:
        print(f"  {line}")


def _print_verdict(verdict: Any) -> None:
    """What the plan may claim on unseen samples, and, for a plan keeping most sites float, that the
    output cannot be int8 with its cause and the measured alternatives (bisect/verdict.py)."""
    if not verdict:
        return
    if verdict.get("kind") in ("held_out_miss", "no_plan_helps"):
        print(f"  {verdict['text']}")
    if verdict.get("undecided"):
        print(f"  undecided: {verdict['undecided']}")
    if verdict.get("cannot_be_int8"):
        print(f"  this output cannot be int8 in this scheme: {verdict['float_sites']} of {verdict['site_count']} "
              f"sites kept above int8; cause: {verdict['why']}")
        for alt in verdict.get("alternatives") or []:
            print(f"    measured alternative: {_alternative(alt)}")


def _alternative(alt: Any) -> str:
    from quantscan.bisect.verdict import Alternative

    return Alternative(str(alt["name"]), float(alt["value"]), str(alt["metric"]), str(alt["how"]),
                       str(alt.get("note", "")), float(alt.get("baseline", "nan"))).line()


def _print_budget(status: str, session: Path) -> None:
    """A search stopped by --max-minutes: what its plan is, and how to go on."""
    from quantscan.bisect.state import BUDGET, BUDGET_NO_PLAN

    if status == BUDGET:
        print("  stopped by --max-minutes: the plan meets the target but was not reduced to minimal; "
              f"quantscan bisect --resume {session} goes on")
    elif status == BUDGET_NO_PLAN:
        print("  stopped by --max-minutes before any measured set met the target; "
              f"quantscan bisect --resume {session} goes on")


def _print_verified(plan: Any) -> None:
    """`--verify`: the toolchain's figure beside each claim, and any site it could not be told about."""
    points = [("plan", len(plan.sites), plan.verified)] if plan.verified else []
    points += [("pareto", p.float_sites, p.verified) for p in plan.pareto if p.verified]
    for kind, n, got in points:
        value = got.get("value")
        shown = f"{value:.5f}" if isinstance(value, float) and value == value else f"nothing ({got.get('error')})"
        print(f"  {kind} ({n} float sites): claimed {got.get('claimed', float('nan')):.5f}, "
              f"{got.get('tool')} {got.get('version')} applied {shown} on all samples")
        if isinstance(got.get("held_out"), dict):
            print(f"    {same_samples_text(got['held_out'], str(got.get('tool')))}")
    for kind, n, got in points:  # which point's names the cfg lacks: the plan's, or a Pareto point's only
        if got.get("warning"):
            print(f"quantscan: warning: {kind} ({n} float sites): {got['warning']}", file=sys.stderr)


def _toolchain(args: argparse.Namespace, out: Path) -> Any:
    """The vendor toolchain --verify/--evaluator name (one of them: two would be two chips' figures)."""
    chosen = {t for t in (args.verify, args.evaluator) if t and judge_spec(t).builds}
    if len(chosen) > 1:
        raise UsageError(f"bisect: expected one toolchain for --verify and --evaluator, "
                         f"found {', '.join(sorted(chosen))}")
    if not chosen:
        return None
    from quantscan.toolchains import TOOLCHAINS

    tool = chosen.pop()
    factory = TOOLCHAINS[tool].judge
    if factory is None:  # the registry offered a judge whose folder builds none: ours to fix
        raise InternalError(f"bisect: {tool} is offered as a judge but its toolchain folder has no judge")
    return factory(tool, args.vendor_python, _chip(args), out / "toolchain")


def _chip(args: argparse.Namespace) -> str | None:
    """The chip a toolchain builds for: --profile, or on --resume the session's profile."""
    if args.profile:
        return str(args.profile[0])
    if args.resume:
        from quantscan.bisect import BisectSession

        return BisectSession.load(args.resume).options.get("scan", {}).get("profile")
    return None


def _rounds(speculation: Any) -> str:
    """`--workers` > 1: how many rounds the search took, and the sets measured ahead that it never asked for."""
    if not speculation:
        return ""
    return (f", {speculation['rounds']} rounds of up to {speculation['workers']} "
            f"({speculation['unused']} set(s) measured ahead unused)")


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
