"""No invented numbers in suggestions: over every asset model (and single-op case) and every shipped
profile, a number in a finding's `fix` is one the profile documents (its TOML) or a dim the user gave;
a free dim the caller did not size is named as needing a size, never filled with 224 in the advice."""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import pytest

from quantscan.compat import list_profiles
from quantscan.compat.check import check

pytestmark = pytest.mark.real
NUMBER = re.compile(r"(?<![\w.:\-])\d+(?:\.\d+)?(?![\w.])")


def _profile_numbers(name: str) -> set[str]:
    """Every number the shipped profile's TOML states (limits, opset range, batch)."""
    text = (files("quantscan") / "profiles" / f"{name}.toml").read_text()
    return set(NUMBER.findall(text))


def test_suggestions_carry_only_documented_or_given_numbers(assets: Path) -> None:
    profiles = [p.name for p in list_profiles()]
    allowed = {p: _profile_numbers(p) for p in profiles}
    paths = sorted((assets / "models").glob("*.onnx")) + sorted((assets / "ops").glob("*/model.onnx"))
    bad = []
    for path in paths:
        for f in check(path, profiles).records:
            numbers = set(NUMBER.findall(f.fix.replace("=", " ")))
            stray = numbers - allowed[f.profile]
            if stray or "224" in f.fix:
                bad.append((path.parent.name if path.name == "model.onnx" else path.stem, f.profile, f.fix))
            if f.rewrite is not None and f.rewrite.value == "fix-dim":
                assert all(not re.search(r":\d+=", a) for a in f.rewrite_args), f  # no unsized axis settings
    assert not bad, bad[:10]


def test_user_sizes_are_the_ones_suggested(assets: Path) -> None:
    """With --input-shape the settings are the user's numbers (ppocr's OCR line: 48 x 320)."""
    path = assets / "models" / "ppocrv4_rec.onnx"
    (finding,) = [f for f in check(path, ["rk3588"], input_shapes={"x": [1, 3, 48, 320]}).records
                  if f.rule == "dynamic-input"]
    assert finding.rewrite_args == ("batch=1", "x:2=48", "x:3=320")
