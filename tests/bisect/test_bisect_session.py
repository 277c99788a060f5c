"""The bisection session file: round trip, refusals of corrupt, newer or foreign files."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import pytest
from bisect_helpers import SITES, additive, run

from quantscan.bisect import (
    Bisector,
    BisectSession,
    SessionFileError,
    Target,
    calibration_identity,
    describe,
    machine_for,
)
from quantscan.bisect.session import FORMAT


def make_session(events: Iterable[object] = ()) -> BisectSession:
    return BisectSession(
        model_path="/m/model.onnx",
        model_sha256="ab" * 32,
        calibration={"path": "/data", "files_sha256": "cd" * 32, "samples": 8},
        options={
            "target_metric": "cosine",
            "target_value": 0.99,
            "fallback": "float",
            "mode": "search",
            "scan": {},
        },
        sites=[{"node": n, "output": n + "_out", "order": i} for i, n in enumerate(SITES)],
        order=list(SITES),
        gain=[{"node": "s0", "gain_if_float": math.inf}],
        events=list(events),  # type: ignore[arg-type]
    )


def test_session_roundtrip_replays_to_the_same_state(tmp_path: Path) -> None:
    value = additive({"s2": 0.05, "s4": 0.05})
    machine = Bisector(SITES, Target("cosine", 0.99))
    run(machine, value)
    session = make_session(machine.events)
    path = tmp_path / "s.json"
    session.save(path)
    json.loads(path.read_text())  # standard JSON (inf stored as a string)
    loaded = BisectSession.load(path)
    again = machine_for(loaded)
    assert again.outcome == machine.outcome and again.next() is None
    shown = describe(loaded, again)
    assert shown["evaluations"] == len(machine.steps) and shown["outcome"]["status"] == "reached"
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temp file left behind


def test_corrupt_or_truncated_session_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    make_session().save(path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    before = path.read_bytes()
    with pytest.raises(SessionFileError, match="corrupt or truncated"):
        BisectSession.load(path)
    assert path.read_bytes() == before
    path.write_text("[1, 2]")
    with pytest.raises(SessionFileError, match="expected a bisect session"):
        BisectSession.load(path)
    with pytest.raises(SessionFileError, match="found nothing"):
        BisectSession.load(tmp_path / "missing.json")


def test_newer_format_and_foreign_identities_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    raw = make_session().to_json()
    raw["format"] = FORMAT + 1
    path.write_text(json.dumps(raw))
    with pytest.raises(SessionFileError, match="upgrade quantscan"):
        BisectSession.load(path)
    session = make_session()
    with pytest.raises(SessionFileError, match="sha256"):
        session.check_model("ef" * 32, "/other.onnx")
    with pytest.raises(SessionFileError, match="another set"):
        session.check_calibration({"path": "/other", "files_sha256": "00" * 32, "samples": 8})
    session.check_calibration({"path": "/moved", "files_sha256": "cd" * 32, "samples": 8})  # moved: fine


def test_calibration_identity_changes_with_the_file_list(tmp_path: Path) -> None:
    files = []
    for i in range(3):
        p = tmp_path / f"{i}.npy"
        p.write_bytes(b"x" * (i + 1))
        files.append(p)
    a = calibration_identity(tmp_path, files, 3)
    assert a == calibration_identity(tmp_path, files, 3)
    assert a["files_sha256"] != calibration_identity(tmp_path, files[:2], 2)["files_sha256"]
    files[0].write_bytes(b"longer")
    assert a["files_sha256"] != calibration_identity(tmp_path, files, 3)["files_sha256"]


def _saved(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    path = tmp_path / "s.json"
    machine = Bisector(SITES, Target("cosine", 0.99))
    run(machine, additive({"s2": 0.05}))
    make_session(machine.events).save(path)
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("edit, pattern", [
    (lambda raw: raw["model"].update(sha256="00" * 32), "was edited"),
    (lambda raw: raw["events"][0].update(value=0.5), "was edited"),
    (lambda raw: raw["options"].update(target_value=0.5), "was edited"),
    (lambda raw: raw.update(extra=1), "unknown extra"),
    (lambda raw: raw.pop("order"), "expected keys order"),
    (lambda raw: raw.pop("digest"), "expected keys digest"),
    (lambda raw: raw.update(sites="all"), "expected sites to be a list"),
    (lambda raw: raw.update(model=None), "expected model to be a dict"),
])
def test_edited_or_malformed_sessions_are_one_line_refusals(tmp_path: Path, edit: object, pattern: str) -> None:
    """Hand edits gave seven tracebacks and an edited sha256 was accepted: the digest covers everything."""
    path, raw = _saved(tmp_path)
    assert BisectSession.load(path).events  # the untouched file loads
    edit(raw)  # type: ignore[operator]
    path.write_text(json.dumps(raw))
    with pytest.raises(SessionFileError, match=pattern) as info:
        BisectSession.load(path)
    assert "\n" not in str(info.value)


def test_format_1_sessions_without_a_digest_still_load(tmp_path: Path) -> None:
    path, raw = _saved(tmp_path)
    raw.pop("digest")
    raw["format"] = 1
    path.write_text(json.dumps(raw))
    assert BisectSession.load(path).events


def test_a_session_the_machine_cannot_replay_is_one_line(tmp_path: Path) -> None:
    session = make_session()
    session.options["target_metric"] = "no-such-metric"
    session.order = ["s0", "s0"]
    with pytest.raises(SessionFileError):
        machine_for(session)
