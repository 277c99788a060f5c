"""The plan file tpu-mlir reads: a quantize table for model_deploy (`TOOLCHAIN.exports`, written by bisect
through `toolchains.TOOLCHAINS`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from quantscan.plans import ExportInputs, PlanExport, unique
from quantscan.records import Plan, Precision


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
        lines += [f"{name} {mode}" for name in unique(names or [site.output])]
    return "\n".join(lines) + "\n"


def _qtable(plan: Plan, got: ExportInputs) -> str:
    """The qtable with the model's op names (as model_transform names them) and the toolchain's own, when known."""
    graph = got.graph
    return tpu_mlir_qtable(plan, node_outputs={k: list(v[2]) for k, v in graph.items()} if graph else None,
                           node_types={k: v[0] for k, v in graph.items()} if graph else None, op_names=got.tool_names)


EXPORTS = (PlanExport("tpu-mlir", "tpu_mlir.qtable", _qtable, weight_bits=True),)
