"""Kernel patterns: one file per multi-node spelling of a kernel a chip runs as one op.

Each module matches one kernel (`silu`, `hardswish`, `layernorm`, `layernorm_moments` (jax2tf's
E[x²] − E[x]² spelling), `gelu`, `softmax`) and answers with a typed match (the nodes, the input
`x`, the output tensor and the pattern's parameters) or a `NoMatch` that
says why it does not apply. `fused_activation` decides which activation a producer's kernel absorbs.
The site grouping (`quantscan.sites`), the rewrite passes (`quantscan.rewrites`) and the compatibility
rules (`quantscan.compat.rules`) all ask these modules, so a spelling is recognised in one place.
"""
