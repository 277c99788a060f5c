"""`quantscan rewrite MODEL ... -o OUT`: equivalence and recovery rewrites with their proof.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from quantscan.cli.args import EXIT_OK, EXIT_THRESHOLD, common, finite, parse_const, positive_float, positive_int
from quantscan.errors import UsageError


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
                alpha = finite(values)
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentError(self, str(exc)) from None
            if not 0 <= alpha <= 1:
                raise argparse.ArgumentError(self, f"expected ALPHA in [0, 1], found {values}")
            namespace.smooth_alpha = alpha


def _clamp_value(args: argparse.Namespace) -> float | None:
    """`--clamp-mask-value`, else None: the rewrite picks the smallest value its proof shows exact."""
    return None if args.clamp_mask_value is None else float(args.clamp_mask_value)


def rewrite_parser(sub: Any) -> None:
    p = sub.add_parser("rewrite", help="equivalence rewrites with a numeric proof")
    p.add_argument("model")
    p.add_argument("--fold-bn", nargs=0, action=_StepAction, const="fold-bn", dest="fold_bn")
    p.add_argument("--decompose", action=_StepAction, choices=["hardswish", "hardsigmoid", "layernorm"])
    p.add_argument("--fuse", action=_StepAction, choices=["hardswish", "layernorm", "softmax"])
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
    p.add_argument("--global-pool", nargs=0, action=_StepAction, const="global-pool", dest="global_pool",
                   help="AveragePool/MaxPool whose window is the whole input -> GlobalAveragePool/GlobalMaxPool")
    p.add_argument("--equalize", nargs=0, action=_StepAction, const="equalize", dest="equalize",
                   help="cross-layer equalization of Conv/Gemm/MatMul pairs (BN folded first); exact in FP32")
    p.add_argument("--smooth", nargs="?", action=_SmoothAction, metavar="ALPHA",
                   help="move per-channel activation ranges into the next layer's weights (needs --calib); "
                        "ALPHA in [0, 1], default: chosen per site")
    p.add_argument("--bias-correct", nargs=0, action=_StepAction, const="bias-correct", dest="bias_correct",
                   help="remove the int8 weights' mean output shift from each bias (needs --calib; approximate)")
    p.add_argument("--relu6-to-relu", nargs=0, action=_StepAction, const="relu6-to-relu", dest="relu6_to_relu",
                   help="a layer's Clip(0, 6) whose input stays below 6 on --calib -> Relu, so --equalize can pass "
                        "it (needs --calib; proven on that data)")
    p.add_argument("--recover", action="store_true",
                   help="try --equalize, --smooth, --bias-correct; keep each only where the measured all-int8 "
                        "output cosine rises (needs --calib; writes OUT.recover.json)")
    p.add_argument("--profile", default=None, metavar="P", help="with --recover: measure under P's int8 scheme")
    p.add_argument("--fix-dim", action="append", default=[], metavar="SPEC",
                   help="INPUT:AXIS=V, DIMPARAM=V or batch=V (repeatable)")
    p.add_argument("--freeze-input", action="append", default=[], metavar="NAME=VALUE",
                   help="make input NAME the constant VALUE and fold what it decides (If, Shape, Where); repeatable")
    p.add_argument("--opset", type=positive_int, default=None,
                   help="convert to this opset: up first, down last (opset-down)")
    p.add_argument("-o", "--output-model", dest="output_model", default=None)
    p.add_argument("--calib", default=None, help="data for the numeric proof (default: seeded random)")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--limit", type=positive_int, default=None)
    p.add_argument("--tolerance", type=positive_float, default=1e-4, help="max_abs / output range for exact rewrites")
    p.add_argument("--force", action="store_true",
                   help="write even when the proof fails, and replace an -o file quantscan did not write")
    p.add_argument("--all-for-profile", default=None, metavar="PROFILE",
                   help="apply every rewrite the compat findings for PROFILE suggest")
    p.add_argument("--case", default=None, metavar="ID", help="replay a library case's recipe (fresh proof)")
    p.add_argument("--cases", default=None, metavar="DIR", help="case library (default ~/.quantscan/cases)")
    p.set_defaults(steps=[], smooth_alpha=None)
    common(p)


def _print_before_after(before: Any, after: Any, profile: str) -> None:
    """`--all-for-profile`: the check run again on the rewritten model, counts side by side."""
    import onnx

    from quantscan.compat.check import check
    from quantscan.compat.profiles import load_profile
    from quantscan.cost.estimate import board_ms, static_input_shapes
    from quantscan.model import load_model

    rows = [check(m, [profile]).summary_rows()[0] for m in (before, after)]
    print(f"check {profile}: " + ", ".join(
        f"{key} {rows[0][key]} -> {rows[1][key]}" for key in ("errors", "warnings", "cpu_islands")))
    chip = load_profile(profile)
    rewritten = after if isinstance(after, onnx.ModelProto) else load_model(after).proto
    shapes = static_input_shapes(rewritten)
    times = [board_ms(m, chip, shapes or None) for m in (before, after)]
    if times[0] is not None and times[1] is not None:
        print(f"board time {chip.name} (estimated, quantscan.cost): {times[0]:.3f} ms -> {times[1]:.3f} ms "
              f"({times[1] - times[0]:+.3f} ms)")


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
    from quantscan.model import ensure_not_quantized, load_model
    from quantscan.rewrites.pipeline import rewrite

    first = load_model(args.model)
    ensure_not_quantized(first.proto, first.path.name)  # before any plan or size is printed
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
                         "--gelu-tanh, --clamp-mask, --div-to-mul, --reciprocal, --fix-ceil-mode, --global-pool, "
                         "--freeze-input, --equalize, --smooth, --bias-correct, --relu6-to-relu, --recover, --opset, "
                         "--all-for-profile; "
                         "found none that applies")
    report = rewrite(args.model, steps, fix_dim=args.fix_dim, opset=args.opset, out=args.output_model,
                     calib=calib, seed=args.seed, limit=args.limit, tolerance=args.tolerance, force=args.force,
                     runner=None, clamp_mask_value=_clamp_value(args), freeze_input=args.freeze_input,
                     smooth_alpha=args.smooth_alpha)
    _print_report(report)
    if args.all_for_profile:
        _print_before_after(args.model, report.model, args.all_for_profile)
    if not report.passed:
        print("quantscan: the numeric proof failed its threshold"
              + ("; written anyway (--force)" if report.written else "; nothing written (use --force)"),
              file=sys.stderr)
        return EXIT_THRESHOLD
    return EXIT_OK


def _print_report(report: Any) -> None:
    """Each step's changes and refusals, the proof per output, and what was written."""
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
