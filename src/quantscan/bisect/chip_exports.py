"""Plan exports for the chips of issue 44: Hailo (model script), Axera Pulsar2 (`layer_configs`), Qualcomm
QNN through onnxruntime (tensor quant overrides), Huawei Ascend / HiSilicon SVP (AMCT skip list, ATC
keep_dtype list).

Why separate writers and not one "names" list: each tool addresses a layer differently, and a name it
does not keep is at best ignored, at worst an abort. Hailo renames every layer (`conv3`, `dw2`, `fc1`:
its parser numbers layers per kind, fusing BatchNormalization and the activation into the conv);
Pulsar2 matches ONNX node names after its own float-graph optimisation (a folded BatchNormalization is
gone) or, more robustly, a subgraph between two tensor names; onnxruntime keeps tensor names as they
are; ATC and AMCT take the original model's op names but fold BatchNormalization into the conv before
they look. So every writer here names the kernel the way its tool keeps it, and says in a comment (where
the format has comments) which plan site each line stands for.

The vendor tools do not run here (closed SDKs, except onnxruntime, which the tests run). Each writer's
docstring cites the document or example the format was taken from; tests/fixtures/chip_exports holds
the vendor examples the tests check the files against.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantscan.errors import UsageError
from quantscan.plans import ModelNodes, unique
from quantscan.readers.jsonfile import MAX_JSON_BYTES, parse_json, read_json
from quantscan.records import Plan, Precision

# --- Hailo Dataflow Compiler ---------------------------------------------------------------------------

HAILO_PRECISION = "a16_w16"
"""Hailo's highest precision (16-bit activations and weights); it has no float on the accelerator."""

_HAILO_KIND = {
    "Gemm": "fc", "Add": "ew_add", "Sub": "ew_sub", "Mul": "ew_mult", "MaxPool": "maxpool",
    "AveragePool": "avgpool", "GlobalAveragePool": "avgpool", "Concat": "concat", "Resize": "resize",
    "Softmax": "softmax", "MatMul": "matmul",
}
"""ONNX op -> the Hailo layer kind its parser makes (DFC user guide, "Supported Layers"; names as they
appear in hailo_model_zoo's model scripts: conv54, dw16, fc1, ew_add1, avgpool1). Unverified for kinds
the zoo's scripts do not show (ew_sub, matmul, resize, softmax)."""
_HAILO_FUSED = frozenset({"BatchNormalization", "Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSwish",
                          "HardSigmoid", "Clip", "Elu", "Tanh", "Mish", "Silu", "Swish"})
"""Ops the parser folds into the conv/fc before them (BatchNormalization; activations are a conv's
`activation` attribute in the HN)."""


def hailo_layer_names(model: ModelNodes) -> dict[str, str]:
    """Node -> predicted Hailo layer name: conv/dw/fc/... numbered per kind in graph order from 1, an op
    fused into the weighted layer before it (BN, activation) named as that layer. A prediction: Hailo's
    parser may split or merge layers (a conv followed by an add can become one `conv` layer); the parsed
    model's HN (`original_names` of each layer) is the authority, see `hailo_names_from_hn`."""
    counts: dict[str, int] = {}
    names: dict[str, str] = {}
    producer = {o: n for n, (_, _, outs) in model.nodes.items() for o in outs}
    for node, (op, inputs, _) in model.nodes.items():
        kind = "dw" if node in model.depthwise else "conv" if op in ("Conv", "ConvTranspose") else _HAILO_KIND.get(op)
        if op == "MatMul" and any(i in model.constants for i in inputs):
            kind = "fc"
        if kind in ("ew_add", "ew_sub", "ew_mult") and any(i in model.constants for i in inputs):
            kind = None  # a constant add/mul is folded into a neighbour's bias/scale, no layer of its own
        if kind is None:
            source = producer.get(inputs[0]) if inputs else None
            if op in _HAILO_FUSED and source in names:
                names[node] = names[source]
            continue
        counts[kind] = counts.get(kind, 0) + 1
        names[node] = f"{kind}{counts[kind]}"
    return names


