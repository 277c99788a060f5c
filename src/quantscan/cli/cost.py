"""`quantscan cost MODEL --profile NAME [--plan plan.json] --out DIR`: estimated board time.

Writes cost.json (profile, total_ms, per_site, boundaries, assumptions; with --plan the plan's
precisions, estimated_ms and extra_ms over all-int8, per Pareto point too) and cost.csv (one row per
kernel). `--profile onnxruntime` measures on this machine instead (onnxruntime's own profiler).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from quantscan.cli.args import EXIT_OK, common, default_out, parse_input_shape, positive_int


def cost_parser(sub: Any) -> None:
    p = sub.add_parser("cost", help="estimated board time per site, boundary and plan (cost.json, cost.csv)")
    p.add_argument("model")
    p.add_argument("--profile", required=True, help="chip profile with a [cost] table, or onnxruntime to measure")
    p.add_argument("--plan", default=None, metavar="plan.json", help="price a bisect plan and its Pareto points")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME:D0,D1,...")
    p.add_argument("--runs", type=positive_int, default=20,
                   help="--profile onnxruntime: timed runs per repetition (default 20)")
    p.add_argument("--force", action="store_true", help="replace files in --out quantscan did not write")
    common(p)


def cmd_cost(args: argparse.Namespace) -> int:
    from quantscan.compat.profiles import load_profile
    from quantscan.model import ensure_not_quantized, load_model
    from quantscan.runfolder import claim_out_dir, read_plan, refuse_inputs, write_csv, write_json

    out = Path(args.out) if args.out else default_out(args.model)
    refuse_inputs([out / "cost.json", out / "cost.csv"], [args.model, args.plan], "--out")
    shapes = parse_input_shape(args.input_shape)
    plan = _read_plan(args.plan, read_plan)
    loaded = load_model(args.model)
    ensure_not_quantized(loaded.proto, loaded.path.name)
    if args.profile == "onnxruntime":
        doc, table = _measured(loaded.proto, shapes, args)
    else:
        doc, table = _estimated(loaded.proto, load_profile(args.profile), shapes, plan)
    with claim_out_dir(out, force=args.force):
        write_json(out / "cost.json", doc)
        write_csv(out / "cost.csv", table)
    _print(doc, out)
    return EXIT_OK


def _read_plan(path: str | None, reader: Any) -> dict[str, Any] | None:
    from quantscan.errors import UsageError

    if path is None:
        return None
    plan = reader(Path(path))
    if plan is None:
        raise UsageError(f"--plan: expected a readable plan.json (quantscan bisect writes one), found {path}")
    return dict(plan)


def _estimated(proto: Any, profile: Any, shapes: dict[str, list[int]], plan: dict[str, Any] | None) -> Any:
    from quantscan.cost import Pricer
    from quantscan.cost.plans import plan_precisions, priced_plan

    pricer = Pricer.of(proto, profile, shapes or None)
    precisions = plan_precisions(plan, pricer.site_nodes) if plan is not None else {}
    estimate = pricer.price(precisions)
    doc = estimate.to_json()
    if plan is not None:
        doc["plan"] = priced_plan(pricer, plan)
    return doc, estimate.table()


def _measured(proto: Any, shapes: dict[str, list[int]], args: argparse.Namespace) -> Any:
    from quantscan.cost.measure import measure
    from quantscan.records import ActivationScheme
    from quantscan.scanning.ort_recipe import quantize_static_call

    recipe = quantize_static_call(ActivationScheme.UINT8)  # the onnxruntime profile's quantize_static recipe
    result = measure(proto, recipe, shapes or None, runs=args.runs, threads=args.threads or 1, seed=args.seed)
    return result.to_json(), result.table()


def _print(doc: dict[str, Any], out: Path) -> None:
    line = f"{doc['profile']}: {doc['total_ms']:.3f} ms"
    if "float_ms" in doc:
        line += f" (float model {doc['float_ms']:.3f} ms; repeatability {doc['repeatability']['median_rel_diff']:.1%})"
    else:
        line += f" estimated ({doc['kernels_ms']:.3f} kernels, {doc['boundaries_ms']:.3f} boundaries)"
    plan = doc.get("plan")
    if plan:
        line += f"; plan {plan['estimated_ms']:.3f} ms ({plan['extra_ms']:+.3f} ms over all-int8)"
    print(line)
    print(f"wrote {out}/cost.json and cost.csv")
