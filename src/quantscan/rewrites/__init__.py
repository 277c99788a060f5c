"""Graph rewrite passes, one rule per module.

Each pass is a pure function `ModelProto -> RewriteResult` (see `base`): it copies the model, edits the
copy, and reports changes and refusals. `quantscan.rewrite` chains them and proves the result
numerically; `quantscan.graph` reuses `fold_batchnorm` to prepare scan graphs.
"""

from quantscan.rewrites.base import Change, Refusal, RewriteResult
from quantscan.rewrites.fold_bn import fold_batchnorm

__all__ = ["Change", "Refusal", "RewriteResult", "fold_batchnorm"]
