"""Shared fixtures: where the real models and calibration sets live.

The real assets sit in `../shared/assets` beside the checkout (CI copies them there); set
QUANTSCAN_ASSETS to point elsewhere. Tests that need them are skipped when they are absent, so a
user's clone still runs the tiny-model tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


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