def hailo_names_from_hn(hn: Mapping[str, Any]) -> dict[str, list[str]]:
    """ONNX node -> the HN layers that hold it, from a parsed model's HN dict (`ClientRunner.get_hn_dict()`,
    or the .hn JSON inside a .har): each layer lists the framework nodes it came from in `original_names`.
    The network prefix (`net/conv3`) is dropped: model scripts take bare layer names (hailo_model_zoo)."""
    out: dict[str, list[str]] = {}
    for layer, body in (hn.get("layers") or {}).items():
        for original in (body or {}).get("original_names", []) or []:
            out.setdefault(str(original), []).append(str(layer).split("/")[-1])
    return out


def read_hn(path: str | Path) -> dict[str, Any]:
    """A parsed Hailo model's HN: the .hn JSON itself, or the one inside a .har (a tar archive)."""
    source = Path(path)
    try:
        if tarfile.is_tarfile(source):
            with tarfile.open(source) as har:
                member = next((m for m in har.getmembers() if m.name.endswith(".hn")), None)
                handle = har.extractfile(member) if member is not None else None
                if handle is None:
                    raise UsageError(f"--hailo-hn: expected a .hn member in the archive {source}, found none")
                if member is not None and member.size > MAX_JSON_BYTES:
                    raise UsageError(f"--hailo-hn: expected an HN of at most {MAX_JSON_BYTES} bytes, found "
                                     f"{member.size} in {source}")
                raw = parse_json(handle.read())
        else:
            raw = read_json(source, "--hailo-hn")
    except (OSError, ValueError, tarfile.TarError) as exc:
        raise UsageError(f"--hailo-hn: expected a Hailo .hn (JSON) or .har, found {source} unreadable ({exc})") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("layers"), dict):
        raise UsageError(f"--hailo-hn: expected an HN with a `layers` object, found none in {source}")
    return raw


def hailo_alls(plan: Plan, model: ModelNodes | None = None, hn: Mapping[str, Any] | None = None) -> str:
    """Model script lines (`.alls`) that give the plan's sites Hailo's 16-bit precision.

    Format: Hailo Dataflow Compiler user guide (v3.x, "Model Scripts" / `quantization_param`), as used by
    hailo_model_zoo (hailo_model_zoo/cfg/alls/generic/*.alls at c83fc030, e.g.
    paddle_ocr_v5_mobile_recognition.alls: `quantization_param([conv1, conv2], precision_mode=a16_w16)`;
    `#` starts a comment line). precision_mode is one of a8_w8, a8_w4, a16_w8, a16_w16 (the zoo's
    scripts); Hailo runs nothing in float on the device, so float sites and int16 sites both become
    a16_w16, said per site. Layer names are Hailo's: from the parsed model's HN when given (`hn`, exact),
    else predicted from the ONNX graph (`hailo_layer_names`, marked as predicted). A site with no
    Hailo layer (its ops fold into a neighbour) is a comment.
    """
    lines = [
        "# quantscan plan: add to the model script (the model script option of `hailo optimize`, "
        "or ClientRunner.load_model_script)",
        f"# model sha256 {plan.model_sha256}",
    ]
    by_hn = hailo_names_from_hn(hn) if hn is not None else None
    predicted = hailo_layer_names(model) if model is not None and by_hn is None else {}
    if by_hn is None:
        lines.append("# layer names PREDICTED from the ONNX graph (unverified): check them against the parsed "
                     "model's HN (each layer's original_names), or give it: "
                     "bisect --from-plan plan.json --hailo-hn FILE")
    layers: list[str] = []
    for site in plan.sites:
        names = (unique(n for node in site.node_names for n in by_hn.get(node, [])) if by_hn is not None
                 else unique(predicted.get(node, "") for node in site.node_names))
        why = "Hailo has no float: 16-bit" if site.precision == Precision.FLOAT else "16-bit"
        if not names:
            lines.append(f"# {site.node} ({site.kernel or site.op_type}, {site.precision}): no Hailo layer of its "
                         "own; it stays at the default precision")
            continue
        lines.append(f"# {site.node} ({site.kernel or site.op_type}, {site.precision}; {why}): {', '.join(names)}")
        layers += names
    for name in unique(layers):
        lines.append(f"quantization_param({name}, precision_mode={HAILO_PRECISION})")
    return "\n".join(lines) + "\n"


