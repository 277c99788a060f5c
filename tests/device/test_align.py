"""Layouts a dump may hold a tensor in, checked against numpy's own transposes."""

from __future__ import annotations

import numpy as np

from quantscan.device.align import layouts, to_reference


def test_nchw_tensor_dumped_channels_last_comes_back() -> None:
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    nhwc = x.transpose(0, 2, 3, 1)
    assert layouts(nhwc.shape, x.shape) == ["nhwc"]
    np.testing.assert_array_equal(to_reference(nhwc, "nhwc", x.shape), x)


def test_size_one_dims_and_sizes() -> None:
    assert layouts((1, 4, 1, 1), (1, 4)) == ["same"]  # RKNN's [1,4,1,1] for a [1,4] output
    assert layouts((1, 7), (1, 8)) == []  # no layout holds 8 values in 7
    assert layouts((6, 2), (1, 3, 4)) == ["flat"]
    # C == H == W: both fit, the values decide (align._best_layout)
    assert layouts((1, 4, 4, 4), (1, 4, 4, 4)) == ["same", "nhwc"]
