"""Seeded mutants of the non-model inputs (session, run folder, case library, preprocess.json, vendor
logs, .npz headers) and of output paths, through the commands that read or write them.

The contract under abuse, as tests/test_fuzz.py holds models to it: exit in {0, 1, 2}, one stderr line
on exit 2, no traceback, no crash or hang, and no file that existed before the run changed unless it
was quantscan's to change (tests/file_mutants.py `Case.overwrites`). A failure lists the kind, seed and
mutation; `python benchmarks/fuzz.py --inputs files --first-seed SEED -n 1 --kinds KIND` reproduces it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from conftest import REPO
from file_mutants import KINDS, build_base, fuzz_files, mutate_json
from mutants import Driver, Tally

N_MUTANTS = 4 * len(KINDS)


def test_json_mutations_are_reproducible_from_the_seed() -> None:
    text = json.dumps({"a": [1, {"b": "c"}], "d": 2.5})
    assert mutate_json(text, random.Random(5)) == mutate_json(text, random.Random(5))
    assert len({mutate_json(text, random.Random(s))[0] for s in range(30)}) > 8


def test_fuzzed_inputs_keep_the_exit_code_contract(tmp_path: Path) -> None:
    base = build_base(tmp_path / "base", REPO / "src", REPO)
    runs = tmp_path / "runs"
    runs.mkdir()
    driver = Driver(REPO / "src", tmp_path, timeout=120)
    tally, bad = Tally(), []
    try:
        for case, outcome in fuzz_files(base, N_MUTANTS, driver, runs, first_seed=200_000):
            tally.add(outcome)
            if (outcome.exit not in (0, 1, 2) or outcome.traceback or outcome.multi_line_2 or outcome.modified
                    or outcome.crashed or outcome.timed_out):
                last = (outcome.stderr.strip().splitlines() or ["<no stderr>"])[-1][:300]
                bad.append(f"{case.kind} seed {case.seed} {case.what} {case.argv[0]}: exit {outcome.exit}: {last}")
    finally:
        driver.close()
    assert not bad, "\n".join([tally.table(), *bad])
    assert sum(c["runs"] for c in tally.rows.values()) == N_MUTANTS