# --- Axera Pulsar2 -------------------------------------------------------------------------------------

PULSAR2_FP32_OPS = frozenset({"LeakyRelu", "Sigmoid", "Relu", "Add", "Mul", "Div", "Sub", "Concat", "Softmax"})
"""Ops Pulsar2 has verified in FP32 (pulsar2-docs, advanced_build_guides.md "混合精度量化详解" at b32f7c1,
docs V5.1); Conv does not take data_type FP32."""


def pulsar2_layer_configs(plan: Plan, model: ModelNodes | None = None) -> dict[str, Any]:
    """`quant.layer_configs` of a `pulsar2 build --config` file, one entry per site.

    Format: pulsar2-docs (AXERA-TECH/pulsar2-docs at b32f7c1, V5.1), user_guides_config/config.md
    (`message LayerConfig`: layer_name, layer_names, op_type(s), start_tensor_names, end_tensor_names,
    data_type U8|S8|U16|S16|FP32, weight_data_type, output_data_type) and advanced_build_guides.md (mixed
    precision: a subgraph between `start_tensor_names` and `end_tensor_names`, tensor names, not node names).
    A site is addressed as the subgraph from the tensors its kernel reads to the tensor it writes: those
    tensors survive Pulsar2's float-graph optimisation (which folds BatchNormalization into the Conv and
    drops its name), node names inside a kernel may not. Float sites take FP32 only where every op of the
    kernel is in PULSAR2_FP32_OPS, else U16 (Pulsar2's highest integer type); int16 sites take U16.
    Without the model the kernel's node names are used (`layer_names`, BatchNormalization left out).
    The file is strict JSON holding only BuildConfig keys (`{"quant": {"layer_configs": [...]}}`): merge it
    into your config; Pulsar2 prints the `Layer Config Table` it applied.
    """
    entries: list[dict[str, Any]] = []
    for site in plan.sites:
        ops = [model.nodes[n][0] for n in model.kernel(site)] if model is not None else [site.op_type]
        fp32 = site.precision == Precision.FLOAT and bool(ops) and all(op in PULSAR2_FP32_OPS for op in ops)
        data_type = "FP32" if fp32 else "U16"
        inputs = model.kernel_inputs(site) if model is not None else []
        if inputs:
            entries.append({"start_tensor_names": inputs, "end_tensor_names": [site.output], "data_type": data_type})
        else:
            names = [n for n in site.node_names if not (model and model.nodes.get(n, ("",))[0] == "BatchNormalization")]
            entries.append({"layer_names": names, "data_type": data_type})
    return {"quant": {"layer_configs": entries}}


# --- Qualcomm QNN (onnxruntime QNN EP) -----------------------------------------------------------------


def qnn_overrides(plan: Plan) -> dict[str, Any]:
    """Arguments for onnxruntime's `get_qnn_qdq_config` (QNN EP / AI Hub), the plan as tensor overrides.

    Format: onnxruntime.quantization.execution_providers.qnn.get_qnn_qdq_config (onnxruntime 1.17+;
    checked against 1.32.0): `init_overrides` maps a tensor name to a list of dicts with `quant_type`
    (a QuantType name; JSON has no enums: map with `QuantType[name]`); with `add_qtype_converts` (its
    default) onnxruntime adds the `convert` entries around a 16-bit tensor itself. QNN HTP's 16-bit mode
    is W8A16 (16-bit activations, 8-bit weights), so an int16 site's output (and the int16 tensors the
    plan measured between int16 sites) become QUInt16 and its weights stay QUInt8; a float site has no
    QDQ form on HTP and is written as 16-bit too (said in `note`), its nodes also listed in `float_nodes`
    for a CPU-fallback build (`nodes_to_exclude`). Tensor names are the ONNX model's own: onnxruntime
    keeps them. tests/bisect/test_chip_exports.py runs quantize() with this config on a real model.
    """
    overrides: dict[str, list[dict[str, Any]]] = {}
    for site in plan.sites:
        for tensor in (site.output, *site.int16_tensors):
            overrides[tensor] = [{"quant_type": "QUInt16"}]
    float_nodes = unique(n for s in plan.sites_at(Precision.FLOAT) for n in s.node_names)
    return {
        "get_qnn_qdq_config": {
            "activation_type": "QUInt8",
            "weight_type": "QUInt8",
            "init_overrides": overrides,
            "add_qtype_converts": True,
        },
        "float_nodes": float_nodes,
        "note": ("get_qnn_qdq_config(model, reader, **get_qnn_qdq_config) then quantize(model, out, config); "
                 "QuantType values by name. Float sites are written as QUInt16 activations (HTP runs no float "
                 "in a QDQ model); pass float_nodes as nodes_to_exclude instead to run them on the CPU"),
    }


