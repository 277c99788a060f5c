"""Shared fixtures: where the real models and calibration sets live.

The real assets sit in `../shared/assets` beside the checkout (CI copies them there); set
QUANTSCAN_ASSETS to point elsewhere. Tests that need them are skipped when they are absent, so a
user's clone still runs the tiny-model tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _assets_dir() -> Path:
    env = os.environ.get("QUANTSCAN_ASSETS")
    return Path(env) if env else REPO.parent / "shared" / "assets"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that reads the assets (directly or through a module-scoped fixture) must be marked real.

    The marker is what `-m "not real"` deselects on a user's clone without `../shared`, so a test that
    reads the assets unmarked would be skipped silently there; failing here keeps the marker honest.
    Checked per test item (its fixture closure), not inside the fixture: module-scoped fixtures that
    build on `assets` (a scan shared by a module's tests) would otherwise be a ScopeMismatch.
    """
    if "assets" in getattr(item, "fixturenames", ()) and item.get_closest_marker("real") is None:
        pytest.fail(f"{item.nodeid} reads ../shared/assets but is not marked @pytest.mark.real")


@pytest.fixture(scope="session")
def assets() -> Path:
    """The real assets folder; a test that asks for it must carry `@pytest.mark.real` (see above)."""
    path = _assets_dir()
    if not (path / "models").is_dir():
        pytest.skip(f"real assets not found at {path}")
    return path


def asset_model(assets: Path, name: str) -> Path:
    return assets / "models" / f"{name}.onnx"


def asset_calib(assets: Path, name: str) -> Path:
    return assets / "calib" / name
