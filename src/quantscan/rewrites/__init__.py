"""Graph rewrite passes, one rule per module, plus the pipeline that applies and proves them.

Each pass is a pure function `ModelProto -> RewriteResult` (see `base`): it copies the model, edits the
copy, and reports changes and refusals. `rewrites.pipeline` chains them and proves the result
numerically; `compat.rewrite_plan` says which ones a chip profile's findings ask for;
`scanning.analysis_copy` reuses `cleanup` and `fold_batchnorm` to prepare scan graphs. `pipeline` is not
imported here: it pulls in onnxruntime, which the passes do not need.
"""

from quantscan.rewrites.base import Change, Refusal, RewriteResult
from quantscan.rewrites.clamp_mask import clamp_mask
from quantscan.rewrites.cleanup import cleanup
from quantscan.rewrites.decompose_hardsigmoid import decompose_hardsigmoid
from quantscan.rewrites.decompose_hardswish import decompose_hardswish
from quantscan.rewrites.decompose_layernorm import decompose_layernorm
from quantscan.rewrites.div_to_mul import div_to_mul
from quantscan.rewrites.fix_ceil_mode import fix_ceil_mode
from quantscan.rewrites.fix_dim import DimSetting, fix_dim, parse_dim_spec
from quantscan.rewrites.fold_bn import fold_batchnorm
from quantscan.rewrites.fuse_hardswish import fuse_hardswish
from quantscan.rewrites.fuse_layernorm import fuse_layernorm
from quantscan.rewrites.fuse_softmax import fuse_softmax
from quantscan.rewrites.gelu_tanh import gelu_tanh
from quantscan.rewrites.global_pool import rewrite_global_pools

__all__ = [
    "Change",
    "DimSetting",
    "Refusal",
    "RewriteResult",
    "clamp_mask",
    "cleanup",
    "decompose_hardsigmoid",
    "decompose_hardswish",
    "decompose_layernorm",
    "div_to_mul",
    "fix_ceil_mode",
    "fix_dim",
    "fold_batchnorm",
    "fuse_hardswish",
    "fuse_layernorm",
    "fuse_softmax",
    "gelu_tanh",
    "parse_dim_spec",
    "rewrite_global_pools",
]
