"""A plan grown to close the int8 islands that cost it converters (`bisect --objective latency`).

A float site in an int8 chain pays a converter on each side; two float sites with one int8 site between
them pay four, where keeping that one site float too would pay two and one more kernel at the fallback.
On a chain of cheap kernels (ppocr_mobile_v2_cls at fp16 on rk3588: 41 converters were 1.44 of the plan's
1.74 ms) closing such islands is cheaper than the plan. `close_islands` grows a plan greedily: each step
adds the int8 island (a connected group of int8 kernel sites, bounded by float ones or the model's ends)
whose move lowers the estimated time most, until no move does. A superset of the plan's float sites, so
it keeps what the plan keeps; whether it still meets the target is for the held-out judgment to say.

Pure pricing over the Pricer's kernel graph: no onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence


def int8_islands(neighbours: Mapping[str, set[str]], float_sites: Iterable[str], allowed: Iterable[str]
                 ) -> list[tuple[str, ...]]:
    """The connected groups of `allowed` kernel sites not in `float_sites`, in the neighbour graph."""
    floats = set(float_sites)
    free = [s for s in allowed if s in neighbours and s not in floats]
    left, groups = set(free), []
    for start in free:
        if start not in left:
            continue
        group, stack = [], [start]
        left.discard(start)
        while stack:
            node = stack.pop()
            group.append(node)
            for other in neighbours[node]:
                if other in left:
                    left.discard(other)
                    stack.append(other)
        groups.append(tuple(sorted(group)))
    return groups


def close_islands(extra_ms: Callable[[Sequence[str]], float], neighbours: Mapping[str, set[str]],
                  float_sites: Sequence[str], allowed: Sequence[str]) -> tuple[str, ...]:
    """`float_sites` grown by the int8 islands whose addition lowers `extra_ms` (module docstring); the
    plan itself when no island does."""
    grown = set(float_sites)
    current = extra_ms(sorted(grown))
    while True:
        moves = [(extra_ms(sorted(grown | set(group))), group) for group in int8_islands(neighbours, grown, allowed)]
        best = min(moves, default=None, key=lambda m: (m[0], len(m[1])))
        if best is None or best[0] >= current - 1e-9:
            return tuple(sorted(grown))
        current = best[0]
        grown |= set(best[1])
