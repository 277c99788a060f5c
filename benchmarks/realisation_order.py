"""Which rounding realisation fails a bisect's failing candidates, and how many sweeps each order would take.

Why (issue 41 part 8): the search's judge stops a failing candidate at the first realisation that puts its
lower bound under the target (bisect/realise.py `stop_early`), so the order the realisations are measured in
(robust.judging_order) decides how many sweeps a failing candidate costs, never its verdict. This judges a
sample of a finished session's failing candidates (every `--every`-th) under every realisation, prints each
one's per-realisation bound (pooled cosine - 1 jackknife s.e.), how often each realisation is the strictest,
and the sweeps every order of the realisations would take on the sample (the fewest possible: one each), with
all-int8's bounds for comparison (an order learned from them would sort the realisations by all-int8's bound).

Run: OMP_NUM_THREADS=1 nice python benchmarks/realisation_order.py --session S/session.json \
         --model ppocrv4_rec --limit 16 --every 7
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[2] / "shared" / "assets"


def sweeps(order: Sequence[int], bounds: Sequence[Sequence[float]], target: float) -> int:
    """Realisations measured before each candidate's bound falls under `target`, in `order`, summed."""
    return sum(next(k for k in range(1, len(order) + 1) if min(b[i] for i in order[:k]) < target) for b in bounds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--session", type=Path, required=True, help="a finished default bisect's session.json")
    p.add_argument("--model", default="ppocrv4_rec", help="an asset name")
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--every", type=int, default=7)
    args = p.parse_args()

    from quantscan.bisect.realise import RealisedEvaluator, split_context
    from quantscan.bisect.robust import Rounding, pooled_cosine, pooled_stderr
    from quantscan.bisect.state import Target
    from quantscan.scanning.gain import mixed_builder
    from quantscan.scanning.options import ScanOptions
    from quantscan.scanning.prepare import prepare_scan

    session = json.loads(args.session.read_text())
    target = float(session["options"]["target_value"])
    ctx = prepare_scan(ASSETS / "models" / f"{args.model}.onnx", ASSETS / "calib" / args.model,
                       opts=ScanOptions(limit=args.limit))
    rounding = Rounding()
    builder = mixed_builder(ctx, "float")
    full = RealisedEvaluator(split_context(ctx, rounding, False).search, builder, Target("cosine", target), rounding,
                             "cached_reference")

    def bounds(sites: Sequence[str]) -> list[float]:
        judged = full.judge(builder.precisions(sites))
        return [pooled_cosine(m.sums[m.output]) - pooled_stderr(m.sums[m.output]) for m in judged.realisations]

    steps = [e for e in session["events"] if e.get("kind") == "eval"][2:]
    sample = [bounds(e["sites"]) for e in [e for e in steps if not e["passed"]][:: args.every]]
    print("all-int8 bounds:", [round(b, 5) for b in bounds(())])
    strictest = Counter(min(range(len(b)), key=b.__getitem__) for b in sample)
    print("strictest realisation (count):", sorted(strictest.items()))
    print(f"{len(sample)} failing candidates; sweeps per order (fewest possible {len(sample)}):")
    for order in itertools.permutations(range(rounding.realisations)):
        print(" ", order, sweeps(order, sample, target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
