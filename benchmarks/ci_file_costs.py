"""The suite's cost per test file, and how two xdist workers share it in either hand-out order.

Input: the JSON lines `pytest --record-costs PREFIX` writes (tests/conftest.py: each test's CPU seconds,
this process and its waited children, so a loaded shared machine does not distort the figures), or the text
a `pytest --durations=N` run printed (wall seconds of the N slowest phases; files outside them count 0).
Output: a table of the costliest files, and the two workers' simulated finish under xdist's own loadfile
order (files by test count, most first) and under tests/conftest.py's order (costliest first). With
`--write`, tests/file_costs.json, the table conftest's scheduler reads.

    python -m pytest -q --record-costs /tmp/costs
    python benchmarks/ci_file_costs.py '/tmp/costs.*.jsonl' --write
    python benchmarks/ci_file_costs.py ci.log      # a `pytest --durations=60` log

The simulation hands the next file to whichever worker is free first; xdist hands it over when a worker has
two tests left, so real runs overlap a little more than this. CPU seconds stand in for wall seconds: with
two workers on two cores a file's wall time is its CPU time when nothing else runs.
"""

from __future__ import annotations

import argparse
import glob
import heapq
import json
import re
from collections import defaultdict
from pathlib import Path

from _common import markdown_table

COSTS_FILE = Path(__file__).resolve().parents[1] / "tests" / "file_costs.json"
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S+)")
"""One line of pytest's "slowest durations" list: `325.79s call     tests/x.py::test_y[z]`."""


def read_costs(pattern: str) -> tuple[dict[str, float], dict[str, int]]:
    """Seconds and test count per file, summed over the workers' JSON lines or a --durations list."""
    seconds: dict[str, float] = defaultdict(float)
    tests: dict[str, set[str]] = defaultdict(set)
    for path in sorted(glob.glob(pattern)):
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if path.endswith(".jsonl"):
                record = json.loads(line)
                test, spent = record["test"], float(record["cpu_s"])
            elif match := DURATION.match(line):
                test, spent = match[2], float(match[1])
            else:
                continue
            name = test.split("::")[0]
            seconds[name] += spent
            tests[name].add(test)
    return dict(seconds), {name: len(ids) for name, ids in tests.items()}


def finish_times(order: list[str], seconds: dict[str, float], workers: int) -> list[float]:
    """Each worker's finish when the files are handed out in `order` to whichever is free first."""
    free = [(0.0, w) for w in range(workers)]
    for name in order:
        at, worker = heapq.heappop(free)
        heapq.heappush(free, (at + seconds[name], worker))
    return sorted(at for at, _ in free)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pattern", help="glob of the --record-costs JSON lines, e.g. '/tmp/costs.*.jsonl'")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--top", type=int, default=25, help="files listed")
    parser.add_argument("--write", action="store_true", help=f"write {COSTS_FILE.name}")
    args = parser.parse_args()
    seconds, tests = read_costs(args.pattern)
    unit = "CPU s" if args.pattern.endswith(".jsonl") else "wall s"
    total = sum(seconds.values())
    print(f"{sum(tests.values())} tests in {len(seconds)} files, {total:.0f} {unit}\n")
    rows = [[name, f"{s:.1f}", str(tests[name]), f"{100 * s / total:.1f}%"]
            for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:args.top]]
    print(markdown_table(["file", unit, "tests", "share"], rows) + "\n")
    by_count = sorted(seconds, key=lambda name: -tests[name])  # xdist's loadscope reorder (a stable sort)
    by_cost = sorted(seconds, key=lambda name: -seconds[name])
    rows = []
    for label, order in (("xdist (test count)", by_count), ("costliest first", by_cost)):
        ends = finish_times(order, seconds, args.workers)
        rows.append([label, " / ".join(f"{e:.0f}" for e in ends), f"{ends[-1]:.0f}",
                     f"{ends[-1] / (total / args.workers):.3f}"])
    print(markdown_table(["order", "workers end s", "suite s", "suite / even share"], rows))
    if args.write:
        table = {name: round(s, 1) for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])}
        how = (f"{unit} per file, benchmarks/ci_file_costs.py from " +
               ("`pytest --record-costs`" if unit == "CPU s" else "a `pytest --durations` list (its files only)"))
        COSTS_FILE.write_text(json.dumps({"how": how, "seconds": table}, indent=1) + "\n")
        print(f"\nwrote {COSTS_FILE}")


if __name__ == "__main__":
    main()
