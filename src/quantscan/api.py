"""The public entry points that end in a run folder: measure, then write what the user reads.

Why a module of its own: the measurement packages (`scanning/`, `bisect/`) return data and never import
the report renderers (`report/`), so the step that turns a result into its folder (the CSVs and run.json
through `runfolder`, summary.md and report.html through `report`) lives one level above both. The CLI
and notebooks call these; `quantscan.scan` and `quantscan.run_bisect` are these functions.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantscan import runfolder
from quantscan.errors import UsageError
from quantscan.model import LoadedModel
from quantscan.report.summary import summary_markdown
from quantscan.report.verdict import with_plan_block
from quantscan.runner import Runner
from quantscan.scanning.options import ProgressFactory, ScanOptions, no_progress
from quantscan.scanning.prepare import deployable_qdq
from quantscan.scanning.run import ScanResult, measure

if TYPE_CHECKING:
    from quantscan.bisect.finish import BisectResult
    from quantscan.calib import CalibSet
    from quantscan.scanning.calib_advice import CalibAdvice
    from quantscan.scanning.prepare import ScanContext

TABLES = ("layers", "tensors", "ops", "channels")
"""The CSV tables every run folder holds (compat.csv and partitions.csv only with a profile)."""


def scan(
    model: str | Path | LoadedModel,
    calib: str | Path | CalibSet,
    *,
    out: str | Path | None = None,
    progress: ProgressFactory = no_progress,
    runner: Runner | None = None,
    **options: Any,
) -> ScanResult:
    """Measure every quantization site of `model` on `calib`; files only where told: `out` (the run
    folder, via `save_scan`) and the `save_qdq` option (via `save_qdq`)."""
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise UsageError(f"--out: expected a folder, found a file at {out}")
    qdq_path, force = options.get("save_qdq"), bool(options.get("force", False))
    if qdq_path:  # refused before the work, not after it
        source = model.path if isinstance(model, LoadedModel) else model
        runfolder.check_model_target(Path(qdq_path), flag="--save-qdq", protect=[Path(source)], force=force)
    result = measure(model, calib, progress=progress, runner=runner, **options)
    if qdq_path:
        save_qdq(result, qdq_path, force=force)
    if out is not None:
        save_scan(result, out)
    return result


def save_scan(result: ScanResult, out: str | Path) -> list[Path]:
    """Write the run folder: layers/tensors/ops/channels.csv, hist.npz, [compat/partitions.csv],
    [task.csv], summary.md, run.json and (unless `result.no_report`) report.html; every file atomic."""
    folder = runfolder.ensure_out_dir(Path(out))
    t0 = time.perf_counter()
    written = _write_tables(result, folder)
    plan = runfolder.read_plan(folder / "plan.json")  # a bisect run into this folder before the scan
    text = summary_markdown(result, plan)
    if result.calib_advice is not None:
        from quantscan.scanning.calib_advice import advice_markdown

        text += advice_markdown(result.calib_advice)
    runfolder.atomic_write_text(folder / "summary.md", text)
    written.append(folder / "summary.md")
    writing = time.perf_counter() - t0
    times = result.run_info.times_s
    total = times.pop("total", 0.0) + writing  # run.json's order: the phases, writing, total
    times["writing"] = round(writing, 4)
    times["total"] = round(total, 4)
    result.run_info.warnings = list(result.warnings)
    runfolder.write_json(folder / runfolder.RUN_JSON, result.run_info.to_json())
    written.append(folder / runfolder.RUN_JSON)
    if not result.no_report:
        from quantscan.report.html import write_report  # matplotlib: only when a page is wanted

        t0 = time.perf_counter()
        written.append(write_report(folder))
        times["report"] = round(time.perf_counter() - t0, 4)
    result.files.extend(written)
    return written


def _write_tables(result: ScanResult, folder: Path) -> list[Path]:
    """The scan's CSV tables and hist.npz, in the order run folders have always listed them."""
    written = [folder / f"{name}.csv" for name in TABLES]
    for name, path in zip(TABLES, written, strict=True):
        runfolder.write_csv(path, getattr(result, name))
    runfolder.write_npz(folder / "hist.npz", result.hist)
    written.append(folder / "hist.npz")
    if result.compat is not None:
        for name in ("compat", "partitions"):
            frame = result.compat.findings if name == "compat" else result.compat.partitions
            runfolder.write_csv(folder / f"{name}.csv", frame)
            written.append(folder / f"{name}.csv")
    if result.task is not None and not result.task.empty:
        runfolder.write_csv(folder / "task.csv", result.task)
        written.append(folder / "task.csv")
    if result.calib_advice is not None:
        written.append(write_advice(result.calib_advice, folder))
    return written


