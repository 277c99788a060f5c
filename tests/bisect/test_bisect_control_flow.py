"""Bisect on a model whose decoder runs inside a Loop no flag folds (issue 26: PP-Structure SLANet).

A valid model is never refused: bisect searches the top-level sites, and everything it claims says that
the Loop's body stayed float (plan.json `unmeasured`, the CLI's status line, the summary block). The
gains of the sites upstream of the Loop go through the gain graph's branch copies of the Loop, whose
body reads outer-scope tensors; the oracle is each variant run whole (its own standalone mixed model,
not the gain graph's branches).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import loop_decoder
from quantscan.api import run_bisect
from quantscan.report.verdict import plan_lines
from quantscan.scanning.gain import Evaluator, compute_gain, gain_ort_level, mixed_builder
from quantscan.scanning.prepare import prepare_scan


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("decoder")
    model = folder / "decoder.onnx"
    onnx.save(loop_decoder(), model)
    calib = folder / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(5).normal(size=(12, 4)).astype(np.float32))
    return model, calib


def test_gains_through_the_loop_equal_whole_variant_runs(decoder: tuple[Path, Path]) -> None:
    ctx = prepare_scan(*decoder, threads=1)
    nodes = {s.node for s in ctx.graph.sites}
    assert {"enc/MatMul", "head/MatMul"} <= nodes and not any(n.startswith("body/") for n in nodes)
    builder = mixed_builder(ctx)
    gains = compute_gain(ctx, builder, key="cosine").table.set_index("node")
    evaluator = Evaluator(ctx, builder, "cosine")
    base = evaluator.evaluate(builder.precisions([])).worst["cosine"]
    for site in ("enc/MatMul", "head/MatMul"):
        whole = evaluator.evaluate(builder.precisions([site])).worst["cosine"]
        assert gains.loc[site, "gain_if_float"] == pytest.approx(whole - base, abs=1e-7)
    assert gains.loc["enc/MatMul", "gain_if_float"] != pytest.approx(0.0, abs=1e-6)  # the Loop carries it
    # the gain session runs BASIC for a looped model (its body runs per iteration): the same gains as DISABLE
    assert gain_ort_level(builder.proto) == "basic"
    plain = compute_gain(ctx, builder, key="cosine", opt_level="disable").table.set_index("node")
    np.testing.assert_allclose(plain["gain_if_float"], gains.loc[plain.index, "gain_if_float"], atol=1e-7)


def test_bisect_searches_the_top_level_and_says_the_body_stayed_float(decoder: tuple[Path, Path],
                                                                         tmp_path: Path) -> None:
    model, calib = decoder
    result = run_bisect(model, calib, target_cosine=0.9999, out=tmp_path / "b")
    (body,) = result.plan.unmeasured
    assert body.startswith("decoder/Loop (") and result.plan.site_count == len(
        prepare_scan(model, calib, threads=1).graph.sites)
    saved = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert saved["unmeasured"] == [body]
    assert any("Not the int8 model" in line and "decoder/Loop" in line for line in plan_lines(saved))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "quantscan", "bisect", str(model), "--calib", str(calib),
                           "--target-cosine", "0.9999", "--out", str(tmp_path / "cli"), "--quiet"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr
    assert "NOT the int8 model" in proc.stdout and "decoder/Loop" in proc.stdout
    assert proc.stderr.count("not analysed") == 1 and "no flag folds a Loop" in proc.stderr
