"""Shared fixtures: where the real models and calibration sets live.

The real assets sit in `../shared/assets` beside the checkout (CI copies them there); set
QUANTSCAN_ASSETS to point elsewhere. Tests that need them are skipped when they are absent, so a
user's clone still runs the tiny-model tests.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
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
