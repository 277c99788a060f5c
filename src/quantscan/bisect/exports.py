"""Mixed-precision plans in the formats vendor toolchains read: bisect writes every one from here.

A toolchain's own plan files are written in its folder (`toolchains/<tool>/export.py`: the RKNN hybrid cfg
and the RKLLM build, Horizon's hb_mapper keys, the tpu-mlir qtable) and reached through
`toolchains.TOOLCHAINS` (`ToolchainFolder.exports`); here are the writers of formats with no folder there:
onnxruntime's `quantize_static` arguments (quantscan's own recipe) and TIDL's 16-bit lists, plus the chip
exports (chip_exports.py) and the weight models (weight_exports.py). Each writer takes the typed plan
(`records.Plan`, built by bisect/plan.py: `sites` with `node`, `nodes` (the kernel's ONNX node names in the
user's model), `output` (the tensor the kernel writes, named as in the user's model), `precision`
float|int16, `weights`, `int16_tensors`) and what `plans.ExportInputs` holds, and returns text or a dict.
Keys follow what each tool matches on: ONNX node names (onnxruntime, Horizon) or output tensor names
(RKNN, TPU-MLIR, TIDL rename or merge layers, so they address a layer by the tensor it produces).
A vendor SDK has the last word on what it accepts; the tests check each file against the format as
the document cited in the writer's docstring describes it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from quantscan.bisect import chip_exports as chips
from quantscan.bisect import weight_exports
from quantscan.errors import UsageError
from quantscan.plans import ExportInputs, ModelNodes, NodeInfo, PlanExport, float_nodes, unique
from quantscan.records import Plan, Precision
from quantscan.runfolder import atomic_write_text, json_text, save_model
from quantscan.scanning.ort_recipe import RECIPE, int16_activations
from quantscan.toolchains import TOOLCHAINS

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
    call.update(nodes_to_exclude=float_nodes(plan), extra_options=extra)
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
    outputs = unique(s.output for s in plan.sites)
    weighted = unique(s.output for s in plan.sites if s.weights)
    return {
        "advanced_options:output_feature_16bit_names_list": ",".join(outputs),
        "advanced_options:params_16bit_names_list": ",".join(weighted),
    }


def tidl_export(plan: Plan) -> dict[str, dict[str, str]]:
    """The file: `compile_options` to merge into the OSRT options as they are, and, kept apart
    because it changes the partitioning, the `deny_list:layer_name` that would run float sites on Arm."""
    return {
        "compile_options": tidl_options(plan),
        "optional_float_on_arm": {"deny_list:layer_name": ",".join(float_nodes(plan))},
    }


def tidl_import_config(plan: Plan) -> str:
    """The same lists as TIDL-RT import-config lines (`key = "value"`)."""
    opts = tidl_options(plan)
    return (
        f'outputFeature16bitNamesList = "{opts["advanced_options:output_feature_16bit_names_list"]}"\n'
        f'params16bitNamesList = "{opts["advanced_options:params_16bit_names_list"]}"\n'
    )


# --- writing -------------------------------------------------------------------------------------------


OWN_EXPORTS = (
    PlanExport("onnxruntime", "ort_quant_config.json", lambda p, _got: json_text(onnxruntime_config(p), indent=1),
               weight_bits=True),
    PlanExport("tidl", "tidl_16bit_options.json", lambda p, _got: json_text(tidl_export(p), indent=1)),
    PlanExport("tidl-rt", "tidl_import_16bit.txt", lambda p, _got: tidl_import_config(p)),
)
"""The plan files written here: onnxruntime's (quantscan's own recipe) and TIDL's, a tool with no folder in
toolchains/. A toolchain's own plan files live in its folder (`ToolchainFolder.exports`)."""


def _plan_exports() -> dict[str, PlanExport]:
    """Every plan export by name, in the order bisect has always written them: onnxruntime, the toolchains'
    default ones (registry order: rknn, horizon, tpu-mlir), TIDL's two; then the toolchains' others (rkllm)."""
    tools = [e for tool in TOOLCHAINS.values() for e in tool.exports]
    ordered = [OWN_EXPORTS[0], *(e for e in tools if e.default), *OWN_EXPORTS[1:], *(e for e in tools if not e.default)]
    return {e.name: e for e in ordered}


def _of_plan_alone(export: PlanExport) -> Callable[[Plan], str]:
    """The writer given only the plan (no model, no toolchain names)."""
    return lambda plan: export.write(plan, ExportInputs())


