"""The plan keys Horizon's hb_mapper reads (`TOOLCHAIN.exports`, written by bisect through
`toolchains.TOOLCHAINS`)."""

from __future__ import annotations

import json

from quantscan.plans import PlanExport, float_nodes
from quantscan.records import Plan, Precision


def horizon_yaml(plan: Plan) -> str:
    """`model_parameters` keys for Horizon's `hb_mapper makertbin` YAML (OpenExplorer).

    Format: Horizon OpenExplorer toolchain user guide, "hb_mapper makertbin" configuration file,
    `model_parameters` (XJ3/J5 OpenExplorer v1.x–v2.x): `run_on_cpu` is a ';'-separated list of ONNX
    node names forced to the CPU (float); `node_info` maps a node name to `{'ON': 'BPU'|'CPU',
    'InputType': 'int16', 'OutputType': 'int16'}` (newer releases; int16 on the BPU). Keys are node
    names of the user's ONNX model. Both are written; keep the one your release documents.
    """
    floats = float_nodes(plan)
    node_info: dict[str, dict[str, str]] = {n: {"ON": "CPU"} for n in floats}
    for site in plan.sites_at(Precision.INT16):
        for n in site.node_names:
            node_info[n] = {"ON": "BPU", "InputType": "int16", "OutputType": "int16"}
    lines = [
        "# quantscan plan: merge into model_parameters of the hb_mapper makertbin YAML",
        "model_parameters:",
    ]
    if floats:
        lines.append(f"  run_on_cpu: {json.dumps(';'.join(floats))}")
    lines.append(f"  node_info: {json.dumps(node_info)}")
    return "\n".join(lines) + "\n"


EXPORTS = (PlanExport("horizon", "horizon_node_config.yaml", lambda plan, _got: horizon_yaml(plan)),)
