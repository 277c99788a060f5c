"""compat.rewrite_plan: the rewrites a profile asks for come from the findings' typed `rewrite` field."""

from __future__ import annotations

import numpy as np
import onnx

from builders import build, rng_array
from quantscan.compat.rewrite_plan import REWRITE_ORDER, plan_for_profile, rewrites_for_profile, split_applicable
from quantscan.records import RewriteId


def conv_bn(batch: str = "1") -> onnx.ModelProto:
    return build(
        f"""<ir_version: 8, opset_import: ["" : 13]>
        g (float[{batch},3,8,8] x) => (float[{batch},4,8,8] y) {{
            c = Conv <pads=[1,1,1,1]> (x, W)
            y = BatchNormalization (c, g, be, mu, var)
        }}""",
        {
            "W": rng_array((4, 3, 3, 3)),
            "g": np.full(4, 1.5, np.float32),
            "be": np.zeros(4, np.float32),
            "mu": np.zeros(4, np.float32),
            "var": np.ones(4, np.float32),
        },
    )


def test_batchnorm_on_a_chip_that_folds_it_suggests_fold_bn() -> None:
    assert rewrites_for_profile(conv_bn(), "ethos-u") == [RewriteId.FOLD_BN]


def test_symbolic_batch_adds_fix_dim_settings_not_a_plain_rewrite() -> None:
    plan = plan_for_profile(conv_bn("N"), "ethos-u")
    assert plan.rewrites == [RewriteId.FOLD_BN]
    assert plan.fix_dims == ["batch=1"]


def test_order_is_total_over_the_registry() -> None:
    assert sorted(REWRITE_ORDER) == sorted(RewriteId)


def test_split_applicable_skips_passes_that_change_nothing() -> None:
    kept, skipped = split_applicable(conv_bn(), ["fold-bn", "fuse-hardswish", "fix-dim"])
    assert kept == ["fold-bn", "fix-dim"] and skipped == ["fuse-hardswish"]