def save_qdq(result: ScanResult, path: str | Path, *, force: bool = False) -> Path:
    """The all-int8 QDQ model as the user gets it (the original's input/output declarations); a file
    quantscan did not write is replaced only with `force`."""
    target = runfolder.save_model(deployable_qdq(result.qdq_model, result.model), Path(path),
                                  protect=[result.model.path], flag="--save-qdq", force=force)
    result.files.append(target)
    return target


def calib_advice(
    model: str | Path | LoadedModel,
    calib: str | Path | CalibSet,
    *,
    pick: int | None = None,
    out: str | Path | None = None,
    progress: ProgressFactory = no_progress,
    runner: Runner | None = None,
    **options: Any,
) -> CalibAdvice:
    """`quantscan calib-advice`: one calibration pass (per-sample ranges kept), then is the set big enough,
    which samples decide ranges, and (`pick`) the subset that reproduces the scales; with `out`,
    calib_advice.csv and (`pick`) `out/picked/`, a folder usable as `--calib`."""
    from quantscan.records import CalibMethod
    from quantscan.scanning.prepare import prepare_scan

    if pick is not None and (isinstance(pick, bool) or not isinstance(pick, int) or pick <= 0):
        raise UsageError(f"--pick: expected a positive integer, found {pick!r}")
    if str(options.get("calib_method", CalibMethod.MINMAX)) != CalibMethod.MINMAX:
        raise UsageError(f"--calib-method: calib-advice expected minmax (scales as min/max of per-sample ranges), "
                         f"found {options['calib_method']}")
    ctx = prepare_scan(model, calib, progress=progress, runner=runner, **options)
    return advice_for(ctx, pick, out, subset_cosines=True)


def advice_for(ctx: ScanContext, pick: int | None, out: str | Path | None, subset_cosines: bool = False) -> CalibAdvice:
    """The advice from a prepared scan's pass 1 (plus one evaluation pass per top deciding sample, one for
    the full set, and with `subset_cosines` three per subset size: scanning.advice_eval);
    calib_advice.csv and (`pick`) picked/ under `out`."""
    from quantscan.scanning.advice_eval import with_coverage, with_decider_cosines, with_subset_cosines
    from quantscan.scanning.calib_advice import advise_run

    cset = ctx.data.cset
    if ctx.chip.scheme.weight_only:
        raise UsageError(f"calib-advice: expected quantized activations (uint8, int8 or int16), found scheme "
                         f"{ctx.chip.scheme.name()} with float activations: a weight-only scheme has no "
                         "activation ranges to advise on")
    advice = advise_run(ctx.quant.calib_stats.sample_ranges, str(ctx.chip.activations), cset.files, cset.n_samples,
                        str(ctx.opts.calib_method), pick, ctx.opts.seed)
    advice = with_coverage(ctx, with_decider_cosines(ctx, advice))
    if subset_cosines:
        advice = with_subset_cosines(ctx, advice)
    if out is not None:
        folder = runfolder.ensure_out_dir(Path(out))
        write_advice(advice, folder)
        if pick is not None:
            from quantscan.calib.picked import write_picked

            write_picked(cset, advice.picked, folder / "picked")
    return advice


def write_advice(advice: CalibAdvice, folder: Path) -> Path:
    """calib_advice.csv (scanning.calib_advice.ADVICE_COLUMNS)."""
    import pandas as pd

    from quantscan.scanning.calib_advice import ADVICE_COLUMNS, advice_records

    path = folder / "calib_advice.csv"
    frame = pd.DataFrame(advice_records(advice), columns=list(ADVICE_COLUMNS))
    counts = {c: "Int64" for c in ("n", "draws", "k", "samples", "samples_past", "cosine_draws")}  # blank, not 8.0
    runfolder.write_csv(path, frame.astype(counts))
    return path


def run_bisect(
    model: str | Path | None = None, calib: str | Path | None = None, **options: Any
) -> BisectResult:
    """`quantscan bisect`: output gain, then a resumable bisection to the target; with `out=`, a scan's
    summary.md in that folder gets the plan block on its first screen.

    The keywords are the CLI's flags (`target_cosine=`, `fallback=`, `resume=`, `evaluator=`, ...): they
    become a `BisectRequest`, `BisectHooks` and `ScanOptions` (bisect/request.py `from_keywords`) for
    `quantscan.bisect.driver.bisect_model`, which takes those three objects."""
    from quantscan.bisect.driver import bisect_model  # onnxruntime and pandas: only when a bisection runs
    from quantscan.bisect.request import from_keywords

    request, hooks, scan = from_keywords({"summary_block": with_plan_block, **options})
    return bisect_model(model, calib, request, ScanOptions(**scan), hooks)
