"""`check --profile all`: every shipped profile on one analysis of the model, with the findings each
profile gives alone, and the chip table (profiles.csv) that says which chip takes the model best."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest

from builders import build
from quantscan.compat.check import check
from quantscan.compat.profiles import expand, load_profile, shipped_names
from quantscan.errors import ProfileError

MIXED = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 8, 8, 8] x) => (float[1, 8, 4, 4] y) {
  c = Conv<group = 2, kernel_shape = [1, 1]>(x, w)
  d = Div(c, two)
  e = Sqrt(d)
  y = AveragePool<kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], count_include_pad = 0>(e)
}
"""
"""A grouped Conv, a Div, a Sqrt and a padded AveragePool: chips list and limit these differently."""


def mixed() -> onnx.ModelProto:
    return build(MIXED, {"w": np.ones((8, 4, 1, 1), np.float32), "two": np.array(2.0, np.float32)})


def test_all_expands_to_every_shipped_profile_once_in_order() -> None:
    names = shipped_names()
    assert expand(["all"]) == names
    assert expand(["rk3588", "all"]) == ["rk3588", *[n for n in names if n != "rk3588"]]
    custom = Path("my_chip.toml")
    assert expand(["all", custom]) == [*names, custom]


def test_all_is_for_check_only() -> None:
    """scan/bisect simulate one chip: `all` names none of them, and says so."""
    with pytest.raises(ProfileError, match="expected one chip profile, found 'all'.*check"):
        load_profile("all")


def _rows(frame: pd.DataFrame, mask: pd.Series) -> pd.DataFrame:
    return frame[mask.to_numpy()].reset_index(drop=True)


def assert_same_as_alone(model: onnx.ModelProto | Path) -> None:
    """Every profile's rows of the `all` run are, row for row, what that profile alone gives."""
    together = check(model, ["all"])
    assert together.profiles == shipped_names()
    for name in together.profiles:
        alone = check(model, [name])
        mine = together.findings["profile"] == name
        pd.testing.assert_frame_equal(_rows(together.findings, mine), alone.findings, check_dtype=False)
        pd.testing.assert_frame_equal(_rows(together.details, mine), alone.details, check_dtype=False)
        parts = together.partitions["profile"] == name
        pd.testing.assert_frame_equal(_rows(together.partitions, parts), alone.partitions, check_dtype=False)
        assert together.node_placement[name] == alone.node_placement[name]


def test_all_gives_each_profile_its_own_findings() -> None:
    assert_same_as_alone(mixed())


def test_profile_table_counts_and_order() -> None:
    """profiles.csv against an independent count of the findings and partitions: errors, warnings and
    CPU islands per profile, fewest errors first, then fewest CPU islands, then fewest warnings."""
    r = check(mixed(), ["all"])
    table = r.profile_table()
    counts = r.findings.groupby(["profile", "severity"]).size().unstack(fill_value=0)
    islands = r.partitions[r.partitions["placement"] == "cpu"].groupby("profile").size()
    for row in table.itertuples():
        assert row.errors == counts.get("error", pd.Series(dtype=int)).get(row.profile, 0)
        assert row.warnings == counts.get("warn", pd.Series(dtype=int)).get(row.profile, 0)
        assert row.cpu_islands == islands.get(row.profile, 0)
    keys = list(zip(table["errors"], table["cpu_islands"], table["warnings"], table["profile"], strict=True))
    assert keys == sorted(keys) and sorted(table["profile"]) == shipped_names()
    assert len(set(keys)) > 3  # the model tells the chips apart


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "quantscan", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)


def test_cli_check_all_prints_the_chip_table_and_writes_profiles_csv(tmp_path: Path) -> None:
    model = tmp_path / "mixed.onnx"
    onnx.save(mixed(), model)
    proc = run("check", model, "--profile", "all", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(tmp_path / "out" / "profiles.csv")
    findings = pd.read_csv(tmp_path / "out" / "compat.csv")
    assert sorted(table["profile"]) == shipped_names() and set(findings["profile"]) <= set(shipped_names())
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["chip", "errors", "warnings", "CPU", "islands", "CPU", "nodes"]
    printed = [line.split() for line in lines[1:1 + len(table)]]
    expected = table[["profile", "errors", "warnings", "cpu_islands", "cpu_nodes"]].astype(str).values.tolist()
    assert printed == expected
    assert "profiles.csv" in lines[len(table) + 1]


def test_cli_one_profile_writes_no_chip_table(tmp_path: Path) -> None:
    model = tmp_path / "mixed.onnx"
    onnx.save(mixed(), model)
    proc = run("check", model, "--profile", "neutron", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("neutron: ") and not (tmp_path / "out" / "profiles.csv").exists()


@pytest.mark.real
@pytest.mark.parametrize("name", ["ppocrv4_rec", "ddddocr_common_det"])
def test_all_on_real_models_gives_each_profile_its_own_findings(assets: Path, name: str) -> None:
    """PP-OCRv4 rec and the YOLOX detector: the `all` run's rows are each profile's own."""
    assert_same_as_alone(onnx.load(assets / "models" / f"{name}.onnx"))


NOT_LISTED = {
    # (model, profile): the model's op types the profile's document does not list, read off by hand
    ("ddddocr_common_det", "neutron"): {"Resize"},  # no upsample in ExecuTorch 1.2's Neutron list
    ("ddddocr_common_det", "ax650"): set(),
    ("ddddocr_common_det", "qnn-htp"): set(),
    ("ppocrv4_rec", "ax650"): set(),
    ("ppocrv4_rec", "qnn-htp"): set(),
    # Neutron's list has no Div/Sub/Pow/Sqrt (PP-OCRv4's decomposed LayerNorm and HardSwish), HardSigmoid,
    # Squeeze, nor a BatchNormalization without a Conv to fold into
    ("ppocrv4_rec", "neutron"): {"Div", "Sub", "Pow", "Sqrt", "HardSigmoid", "Squeeze", "BatchNormalization"},
}


@pytest.mark.real
@pytest.mark.parametrize("name", ["ppocrv4_rec", "ddddocr_common_det"])
def test_all_on_real_models_names_the_unlisted_ops(assets: Path, name: str) -> None:
    """The op-list facts on the two real models: exactly the op types the documents leave out are
    reported as running off the NPU, per profile, from the one `all` run."""
    rows = check(assets / "models" / f"{name}.onnx", ["all"]).findings
    for (model, profile), expected in NOT_LISTED.items():
        if model == name:
            mine = rows[(rows["profile"] == profile) & (rows["rule"] == "unsupported-op")]
            assert set(mine["op_type"]) == expected, profile


def test_cli_profiles_lists_the_new_chips() -> None:
    proc = run("profiles")
    assert proc.returncode == 0, proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    assert names == shipped_names()
    assert {"hisilicon-svp", "ascend310", "hailo8", "ax650", "neutron", "qnn-htp"} <= set(names)