# --- Huawei Ascend (CANN ATC / AMCT) and HiSilicon SVP -------------------------------------------------

AMCT_QUANTIZED = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "AveragePool"})
"""ONNX ops AMCT quantizes (AMCT ONNX user guide, "supported layers"; AveragePool unverified): the only
names `skip_layers` can usefully list."""


def amct_config(plan: Plan, model: ModelNodes | None = None) -> str:
    """AMCT's simplified post-training quantization config (the int8 step before ATC), skip list only.

    Format: CANN AMCT ONNX, "Simplified PTQ Configuration File" (calibration_config_onnx.proto, protobuf
    text format; hiascend.com canncommercial 8.0.0/8.5.0 atlasamct_16_0163): `skip_layers` is a repeated
    string of layer (ONNX node) names left unquantized; `#` comments are text-format comments. Ascend
    has no int16 activations in AMCT's PTQ: int16 sites are skipped too (they run float16 after ATC),
    said per site. Only quantizable nodes are named (AMCT_QUANTIZED; a BatchNormalization is fused into
    its Conv and has no layer). HiSilicon SVP (Hi3519DV500 class) uses the same AMCT family: unverified.
    """
    lines = [
        "# quantscan plan: AMCT simplified PTQ config (amct_onnx.create_quant_config(config_defination=this file))",
        f"# model sha256 {plan.model_sha256}",
    ]
    for site in plan.sites:
        names = [n for n in site.node_names if model is None or model.nodes.get(n, ("",))[0] in AMCT_QUANTIZED]
        why = "int16 (no int16 in AMCT PTQ: left float16)" if site.precision == Precision.INT16 else "float"
        lines.append(f"# {site.node} ({site.kernel or site.op_type}): {why}"
                     + ("" if names else "; nothing AMCT quantizes"))
        lines += [f'skip_layers: {json.dumps(n)}' for n in names]
    return "\n".join(lines) + "\n"


def atc_keep_dtype(plan: Plan, model: ModelNodes | None = None) -> str:
    """ATC's `--keep_dtype` file: one original-model op name per line, kept at the model's float32 when
    `--precision_mode` (force_fp16 by default for inference) would lower it.

    Format: CANN ATC parameter reference, "--keep_dtype" (hiascend.com atlasatcparam_16_0074, CANN 8.x;
    6.0.1 atctool_0095): a file listing op names (`Opname`, original model names) or `OpType::Type`, one
    per line. Only the float sites (an int16 site's concern is AMCT's quantization, not float16), without
    a BatchNormalization folded into its Conv (no op of its own after ATC's fusion). No comment lines: the
    document shows none in the file itself. `--modify_mixlist` is not written: it lists op *types*
    (black/white/gray lists), so it would change every layer of a type, not a plan's sites.
    """
    names = [n for s in plan.sites_at(Precision.FLOAT) for n in s.node_names
             if model is None or model.nodes.get(n, ("",))[0] not in ("BatchNormalization", "")]
    return "".join(f"{n}\n" for n in unique(names))


PROFILE_EXPORTS: dict[str, tuple[str, ...]] = {
    "hailo8": ("hailo",),
    "ax650": ("pulsar2",),
    "qnn-htp": ("qnn",),
    "ascend310": ("amct", "atc"),
    "hisilicon-svp": ("amct", "atc"),
}
"""A chip profile -> the exports its toolchain reads, written beside the default ones when bisect ran
with that `--profile`."""
