"""Issue 42's CI fuzz: a few hundred seeded mutants of dump folders, vendor driver results and bisect
sessions, read through the same functions the commands use (no CLI start-up per mutant, so it runs in
seconds). The contract at this level: a damaged file is a QuantscanError (the CLI's one line, exit 2)
or is read; any other exception is a bug. tests/test_fuzz_files.py runs the same generators through the
CLI (kinds dumps, vendor, plan), and `python benchmarks/fuzz.py --inputs files --kinds dumps,vendor,plan,
session -n 3000` runs thousands.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from file_mutants import mutate_json
from quantscan.device.dumps import open_dumps
from quantscan.errors import QuantscanError
from reader_mutants import ReaderBase, build_reader_base, damage_dumps, damage_payload

N_EACH = 120
SEED = 300_000


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> ReaderBase:
    return build_reader_base(tmp_path_factory.mktemp("readers"))


def _read_dumps(folder: Path, fmt: str) -> None:
    dumps = open_dumps(folder, fmt)
    for i in range(len(dumps.keys)):
        dumps.load(i)
    if dumps.order is not None:
        dumps.order()


def _read_payload(folder: Path, tool: str) -> None:
    from quantscan.toolchains import driverfiles
    from quantscan.toolchains.rknn.run import vendor_layers as rknn_layers
    from quantscan.toolchains.tpumlir.run import vendor_layers as tpu_layers

    result = driverfiles.read_result(folder / "result.json", folder / "x.log")
    driverfiles.read_simulated(folder / "sim_outputs.npz")
    if tool == "rknn":
        rknn_layers(folder, list(result.get("analysis", [])))
    else:
        tpu_layers(folder)


def _failures(make, read, n: int, first_seed: int, work: Path) -> tuple[list[str], int]:
    """Run `n` mutants; (what broke the contract, how many were refused as bad input)."""
    bad, refused = [], 0
    for seed in range(first_seed, first_seed + n):
        folder = work / f"m{seed}"
        label, what = make(folder, random.Random(seed))
        try:
            read(folder, label)
        except QuantscanError as exc:
            refused += 1
            assert "\n" not in str(exc), (seed, what, str(exc))
        except Exception as exc:  # noqa: BLE001 - anything else is what the fuzz is looking for
            bad.append(f"seed {seed} {what}: {type(exc).__name__}: {exc}"[:300])
        shutil.rmtree(folder, ignore_errors=True)
    return bad, refused


def test_mutated_dump_folders_are_read_or_refused(base: ReaderBase, tmp_path: Path) -> None:
    bad, refused = _failures(lambda f, rng: damage_dumps(base, f, rng), _read_dumps, N_EACH, SEED, tmp_path)
    assert not bad, "\n".join(bad)
    assert refused > N_EACH // 2  # the generator damages: most mutants must be refused, not silently read


def test_mutated_vendor_results_are_read_or_refused(base: ReaderBase, tmp_path: Path) -> None:
    bad, refused = _failures(lambda f, rng: damage_payload(base, f, rng, mutate_json), _read_payload, N_EACH,
                             SEED + N_EACH, tmp_path)
    assert not bad, "\n".join(bad)
    assert refused > N_EACH // 4


def _session_text() -> str:
    """A session as bisect writes it (format 2, digest over the content) for the tiny Conv model."""
    from quantscan.bisect.session import FORMAT, TOOL, content_digest

    raw = {"tool": TOOL, "format": FORMAT, "model": {"path": "m.onnx", "sha256": "0" * 64},
           "calibration": {"path": "calib", "files_sha256": "1" * 64, "samples": 4},
           "options": {"scan": {"calib_method": "minmax", "seed": 0, "output": ["y"], "input_dims": []},
                       "target_metric": "cosine",
                       "target_value": 0.999, "fallback": "float", "output": None,
                       "rounding": {"realisations": 1, "spread": 0.0, "seed": 0, "z": 1.64, "holdout": "none"}},
           "sites": [{"node": "conv", "order": 0}], "order": ["conv"], "gain": [], "events": [], "spare": [],
           "status": "running", "created": 0.0}
    raw["digest"] = content_digest(raw)
    return json.dumps(raw)


def test_mutated_sessions_are_loaded_or_refused(tmp_path: Path) -> None:
    from quantscan.bisect.session import BisectSession, content_digest

    text = _session_text()
    BisectSession.load(_write(tmp_path / "valid.json", text))  # the base itself loads

    def make(folder: Path, rng: random.Random) -> tuple[str, str]:
        mutated, what = mutate_json(text, rng)
        if rng.random() < 0.5:  # past the digest: wrong types must be caught by the schema, not the digest
            try:
                raw = json.loads(mutated)
                raw["digest"] = content_digest(raw)
                mutated, what = json.dumps(raw), what + "+digest"
            except (ValueError, TypeError, AttributeError, RecursionError, KeyError):
                pass
        folder.mkdir()
        _write(folder / "session.json", mutated)
        return "session", what

    bad, _ = _failures(make, lambda f, _l: BisectSession.load(f / "session.json"), N_EACH, SEED + 2 * N_EACH,
                       tmp_path)
    assert not bad, "\n".join(bad)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