PLAN_EXPORTS = _plan_exports()
WRITERS: dict[str, tuple[str, Callable[[Plan], str]]] = {
    e.name: (e.file_name, _of_plan_alone(e)) for e in PLAN_EXPORTS.values() if e.default}
"""The exports every bisect writes: name -> (file name in the run folder, writer of the plan alone)."""

CHIP_WRITERS: dict[str, tuple[str, Callable[[Plan, ModelNodes | None], str]]] = {
    "hailo": ("hailo_model_script.alls", lambda p, m: chips.hailo_alls(p, m)),
    "pulsar2": ("pulsar2_layer_configs.json", lambda p, m: json_text(chips.pulsar2_layer_configs(p, m), indent=1)),
    "qnn": ("qnn_quant_overrides.json", lambda p, _m: json_text(chips.qnn_overrides(p), indent=1)),
    "amct": ("amct_quant.cfg", chips.amct_config),
    "atc": ("atc_keep_dtype.cfg", chips.atc_keep_dtype),
}
"""The chip exports (chip_exports.py): export name -> (file name, writer of the plan and the model's nodes).
Written when asked for (`--export`) or when bisect ran with their chip's profile (PROFILE_EXPORTS)."""

MODEL_WRITERS = weight_exports.MODEL_WRITERS
"""Exports that are models (weight_exports.py: `qdq-blocked`, `matmulnbits`): need the user's model."""

EXPORT_NAMES = (*WRITERS, *CHIP_WRITERS, *(n for n in PLAN_EXPORTS if n not in WRITERS), *MODEL_WRITERS)
WEIGHT_BIT_EXPORTS = (*(n for n, e in PLAN_EXPORTS.items() if e.weight_bits), *MODEL_WRITERS)
"""The exports that can say a site keeps 8-bit weights under a 4-bit scheme."""


def default_exports(profile: str | None) -> list[str]:
    """What bisect writes without --export: the long-standing six, plus the chip's own when its profile ran."""
    chip = [*chips.PROFILE_EXPORTS.get(profile or "", ())]
    return [*WRITERS, *chip, *(e.name for e in PLAN_EXPORTS.values() if profile and profile in e.profiles)]


def write_exports(
    plan: Plan, out: Path, names: Sequence[str] | None = None, graph: Mapping[str, NodeInfo] | None = None,
    vendor_names: Mapping[str, Mapping[str, Sequence[str]]] | None = None, model: onnx.ModelProto | None = None,
    hailo_hn: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write the chosen exports (default: `default_exports` of the plan's profile) into `out`, each
    atomically; returns name -> path.
    `graph` (the user's model: node -> op type, inputs, outputs) and `vendor_names` (export -> per site the
    names the toolchain that ran keeps: RKNN step 1's, tpu-mlir's top MLIR ops) let the RKNN cfg name what its
    step 2 takes, and the tpu-mlir qtable name ops as model_transform does (plans.ExportInputs);
    `model` (the user's) lets the chip exports name what their tools keep after fusion (chip_exports.py),
    `hailo_hn` (a parsed Hailo model's HN) the .alls Hailo's own layer names instead of predicted ones."""
    chosen = default_exports((plan.recipe or {}).get("profile")) if names is None else list(names)
    unknown = [n for n in chosen if n not in EXPORT_NAMES]
    if unknown:
        raise UsageError(f"--export: expected one of {', '.join(EXPORT_NAMES)}, found {', '.join(unknown)}")
    chosen = _exports_for_weight_bits(plan, chosen, explicit=names is not None)
    if graph is None and model is not None:
        graph = {n.name: (n.op_type, list(n.input), list(n.output)) for n in model.graph.node}
    nodes = ModelNodes.of(model) if model is not None else None
    written = {}
    for name in chosen:
        if name in MODEL_WRITERS:
            written[name] = _write_model_export(name, plan, out, model)
            continue
        if name in CHIP_WRITERS:
            file_name, chip_writer = CHIP_WRITERS[name]
            text = chips.hailo_alls(plan, nodes, hailo_hn) if name == "hailo" else chip_writer(plan, nodes)
        else:
            export = PLAN_EXPORTS[name]
            file_name = export.file_name
            text = export.write(plan, ExportInputs(graph, nodes, (vendor_names or {}).get(name)))
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
