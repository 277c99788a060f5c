"""The verdict rule written out in NSR terms (NSR = 10^(-SQNR/10)), case by case."""

from __future__ import annotations

import math

import numpy as np

from quantscan.device.table import SitePairs, verdict


def test_departs_when_the_device_is_further_from_the_simulation_than_4x_its_rounding() -> None:
    # NSR(sim, device) 0.1 > 4 * NSR(FP32, sim) 0.01 + 1e-4
    assert verdict(20.0, 20.0, 10.0) == "departs"
    # 0.032 < 4 * 0.01 + 1e-4: two roundings of similar size
    assert verdict(20.0, 18.0, 15.0) == "quantization"
    assert verdict(60.0, 60.0, 55.0) == "ok"
    assert verdict(math.nan, 20.0, 10.0) == ""


def test_an_amplified_difference_is_not_a_new_departure() -> None:
    # the feeding site is 12 dB from the simulation (NSR 0.063): 0.1 < 4 * 0.063, nothing new here
    assert verdict(20.0, 15.0, 10.0, upstream_db=[12.0]) == "quantization"
    # unless the feeding site departs already: then this one reads a departure
    assert verdict(20.0, 15.0, 10.0, upstream_db=[12.0], upstream_departs=True) == "departs"
    # a jump far beyond what it reads is new
    assert verdict(20.0, 15.0, 0.0, upstream_db=[12.0]) == "departs"


def test_a_lost_live_channel_departs_whatever_the_pooled_figures() -> None:
    rng = np.random.default_rng(0)
    sim = rng.normal(size=(2, 8, 4, 4)).astype(np.float32)
    device = sim.copy()
    device[:, 5] = 0.0  # one of 8 channels: pooled NSR only 1/8
    pairs = SitePairs(channel_axis=1)
    pairs.update(sim, sim, device, "000")
    assert pairs.lost_channels() == 1
    assert verdict(20.0, 20.0, 9.0, pairs.lost_channels()) == "departs"
    quiet = SitePairs(channel_axis=1)
    quiet.update(sim, sim, sim * 0.9, "000")
    assert quiet.lost_channels() == 0
