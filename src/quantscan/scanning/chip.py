"""What a chip profile decides for a scan (`ChipRecipe`): its activation scheme, fusions, CPU and float16
nodes, consumer-range ops and recipe, from the profile and its compat check, beside the user's options.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.model import LoadedModel
from quantscan.records import ActivationScheme
from quantscan.scanning.options import ChipRecipe, ScanOptions
from quantscan.scanning.ort_recipe import RECIPE
from quantscan.schemes import Scheme, resolve_scheme
from quantscan.specs import Dim


def activations_source(explicit: bool, profile: str | None, scheme: str | None = None) -> str:
    """Why the activation scheme is what it is, as run.json and summary.md say it: an explicit
    option wins over `--scheme`, that over the profile, the profile over the uint8 default."""
    if explicit:
        return "from --activations"
    if scheme:
        return f"from --scheme {scheme}"
    return f"from profile {profile}" if profile else "default"


def _scheme(opts: ScanOptions, profile: Any | None) -> Scheme:
    """The scheme the scan simulates (quantscan.schemes.resolve_scheme): flags over `--scheme` over the
    profile's default; exit 2 for one the profile's chip does not run, or for `--calib-advice` on a
    weight-only scheme (no activation ranges to advise on)."""
    chip = None if profile is None else profile.chip_schemes()
    scheme = resolve_scheme(
        scheme=opts.scheme, weights=opts.weights, group_size=opts.group_size,
        activations=None if opts.activations is None else str(opts.activations),
        profile_activations=None if profile is None else profile.activations, chip=chip,
        profile=None if profile is None else profile.name,
    )
    if opts.calib_advice and scheme.weight_only:
        raise UsageError(f"--calib-advice: expected quantized activations (uint8, int8 or int16), found scheme "
                         f"{scheme.name()} with float activations")
    return scheme


def recipe_runs(scheme: Scheme) -> bool:
    """The schemes the onnxruntime recipe can read from quantize_static's own model: int8 per-channel
    symmetric weights with 8-bit or int16 activations (QInt16, symmetric). Not int4 in groups: onnxruntime
    1.32's quantize_static writes no blocked DequantizeLinear (only MatMulNBitsQuantizer does, weight-only
    and for MatMul alone), and its per-channel QInt4 is not the chips' grouped scheme; not weight-only or a
    weight zero point either (quantize_static quantizes every activation it places, weights symmetric)."""
    return scheme.weights == "int8" and scheme.group_size is None and not scheme.weight_zero_point \
        and scheme.activations != "float"


def chip_recipe(
    loaded: LoadedModel, opts: ScanOptions, dims: Mapping[str, tuple[Dim, ...]]
) -> tuple[Any, ChipRecipe]:
    """The profile's decisions (and its compat check), or the defaults without one; `opts` is left as
    the user gave it. An explicit `--activations` (or `--scheme`) wins over the profile's scheme."""
    explicit = opts.activations is not None
    if opts.profile is None:
        scheme = _scheme(opts, None)
        return None, ChipRecipe(
            activations=ActivationScheme(scheme.activations),
            activations_source=activations_source(explicit, None, opts.scheme),
            fused_activations=opts.fused_activations,
            scheme=scheme,
        )
    from quantscan.compat import load_profile
    from quantscan.compat.check import check

    profile = load_profile(opts.profile)
    scheme = _scheme(opts, profile)
    if profile.recipe == RECIPE and not recipe_runs(scheme):
        raise UsageError(f"--scheme: expected w8a8 or w8a16 under profile {profile.name} (its sites are read "
                         f"from onnxruntime's quantize_static, which writes no grouped int4, zero-point or "
                         f"weight-only QDQ), found {scheme.name()}; scan without --profile to simulate it")
    shapes = {k: [d if isinstance(d, int) else 1 for d in v] for k, v in dims.items()}
    compat = check(loaded.proto, [opts.profile], input_shapes=shapes)
    placement = compat.node_placement.get(profile.name, {})
    return compat, ChipRecipe(
        profile=profile.name,
        activations=ActivationScheme(scheme.activations),
        activations_source=activations_source(explicit, profile.name, opts.scheme),
        fused_activations=frozenset(profile.fused_activations),
        cpu_nodes=frozenset(n for n, where in placement.items() if where == "cpu"),
        float16_nodes=float16_nodes(compat.findings, profile.name),
        consumer_range_ops=profile.consumer_range_ops,
        output_grid_ops=profile.output_grid_ops,
        input_follows_readers=profile.input_follows_readers,
        depthwise_hardswish_point=profile.depthwise_hardswish_point,
        recipe=profile.recipe,
        per_channel_weights=profile.per_channel_weights,
        scheme=scheme,
    )


def float16_nodes(findings: pd.DataFrame | None, profile: str) -> frozenset[str]:
    """The nodes `check`'s float16 rule names for `profile`: the toolkit runs them in float16 between
    int8 layers (rknn-toolkit2's Softmax), so simulating their output on the int8 grid (a 0..1 Softmax
    in 1/255 steps) would charge the model a loss the chip does not have. float16's own rounding
    (<= 2^-11 relative, 1-cos ~1e-7 on a Softmax output) is left out: they are kept float32."""
    if findings is None or findings.empty:
        return frozenset()
    rows = findings[(findings["rule"] == "float16") & (findings["profile"] == profile)]
    return frozenset(str(n) for n in rows[Col.NODE] if n)
