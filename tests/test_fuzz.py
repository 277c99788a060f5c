"""A few hundred seeded mutants of the op fixtures and a small asset model through `check` and `scan --limit 1`.

The contract under abuse: exit in {0, 1, 2}, exactly one stderr line on exit 2, no traceback, no
crash or hang, the mutant file unchanged. A failure message lists the seed and mutations, so
`python benchmarks/fuzz.py --first-seed SEED -n 1` reproduces it. The worker process (tests/mutants.py)
keeps a segfault in onnx or onnxruntime from taking pytest down and counts it as a failure.
benchmarks/fuzz.py runs thousands with the same mutator and prints the issue's table.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from conftest import REPO
from mutants import COMMANDS, Driver, Tally, fuzz, mutate, seeds

N_MUTANTS = 150


def test_mutations_are_reproducible_from_the_seed() -> None:
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 4] x) => (float[1, 4] y) {
      a = Relu (x)
      y = Softmax <axis = 1> (a)
    }
    """).SerializeToString()
    assert mutate(model, 7) == mutate(model, 7)
    assert len({mutate(model, s)[0] for s in range(20)}) > 5


@pytest.mark.real
def test_fuzzed_models_keep_the_exit_code_contract(assets: Path, tmp_path: Path) -> None:
    pool = seeds(assets, tmp_path, ["mtcnn_pnet"])
    driver = Driver(REPO / "src", tmp_path, timeout=120)
    tally, bad = Tally(), []
    try:
        for outcome in fuzz(pool, N_MUTANTS, driver, tmp_path, first_seed=100_000):
            tally.add(outcome)
            if (outcome.exit not in (0, 1, 2) or outcome.traceback or outcome.multi_line_2 or outcome.modified
                    or outcome.crashed or outcome.timed_out):
                last = (outcome.stderr.strip().splitlines() or ["<no stderr>"])[-1][:300]
                bad.append(f"{outcome.command} seed {outcome.seed} {outcome.mutations}: exit {outcome.exit}: {last}")
    finally:
        driver.close()
    assert not bad, "\n".join([tally.table(), *bad])
    assert sum(c["runs"] for c in tally.rows.values()) == 2 * N_MUTANTS


N_EVERY_COMMAND = 14


@pytest.mark.real
def test_fuzzed_models_through_every_command(assets: Path, tmp_path: Path) -> None:
    """Issue 42: the mutations added since (negative declared dims with a lowered opset, non-UTF-8 graph names
    and doc strings) through every command that reads a model; a SIGABRT in onnx's C++ is a crash here."""
    pool = seeds(assets, tmp_path, ["mtcnn_pnet"])
    driver = Driver(REPO / "src", tmp_path, timeout=180)
    tally, bad = Tally(), []
    try:
        for outcome in fuzz(pool, N_EVERY_COMMAND, driver, tmp_path, first_seed=420_000, commands=COMMANDS,
                            every_kind=True):
            tally.add(outcome)
            if (outcome.exit not in (0, 1, 2) or outcome.traceback or outcome.multi_line_2 or outcome.modified
                    or outcome.crashed or outcome.timed_out):
                last = (outcome.stderr.strip().splitlines() or ["<no stderr>"])[-1][:300]
                bad.append(f"{outcome.command} seed {outcome.seed} {outcome.mutations}: exit {outcome.exit}: {last}")
    finally:
        driver.close()
    assert not bad, "\n".join([tally.table(), *bad])
    assert sum(c["runs"] for c in tally.rows.values()) == len(COMMANDS) * N_EVERY_COMMAND
