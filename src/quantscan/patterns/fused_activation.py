"""The activation a chip runs inside its producer's kernel: a listed op, or a SiLU / HardSwish pattern.

`fused` is a chip profile's list of fusable activations (op types, plus `SiLU`/`Swish` and `HardSwish`
for their decomposed spellings). The activation must be the only reader of the producer's output, and a
pattern must keep its intermediates to itself; otherwise the producer's output is materialised and
quantized, and the activation is a kernel of its own.
"""

from __future__ import annotations

from quantscan.graph.index import GraphIndex
from quantscan.patterns import hardswish, silu
from quantscan.patterns.base import Match, NoMatch

KERNEL = "FusedActivation"


def _listed(kernel: str, fused: frozenset[str]) -> bool:
    return kernel in fused or (kernel == silu.KERNEL and "Swish" in fused)


def match(index: GraphIndex, x: str, fused: frozenset[str]) -> Match | NoMatch:
    """The activation fused into the kernel whose output is `x`."""
    if x in index.graph_outputs:
        return NoMatch(f"{x!r} is a graph output: it is materialised")
    users = {id(n) for n in index.users(x)}
    for pattern in (silu, hardswish):
        if not _listed(pattern.KERNEL, fused):
            continue
        found = decomposed(pattern.KERNEL, index, x)
        if isinstance(found, Match) and users <= {id(n) for n in found.nodes}:
            return found
    single = index.single_user(x)
    if single is not None and single.op_type in fused:
        return Match(single.op_type, x, (single,), single.output[0])
    return NoMatch(f"no activation the profile fuses is the only reader of {x!r}")


def decomposed(kernel: str, index: GraphIndex, x: str) -> Match | NoMatch:
    """The private multi-node `kernel` (SiLU, or HardSwish in its Add/Clip/Mul/Div or x·HardSigmoid(x)
    spelling) computed from `x`.

    x·HardSigmoid(x; 1/6, 1/2) is HardSwish by what it computes: a chip runs it as one HardSwish kernel,
    so it is one site, not a HardSigmoid site and a Mul site with a quantization point between them.
    """
    found: Match | NoMatch
    if kernel == silu.KERNEL:
        found = silu.match_from(index, x)
    else:
        hs = hardswish.match_from(index, x)
        spelled_out = isinstance(hs, hardswish.HardSwishMatch) and hs.spelling in hardswish.DECOMPOSED
        found = hs if spelled_out else NoMatch(f"no decomposed HardSwish reads {x!r}")
    if isinstance(found, Match) and found.shared(index):
        return NoMatch(f"{kernel} intermediates {found.shared(index)} are read elsewhere")
    return found
