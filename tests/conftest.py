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


@pytest.fixture
def assets(request: pytest.FixtureRequest) -> Path:
    """The real assets folder; a test that asks for it must carry `@pytest.mark.real`.

    The marker is what `-m "not real"` deselects on a user's clone without `../shared`, so a test that
    reads the assets unmarked would be skipped silently there; failing here keeps the marker honest.
    """
    if request.node.get_closest_marker("real") is None:
        pytest.fail(f"{request.node.nodeid} reads ../shared/assets but is not marked @pytest.mark.real")
    path = _assets_dir()
    if not (path / "models").is_dir():
        pytest.skip(f"real assets not found at {path}")
    return path


def asset_model(assets: Path, name: str) -> Path:
    return assets / "models" / f"{name}.onnx"


def asset_calib(assets: Path, name: str) -> Path:
    return assets / "calib" / name


@pytest.fixture(scope="module")
def module_assets(request: pytest.FixtureRequest) -> Path:
    """The real assets folder for module-scoped fixtures (one real scan shared by several tests).

    A module-scoped fixture cannot ask for the function-scoped `assets` (pytest's ScopeMismatch), and
    from module scope no single test's marker is visible: so every collected test of the module that
    reaches this fixture must carry `@pytest.mark.real`, checked here, keeping the marker honest.
    """
    unmarked = [item.nodeid for item in request.session.items
                if getattr(item, "module", None) is request.module
                and "module_assets" in getattr(item, "fixturenames", ())
                and item.get_closest_marker("real") is None]
    if unmarked:
        pytest.fail(f"{unmarked[0]} reads ../shared/assets but is not marked @pytest.mark.real")
    path = _assets_dir()
    if not (path / "models").is_dir():
        pytest.skip(f"real assets not found at {path}")
    return path
