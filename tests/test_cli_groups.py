"""The CLI's argument groups parse once into records whose fields are ScanOptions keywords."""

from __future__ import annotations

import dataclasses

import pytest

from quantscan.cli import build_parser
from quantscan.cli.args import GainArgs, SampleArgs, TaskArgs
from quantscan.errors import UsageError
from quantscan.scanning.options import MEASUREMENT_OPTIONS, ScanOptions


def _names(record: type) -> set[str]:
    return {f.name for f in dataclasses.fields(record)}


def test_every_group_field_is_a_scan_option_and_every_measured_option_has_a_flag() -> None:
    options = _names(ScanOptions)
    for group in (SampleArgs, TaskArgs, GainArgs):
        assert _names(group) <= options, group.__name__
    # a bisect session records MEASUREMENT_OPTIONS; each must come from a flag scan and bisect share
    assert set(MEASUREMENT_OPTIONS) <= _names(SampleArgs) | _names(TaskArgs)


def test_scan_and_bisect_parse_the_data_flags_alike() -> None:
    flags = ["--calib", "d", "--input-shape", "x:1,3,8,8", "--input-shape", "batch=2", "--const", "sr=16000",
             "--state", "h1=h0", "--mean", "0.5,0.5,0.5", "--limit", "4", "--profile", "rk3588",
             "--max-memory", "2G", "--task", "classify"]
    parser = build_parser()
    scan = parser.parse_args(["scan", "m.onnx", *flags])
    bisect = parser.parse_args(["bisect", "m.onnx", *flags, "--target-cosine", "0.99"])
    a, b = SampleArgs.parse(scan, "scan"), SampleArgs.parse(bisect, "bisect")
    assert a == b
    assert a.input_shape == {"x": [1, 3, 8, 8]} and a.input_dims == ["batch=2"]
    assert a.const == {"sr": 16000.0} and a.state == {"h1": "h0"}
    assert a.preprocess_overrides == {"mean": [0.5, 0.5, 0.5]} and a.profile == "rk3588"
    assert TaskArgs.parse(scan).task == TaskArgs.parse(bisect).task == "classify"
    ScanOptions(**a.scan_options(), **TaskArgs.parse(scan).scan_options()).validate()


def test_gain_group_and_profile_count_refusals() -> None:
    parser = build_parser()
    args = parser.parse_args(["scan", "m.onnx", "--calib", "d", "--gain-candidates", "x"])
    with pytest.raises(UsageError, match="--gain-candidates"):
        GainArgs.parse(args)
    assert GainArgs.parse(parser.parse_args(["scan", "m", "--calib", "d", "--no-gain"])).scan_options() == {
        "gain_candidates": 0}
    two = parser.parse_args(["scan", "m", "--calib", "d", "--profile", "a", "--profile", "b"])
    with pytest.raises(UsageError, match="expected one --profile"):
        SampleArgs.parse(two, "scan")
