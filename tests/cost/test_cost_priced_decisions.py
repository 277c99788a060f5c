"""Every decision priced on a real model: layers.csv, summary.md, plan.json and partitions.csv carry the
board time that `quantscan cost` computes for the same model, profile and shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import asset_calib, asset_model


def qs(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quantscan", *map(str, args)], capture_output=True, text=True,
                          timeout=900)


@pytest.mark.real
def test_scan_and_bisect_price_each_site_and_the_plan(tmp_path: Path, assets: Path) -> None:
    model, calib = asset_model(assets, "ppocr_mobile_v2_cls"), asset_calib(assets, "ppocr_mobile_v2_cls")
    run = tmp_path / "run"
    proc = qs("scan", model, "--calib", calib, "--profile", "rk3588", "--limit", "8", "--out", run, "--quiet")
    assert proc.returncode == 0, proc.stderr
    layers = pd.read_csv(run / "layers.csv")
    info = json.loads((run / "run.json").read_text())
    board = info["options"]["board_time"]
    # the same figures `quantscan cost` gives at the shapes the scan ran (batch 1)
    shape = ",".join(str(d) for d in board["input_shapes"]["x"])
    proc = qs("cost", model, "--profile", "rk3588", "--input-shape", f"x:{shape}", "--out", tmp_path / "cost")
    assert proc.returncode == 0, proc.stderr
    cost = json.loads((tmp_path / "cost" / "cost.json").read_text())
    assert board["int8_ms"] == pytest.approx(cost["total_ms"], rel=1e-6)
    by_node = {s["node"]: s["est_ms"] for s in cost["per_site"]}
    priced = layers.dropna(subset=["est_ms"])
    assert len(priced) >= 0.9 * (layers["placement"] == "npu").sum()
    assert all(by_node[n] == pytest.approx(v, abs=1e-6) for n, v in zip(priced["node"], priced["est_ms"], strict=True))
    assert (priced["fallback_extra_ms"] > 0).all()  # fp16 is slower than int8, and adds converters
    top = layers.iloc[0]
    summary = (run / "summary.md").read_text()
    # the first fixes are priced: a rewrite at no latency cost, or the top site kept float at its fp16 price
    fixes = [line for line in summary.splitlines() if "First thing to try" in line or line.startswith("- **Then**")]
    assert fixes and ("no latency cost" in fixes[0] or " ms" in fixes[0])
    assert any(f"{top['fallback_extra_ms']:+.3g} ms" in line and "estimated on rk3588" in line for line in fixes)

    proc = qs("bisect", model, "--calib", calib, "--profile", "rk3588", "--limit", "8", "--target-cosine", "0.99999",
              "--out", run, "--quiet")
    assert proc.returncode in (0, 1), proc.stderr
    plan = json.loads((run / "plan.json").read_text())
    assert plan["board_time"]["profile"] == "rk3588" and plan["board_time"]["estimated"] is True
    # priced at the shapes the scan in the same folder priced: the same all-int8 time
    assert plan["board_time"]["int8_ms"] == pytest.approx(board["int8_ms"], rel=1e-6)
    assert plan["extra_ms"] == pytest.approx(plan["estimated_ms"] - plan["board_time"]["int8_ms"], abs=1e-5)
    points = plan["pareto"]
    assert all("extra_ms" in p for p in points)
    # more sites kept at fp16 never cost less here (every kernel is slower at fp16)
    extras = [p["extra_ms"] for p in sorted(points, key=lambda p: p["float_sites"])]
    assert extras == sorted(extras)
    # `quantscan cost --plan` prices the same plan the same way
    proc = qs("cost", model, "--profile", "rk3588", "--plan", run / "plan.json", "--out", tmp_path / "c2")
    assert proc.returncode == 0, proc.stderr
    again = json.loads((tmp_path / "c2" / "cost.json").read_text())["plan"]
    assert again["extra_ms"] == pytest.approx(plan["extra_ms"], abs=1e-5)


@pytest.mark.real
def test_check_prices_each_partition(tmp_path: Path, assets: Path) -> None:
    model = asset_model(assets, "ppocrv4_rec")
    proc = qs("check", model, "--profile", "rk3568", "--profile", "horizon-x3", "--input-shape", "x:1,3,48,320",
              "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    parts = pd.read_csv(tmp_path / "partitions.csv")
    rk = parts[parts["profile"] == "rk3568"]
    assert parts.loc[parts["profile"] == "horizon-x3", "est_ms"].isna().all()  # no [cost] table: not priced
    cpu = rk[(rk["placement"] == "cpu") & (rk["est_ms"] > 0)]
    assert not cpu.empty
    figures = json.loads(json.dumps(__import__("quantscan.cost", fromlist=["CostTable"]).CostTable.of(
        __import__("quantscan.compat", fromlist=["load_profile"]).load_profile("rk3568")).figures()))
    # a CPU island fed by the NPU pays at least one partition crossing
    assert (cpu["est_ms"] >= figures["partition_us"] * 1e-3).all()
