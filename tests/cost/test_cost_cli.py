"""`quantscan cost` end to end: on a real model, with a plan, and refusing a profile it cannot price."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import asset_model

REC_SHAPE = "x:1,3,48,320"


def cost(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quantscan", "cost", *map(str, args)],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.real
def test_cost_on_a_real_model_writes_a_total_its_rows_add_up_to(tmp_path: Path, assets: Path) -> None:
    model = asset_model(assets, "ppocrv4_rec")
    out = tmp_path / "cost"
    proc = cost(model, "--profile", "rk3588", "--input-shape", REC_SHAPE, "--out", out)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "cost.json").read_text())
    assert doc["profile"] == "rk3588"
    rows = pd.read_csv(out / "cost.csv")
    assert list(rows["node"]) == [s["node"] for s in doc["per_site"]]
    # the total is what each kernel and boundary costs plus the fixed per-inference time
    assert doc["total_ms"] == pytest.approx(rows["est_ms"].sum() + rows["boundary_ms"].sum() + doc["run_overhead_ms"],
                                            abs=1e-4)
    assert set(rows["bound"]) <= {"compute", "memory", "overhead"}
    assert {"compute", "overhead"} <= set(rows["bound"])
    assert {a["figure"] for a in doc["assumptions"]} >= {"clock_mhz", "dram_gbps", "converter_us", "partition_us"}
    assert all(a["source"] for a in doc["assumptions"])
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    names = {n.name for n in graph.node}
    kernel_sites = rows[rows["site"] & (rows["kernel"] != "input")]
    assert set(kernel_sites["node"]) <= names
    # a model input site is named by its input, as layers.csv names it (sites.input_sites)
    assert set(rows.loc[rows["kernel"] == "input", "node"]) <= {i.name for i in graph.input}


@pytest.mark.real
def test_a_plan_is_priced_with_its_conversions(tmp_path: Path, assets: Path) -> None:
    model = asset_model(assets, "ppocrv4_rec")
    first = cost(model, "--profile", "rk3588", "--input-shape", REC_SHAPE, "--out", tmp_path / "a")
    assert first.returncode == 0, first.stderr
    sites = [s for s in json.loads((tmp_path / "a" / "cost.json").read_text())["per_site"] if s["site"]]
    keep = [sites[3]["node"], sites[10]["node"]]
    plan = {"fallback": "float", "sites": [{"node": n, "precision": "float"} for n in keep],
            "pareto": [{"float_sites": 1, "value": 0.9, "sites": keep[:1]}, {"float_sites": 2, "value": 0.95,
                                                                             "sites": keep}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    proc = cost(model, "--profile", "rk3588", "--input-shape", REC_SHAPE, "--plan", tmp_path / "plan.json",
                "--out", tmp_path / "b")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "b" / "cost.json").read_text())
    priced = doc["plan"]
    precision = {s["node"]: s["precision"] for s in doc["per_site"]}
    assert [precision[n] for n in keep] == ["fp16", "fp16"]
    assert doc["total_ms"] == pytest.approx(priced["estimated_ms"], abs=1e-5)
    assert priced["extra_ms"] == pytest.approx(priced["estimated_ms"] - priced["int8_ms"], abs=1e-5)
    assert priced["extra_ms"] > 0 and any(b["kind"] == "converter" for b in doc["boundaries"])
    assert [p["extra_ms"] for p in priced["pareto"]][1] == pytest.approx(priced["extra_ms"], abs=1e-5)
    assert 0 < priced["pareto"][0]["extra_ms"] < priced["pareto"][1]["extra_ms"]


def assert_one_line_exit_2(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantscan: error: "), proc.stderr
    assert all(n in lines[0] for n in needles), lines[0]


def test_a_profile_without_a_cost_table_exits_2_naming_it(tmp_path: Path) -> None:
    import onnx
    from test_cost_model import two_convs

    model = tmp_path / "m.onnx"
    onnx.save(two_convs(), model)  # type: ignore[arg-type]
    proc = cost(model, "--profile", "horizon-x3", "--out", tmp_path / "out")
    assert_one_line_exit_2(proc, "horizon-x3", "[cost] table", "clock_mhz")
    assert not (tmp_path / "out" / "cost.json").exists()
    bad_plan = tmp_path / "plan.json"
    bad_plan.write_text(json.dumps({"sites": [{"node": "not_a_node", "precision": "float"}]}))
    proc = cost(model, "--profile", "rk3588", "--plan", bad_plan, "--out", tmp_path / "out")
    assert_one_line_exit_2(proc, "--plan", "not_a_node")


def test_profile_onnxruntime_measures_the_qdq_model_node_by_node(tmp_path: Path) -> None:
    import onnx
    from test_cost_model import two_convs

    model = tmp_path / "m.onnx"
    onnx.save(two_convs(), model)  # type: ignore[arg-type]
    proc = cost(model, "--profile", "onnxruntime", "--runs", "5", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "out" / "cost.json").read_text())
    assert doc["profile"] == "onnxruntime" and doc["float_ms"] > 0
    kernels = {s["kernel"]: s for s in doc["per_site"]}
    # at ORT_ENABLE_ALL onnxruntime runs the QDQ Conv as one integer kernel (its QDQ fusion)
    assert kernels["QLinearConv"]["precision"] == "int8"
    assert all(len(s["repeats_ms"]) == 2 for s in doc["per_site"])
    # the nodes run inside the timed runs: their medians cannot add up to much more than a run
    assert sum(s["est_ms"] for s in doc["per_site"]) <= 1.5 * doc["total_ms"]
    assert set(doc["repeatability"]) == {"median_rel_diff", "time_weighted_rel_diff", "within_10pct",
                                         "total_rel_diff"}


def test_a_preempted_run_does_not_move_the_measured_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a shared machine runs are only ever slowed: a node's time is the lower quartile of its runs, so two
    repetitions whose runs differ only in one preempted run (10x slower) give the same time."""
    from test_cost_model import two_convs

    import quantscan.runner as runner
    from quantscan.cost.measure import measure
    from quantscan.records import ActivationScheme
    from quantscan.runner import NodeProfile
    from quantscan.scanning.ort_recipe import quantize_static_call

    runs = iter([[10.0, 11.0, 12.0, 13.0, 14.0], [10.0, 11.0, 12.0, 13.0, 140.0]] * 2)

    def fake(model: object, feeds: object, **_: object) -> NodeProfile:
        times = next(runs)
        return NodeProfile({"conv": times}, {"conv": "QLinearConv"}, [t + 1.0 for t in times])

    monkeypatch.setattr(runner, "profile_nodes", fake)
    m = measure(two_convs(), quantize_static_call(ActivationScheme.UINT8), runs=5, repeats=2)  # type: ignore[arg-type]
    lower_quartile = 11.0  # of 10, 11, 12, 13, 14 (numpy's linear interpolation: position 1 of 0..4)
    assert m.nodes[0].typical_us == (lower_quartile, lower_quartile)
    assert m.repeatability()["total_rel_diff"] == 0.0
    assert m.total_ms == pytest.approx((lower_quartile + 1.0) * 1e-3)
