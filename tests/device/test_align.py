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
    # C == H == W: every axis order fits, each listed once, the values decide (align._best_layout)
    cube = layouts((1, 4, 4, 4), (1, 4, 4, 4))
    assert cube[:2] == ["same", "nhwc"] and len(set(cube)) == len(cube) == 6


def test_a_transposed_copy_is_undone() -> None:
    """RKNN's `_tp` copies of a [1, T, C] tensor are [1, C, 1, T]."""
    x = np.arange(40 * 36, dtype=np.float32).reshape(1, 40, 36)
    dumped = x[0].T.reshape(1, 36, 1, 40)
    assert layouts(dumped.shape, x.shape) == ["perm1,0"]
    np.testing.assert_array_equal(to_reference(dumped, "perm1,0", x.shape), x)


def test_a_head_split_qkv_dump_is_put_back_in_the_onnx_order() -> None:
    """RKNN dumps a QKV projection [1, T, 3·H·D] as [1, 3·H·D, 1, T] with the channels in (H, D, 3)
    order: no order of the dump's dims undoes that, the head split does (numpy written out as oracle)."""
    from quantscan.device.align import head_split

    rng = np.random.default_rng(0)
    t, h, d = 40, 8, 15
    ref = rng.normal(size=(1, t, 3 * h * d)).astype(np.float32)
    channels_hdq = ref.reshape(t, 3, h, d).transpose(0, 2, 3, 1).reshape(t, 3 * h * d)
    dump = channels_hdq.T.reshape(1, 3 * h * d, 1, t)
    found = head_split(dump, ref)
    assert found is not None and found[1] > 0.999999
    assert np.array_equal(to_reference(dump, found[0], ref.shape), ref)


def test_values_in_an_order_no_head_split_explains_stay_unaligned() -> None:
    from quantscan.device.align import head_split

    rng = np.random.default_rng(1)
    ref = rng.normal(size=(1, 40, 360)).astype(np.float32)
    shuffled = rng.permutation(ref.ravel()).reshape(1, 360, 1, 40)
    assert head_split(shuffled, ref) is None
