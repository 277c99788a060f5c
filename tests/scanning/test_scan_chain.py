"""A loss only a chain explains (an audio front end's magnitude then its compression): |x|² requantized on
the same coarse grid by every site after it, then a square root. Keeping any one site float changes
nothing (the next one rounds to the same grid); keeping the chain float repairs it. The summary must send
the user to bisect, and bisect's plan confirms the chain. Oracle for the chain: the sites written out in
numpy (the power's grid leaves most small values at 0)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser

import quantscan
from quantscan.api import run_bisect
from quantscan.report.summary import summary_markdown

MAGNITUDE_CHAIN = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 64] x) => (float[N, 64] y) {
  p = Mul (x, x)
  a = Abs (p)
  y = Sqrt (a)
}
"""


def test_a_chain_is_sent_to_bisect_and_bisect_keeps_the_chain(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    model = onnx.parser.parse_model(MAGNITUDE_CHAIN)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "chain.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    data = [(rng.normal(size=(4, 64)) * np.exp(rng.normal(size=(4, 64)))).astype(np.float32) for _ in range(4)]
    for i, a in enumerate(data):
        np.savez(calib / f"{i}.npz", x=a)
    x = np.concatenate(data).astype(np.float64)
    step = float((x * x).max()) / 255.0  # the power's uint8 grid, shared by Mul and Abs
    assert np.mean(x * x < step / 2) > 0.3  # a third of the values or more round to code 0 on it
    result = quantscan.scan(path, calib)
    text = summary_markdown(result)
    assert "**Where**: no single site" in text and "quantscan bisect MODEL --calib DIR --target-cosine 0.99" in text
    plan = run_bisect(path, calib, target_cosine=0.99).plan
    assert plan.status == "reached" and len(plan.sites) >= 2  # only a chain reaches it
    assert plan.all_int8 is not None and plan.all_int8["cosine"] < 0.99
