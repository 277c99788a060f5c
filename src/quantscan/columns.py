"""The column names of layers.csv, spelled once.

Every module that writes or reads a layers.csv column (the scan's tables, the gain ranking, the
diagnosis, the report, bisect's gain table, extract, overlay) names it through `Col`, so renaming a
column or grepping for its readers is one place. The same field in another file (plan.json's `node`,
tensors.csv's `cumulative_cosine`) uses the same spelling. Each column's meaning and which direction
is better: docs/scan.md, docs/columns.md and CONTRACT.md.

A namespace of plain strings, not an Enum: pandas labels, CSV headers, f-strings and JSON must all
see the bare name (a `str`-mixin Enum formats as `Col.NODE` in f-strings before Python 3.12).
"""

from __future__ import annotations

from typing import Final


class Col:
    """layers.csv columns (and the same fields elsewhere)."""

    # the site
    NODE: Final = "node"
    OP_TYPE: Final = "op_type"
    KERNEL: Final = "kernel"
    ORDER: Final = "order"
    OUTPUT: Final = "output"
    INPUTS: Final = "inputs"
    # isolated: this site alone quantized, fed FP32 inputs
    ISOLATED_COSINE: Final = "isolated_cosine"
    ISOLATED_SQNR_DB: Final = "isolated_sqnr_db"
    ISOLATED_MAX_ABS: Final = "isolated_max_abs"
    # the isolated error split: only the site's weights quantized / only its activations (Horizon's accuracy
    # debug tool and AIMET's QuantAnalyzer report the same split)
    ISOLATED_WEIGHT_ONLY_COSINE: Final = "isolated_weight_only_cosine"
    ISOLATED_WEIGHT_ONLY_SQNR_DB: Final = "isolated_weight_only_sqnr_db"
    ISOLATED_ACT_ONLY_COSINE: Final = "isolated_act_only_cosine"
    ISOLATED_ACT_ONLY_SQNR_DB: Final = "isolated_act_only_sqnr_db"
    # cumulative: every site quantized
    CUMULATIVE_COSINE: Final = "cumulative_cosine"
    CUMULATIVE_SQNR_DB: Final = "cumulative_sqnr_db"
    CUMULATIVE_MSE: Final = "cumulative_mse"
    CUMULATIVE_MAX_ABS: Final = "cumulative_max_abs"
    CUMULATIVE_WORST_SAMPLE_COSINE: Final = "cumulative_worst_sample_cosine"
    CUMULATIVE_INPUT_SQNR_DB: Final = "cumulative_input_sqnr_db"
    EVAL_CLIP_FRACTION: Final = "eval_clip_fraction"
    # per channel, activation and weight
    ACT_WORST_CHANNEL_SQNR_DB: Final = "act_worst_channel_sqnr_db"
    ACT_CHANNEL_RANGE_SPREAD: Final = "act_channel_range_spread"
    ACT_DEAD_CHANNELS: Final = "act_dead_channels"
    WEIGHT_SQNR_DB: Final = "weight_sqnr_db"
    WEIGHT_WORST_CHANNEL_SQNR_DB: Final = "weight_worst_channel_sqnr_db"
    WEIGHT_CHANNEL_RANGE_SPREAD: Final = "weight_channel_range_spread"
    SENSITIVE_OP: Final = "sensitive_op"
    ACT_SCALE: Final = "act_scale"
    ACT_ZERO_POINT: Final = "act_zero_point"
    # cause, diagnosis, rank
    CAUSE: Final = "cause"
    REASON: Final = "reason"
    DIAGNOSIS: Final = "diagnosis"
    DIAGNOSIS_CAUSE: Final = "diagnosis_cause"
    DIAGNOSIS_FIX: Final = "diagnosis_fix"
    DIAGNOSIS_TIER: Final = "diagnosis_tier"
    RANK: Final = "rank"
    # a chip profile
    PLACEMENT: Final = "placement"
    COMPAT_RULE: Final = "compat_rule"
    COMPAT_FIX: Final = "compat_fix"
    COMPAT_SEVERITY: Final = "compat_severity"
    # output gain (scan ranking and bisect)
    GAIN_IF_FLOAT: Final = "gain_if_float"
    GAIN_IF_FLOAT_STDERR: Final = "gain_if_float_stderr"
    """Jackknife standard error of `gain_if_float` over the gain samples (scanning.impact)."""
    GAIN_IF_FLOAT_GAP_STDERR: Final = "gain_if_float_gap_stderr"
    """Standard error of (rank 1's gain − this site's gain), paired on the same samples."""
    GAIN_IF_FLOAT_WHOLE_SET: Final = "gain_if_float_whole_set"
    """Rank 1's gain re-measured on every evaluation sample (scanning.impact writes it)."""
    GAIN_IF_FLOAT_COSINE: Final = "gain_if_float_cosine"
    GAIN_IF_FLOAT_COSINE_STDERR: Final = "gain_if_float_cosine_stderr"
    """Jackknife standard error of the cosine gain in bisect's gain table (scanning.gain).

    Why: the gain is a difference of pooled cosines on a few samples, and keeping one site float re-rounds
    every quantizer after it, so part of a small gain is chance (benchmarks/RESULTS.md, gain_noise: null
    branches that change nothing but one float32 rounding step move the output cosine by up to 0.007).
    Leave-one-out replicates see both: on the assets, a null branch's gain is mostly within 1 standard
    error of zero (at most 2.4 of them; benchmarks/RESULTS.md, "Standard errors of the gain")."""
    GAIN_IF_FLOAT_SQNR_DB: Final = "gain_if_float_sqnr_db"
    GAIN_IF_FLOAT_TOP1: Final = "gain_if_float_top1"
    IF_FLOAT_COSINE: Final = "if_float_cosine"
    IF_FLOAT_SQNR_DB: Final = "if_float_sqnr_db"
    IF_FLOAT_TOP1: Final = "if_float_top1"
    REACHES_OUTPUT: Final = "reaches_output"
    LOSS_IF_ONLY: Final = "loss_if_only"
    EST_MS: Final = "est_ms"
    """Estimated board time of the site's kernel at int8 (quantscan.cost, the profile's [cost] table)."""
    FALLBACK_EXTRA_MS: Final = "fallback_extra_ms"
    """What keeping this one site at the profile's fallback precision adds over all-int8, conversions included."""


LAYERS_COLUMNS: Final = tuple(v for k, v in vars(Col).items() if k.isupper())
"""Every name above, for the layout test that holds each to one spelling."""
