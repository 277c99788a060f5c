"""Graph layer: one index to read a graph (`index`), helpers to edit one (`edit`, `fold`), and the QDQ
building blocks the scan uses (`qdq`: fake-quant insertion, analysis model and isolated twins;
`reduce`: in-graph reductions). The package exports the QDQ-building API, so callers write
`from quantscan import graph as qgraph` and `qgraph.build_qdq_model(...)`.
"""

from quantscan.graph.qdq import (
    ACT_ONLY,
    CUMULATIVE_SUFFIX,
    F32_SUFFIX,
    WEIGHT_ONLY,
    BiasQuant,
    QuantPlan,
    QuantSite,
    WeightQuant,
    activation_codes,
    activation_qdq_names,
    bias_dq,
    build_analysis_model,
    build_qdq_model,
    expose,
    input_alias,
    iso_name,
    isolated_twin,
    qdq_nodes,
    topological_sort,
    weight_dq,
    weight_dq_output,
)
from quantscan.graph.reduce import ChannelSums, PairSums, Reducer

__all__ = [
    "ACT_ONLY",
    "CUMULATIVE_SUFFIX",
    "F32_SUFFIX",
    "WEIGHT_ONLY",
    "BiasQuant",
    "ChannelSums",
    "PairSums",
    "QuantPlan",
    "QuantSite",
    "Reducer",
    "WeightQuant",
    "activation_codes",
    "activation_qdq_names",
    "bias_dq",
    "build_analysis_model",
    "build_qdq_model",
    "expose",
    "input_alias",
    "iso_name",
    "isolated_twin",
    "qdq_nodes",
    "topological_sort",
    "weight_dq",
    "weight_dq_output",
]
