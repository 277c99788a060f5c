"""Scaling of a sharded scan (issue 29): wall and efficiency at 1 and 2 workers, and a model of N nodes.

    nice python benchmarks/scale.py [--samples 224] [--model yolo640] [--executors process ray]
                                    [--workers 1 2] [--repeats 1] [--skip-runs]

Part 1 runs the whole CLI (`quantscan scan --workers W --executor E --no-report`, default settings, a
fresh process each: imports, a local Ray's start and the actors' imports included) on a 640x640 YOLOv8n-
shaped detector (benchmarks/make_yolo.py, seeded weights) over `--samples` seeded 1x3x640x640 samples,
and prints wall, the run.json phases and efficiency = wall(1 worker) / (W x wall(W)) per executor.
The load average is printed beside (2 cores shared with other sessions: compare ratios).

Part 2 measures, in this process, what a model of N nodes needs (the `--model` at 16 samples):
- `setup`: one evaluation shard's fixed cost (its sessions and graph), from shards of 8 and 16 samples;
- `per sample`: the evaluation's cost per sample on one core;
- `job bytes`: the pickled pass-2 job every node receives once (model, QDQ model, plan, sites), and
  the object store's put+get time for it here; `result bytes` and `merge`: one shard's sums and the
  time to add them into the total;
- `serial`: what no shard takes (imports, load, probe, plan, tables, writing), from part 1.
Then T(N) = serial + (calibration + gain ranking) / N + setup + per_sample x S / N + N x (job transfer + result transfer
+ merge), with transfers at `--bandwidth` (default 1 GB/s, 10 GbE) through the head's link, and the N
where the gain from one more node falls under its cost. Shards are whole batches, so N also stops at
S / batch. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine import workload  # noqa: E402  (benchmarks/ is not a package)

PHASES = ("load", "probe", "calibration", "evaluation", "tables", "impact")
CACHE = Path("/tmp/quantscan-engine-cache")


def load_average() -> str:
    return "{:.1f} / {:.1f} / {:.1f}".format(*os.getloadavg())


def timed_scan(model: Path, calib: Path, out: Path, workers: int, executor: str,
               ray_address: str | None = None) -> dict[str, float]:
    """Wall seconds of one CLI scan and its run.json phases."""
    cmd = [sys.executable, "-m", "quantscan", "scan", str(model), "--calib", str(calib), "--out", str(out),
           "--workers", str(workers), "--executor", executor, "--no-report", "--quiet", "--force"]
    if executor == "ray" and ray_address:
        cmd += ["--ray-address", ray_address]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    times = json.loads((out / "run.json").read_text())["times_s"]
    return {"wall": wall, **{p: float(times.get(p, 0.0)) for p in (*PHASES, "total")}}


def part1(model: Path, calib: Path, args: argparse.Namespace, work: Path) -> dict[tuple[str, int], dict[str, float]]:
    """The CLI runs, best of `--repeats`, and the table."""
    best: dict[tuple[str, int], dict[str, float]] = {}
    print(f"## part 1: {args.model}, {args.samples} samples, default settings; load {load_average()} at start")
    for _ in range(args.repeats):
        for executor in args.executors:
            for workers in args.workers:
                got = timed_scan(model, calib, work / f"out_{executor}_{workers}", workers, executor,
                                 args.ray_address)
                key = (executor, workers)
                best[key] = {k: min(v, best.get(key, got)[k]) for k, v in got.items()}
                print(f"  {executor} {workers}w: wall {got['wall']:.1f} s, load {load_average()}", flush=True)
    print("| executor | workers | wall s | " + " | ".join(f"{p} s" for p in PHASES) + " | efficiency |")
    print("|---" * (4 + len(PHASES)) + "|")
    for (executor, workers), row in best.items():
        one = best.get((executor, 1)) or best.get(("process", 1))
        eff = f"{one['wall'] / (workers * row['wall']):.2f}" if one else "-"
        print(f"| {executor} | {workers} | {row['wall']:.1f} | "
              + " | ".join(f"{row[p]:.1f}" for p in PHASES) + f" | {eff} |")
    print(f"load {load_average()} at end", flush=True)
    return best


def part2(model: Path, calib: Path) -> dict[str, float]:
    """Per-shard setup, per-sample cost, job and result bytes, merge and object-store time, in this process."""
    import quantscan.scanning.workers as w
    from quantscan import graph as qgraph
    from quantscan.scanning.prepare import prepare_scan

    ctx = prepare_scan(model, calib, limit=16, batch_size=8, threads=1)
    qdq = qgraph.build_qdq_model(ctx.graph.prepared.proto, ctx.graph.sites, ctx.quant.plan)
    compare = [t for t in ctx.graph.probe.tensor_order if t in ctx.graph.probe.float_tensors]
    source = w.sample_source(calib, ctx.loaded.inputs, ctx.opts)
    job = w.EvalJob(ctx.graph.prepared, qdq.SerializeToString(), list(ctx.graph.sites), ctx.quant.plan, compare,
                    ctx.graph.probe, ctx.opts,
                    ctx.data.batch_size, 1, ctx.runner.opt_level, source)
    timed: dict[int, float] = {}
    results = []
    for stop in (8, 16):
        t0 = time.process_time()
        result = w.run_eval_shard(job, (0, stop), 1)
        timed[stop] = time.process_time() - t0
        results.append(result)
    per_sample = (timed[16] - timed[8]) / 8
    setup = max(0.0, timed[8] - 8 * per_sample)
    job_bytes = len(pickle.dumps(job))
    result_bytes = len(pickle.dumps(results[0]))
    t0 = time.perf_counter()
    for _ in range(10):
        merged = pickle.loads(pickle.dumps(results[0].sums))
        merged.merge(results[1].sums)
    merge = (time.perf_counter() - t0) / 10
    store = object_store_seconds(job)
    return {"setup": setup, "per_sample": per_sample, "job_bytes": job_bytes, "result_bytes": result_bytes,
            "merge": merge, "store": store, "batch": ctx.data.batch_size}


def object_store_seconds(job: Any) -> float:
    """ray.put of the job and ray.get from one actor here (local object store), or NaN without Ray."""
    try:
        import ray
    except ImportError:
        return math.nan
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # not a running head
    try:
        size = ray.remote(lambda x: len(pickle.dumps(x)))
        ray.get(size.remote(0))  # the worker started
        t0 = time.perf_counter()
        ray.get(size.remote(ray.put(job)))
        return time.perf_counter() - t0
    finally:
        ray.shutdown()


def model_n(costs: dict[str, float], serial: float, calibration: float, samples: int, bandwidth: float) -> None:
    """T(N) for N nodes of one core each, and where it stops scaling."""
    batch = int(costs["batch"])
    max_shards = math.ceil(samples / batch)
    # Every node pulls the job from the head's object store and sends its sums back through the head's link
    # (the worst case: Ray may also serve a pull from a node that already holds the object), then the merge.
    per_node = (costs["job_bytes"] + costs["result_bytes"]) / bandwidth + costs["merge"]

    def wall(n: int) -> float:
        return serial + calibration / n + costs["setup"] + costs["per_sample"] * samples / n + n * per_node

    best = min(range(1, max_shards + 1), key=wall)
    root = math.sqrt((costs["per_sample"] * samples + calibration) / per_node) if per_node else math.inf
    print(f"## part 2: costs (1 thread): setup {costs['setup']:.2f} s/shard, "
          f"{costs['per_sample'] * 1e3:.0f} ms/sample, job {costs['job_bytes'] / 1e6:.1f} MB (object store "
          f"put+get here {costs['store']:.2f} s), result {costs['result_bytes'] / 1e6:.2f} MB, merge "
          f"{costs['merge'] * 1e3:.1f} ms/shard; serial part {serial:.1f} s; bandwidth {bandwidth / 1e9:.1f} GB/s")
    print("| nodes | modelled wall s | speed-up | efficiency |")
    print("|---|---|---|---|")
    one = wall(1)
    for n in sorted({1, 2, 4, 8, 16, 28, 32, 64, 128, max_shards} | {best}):
        shards = min(n, max_shards)
        print(f"| {n}{' (= ' + str(shards) + ' shards)' if shards < n else ''} | {wall(shards):.1f} | "
              f"{one / wall(shards):.2f}x | {one / (n * wall(shards)):.2f} |")
    print(f"fastest at N = {best} (whole batches: at most {max_shards} shards of {batch}); the transfers through "
          f"the head and the merge alone would stop it at N ~ {root:.0f}; the serial part caps the speed-up at "
          f"{one / serial:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--samples", type=int, default=224)
    parser.add_argument("--model", default="yolo640")
    parser.add_argument("--executors", nargs="+", default=["process", "ray"])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--costs", type=Path, default=None,
                        help="part 2's measured costs: read from this JSON file if it exists, else written to it")
    parser.add_argument("--ray-address", default=None,
                        help="a running Ray head for the ray runs (else each run starts a local Ray)")
    parser.add_argument("--bandwidth", type=float, default=1e9, help="bytes/s between head and nodes")
    parser.add_argument("--skip-runs", action="store_true", help="part 2 only, with --serial and --calibration")
    parser.add_argument("--serial", type=float, default=None, help="seconds no shard takes (with --skip-runs)")
    parser.add_argument("--calibration", type=float, default=None,
                        help="1-worker calibration + impact s (--skip-runs)")
    args = parser.parse_args()
    CACHE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, calib = workload(args.model, args.samples, work, CACHE)
        if args.skip_runs:
            serial, calibration = args.serial or 0.0, args.calibration or 0.0
        else:
            best = part1(model, calib, args, work)
            one = best.get(("process", 1)) or next(iter(best.values()))
            serial = one["wall"] - one["calibration"] - one["evaluation"] - one["impact"]
            calibration = one["calibration"] + one["impact"]  # both split N ways (samples, candidates)
        if args.costs is not None and args.costs.is_file():
            costs = json.loads(args.costs.read_text())
        else:
            small = work / "calib16"
            small.mkdir()
            for f in sorted(calib.iterdir())[:16]:
                (small / f.name).symlink_to(f.resolve())
            costs = part2(model, small)
            if args.costs is not None:
                args.costs.write_text(json.dumps(costs))
        model_n(costs, serial, calibration, args.samples, args.bandwidth)


if __name__ == "__main__":
    main()
