"""The resumable session file of `quantscan bisect`: identities, options, ordering, gains and events.

Why event sourcing: the file stores the *events* (every finished evaluation and every manual mark),
not the machine's internals. Resuming rebuilds the machine (:func:`machine_for`) and replays the
events through it; the machine proposes the same candidates in the same order, so nothing finished
is run again, and a file whose events do not follow the search (edited, or other options) is
refused instead of silently producing another plan. Standard library only: `bisect --show` reads a
session without loading onnxruntime, onnx or pandas.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantscan.bisect.state import Bisector, Event, SessionFileError, Step, Target, event_from_dict
from quantscan.columns import Col
from quantscan.errors import FileError, UsageError
from quantscan.readers.jsonfile import read_json
from quantscan.runfolder import jsonable, write_json

FORMAT = 2
"""Session file format version; a newer one is refused, never guessed at. Format 2 adds `digest`."""
TOOL = "quantscan-bisect"
KNOWN_KEYS = frozenset({"format", "tool", "status", "created", "updated", "model", "calibration", "options",
                        "sites", Col.ORDER, "gain", "events", "spare", "digest"})
REQUIRED_KEYS = ("model", "calibration", "options", "sites", Col.ORDER)
SHAPES: dict[str, type] = {"model": dict, "calibration": dict, "options": dict, "sites": list, Col.ORDER: list,
                           "gain": list, "events": list, "spare": list, "status": str}


def content_digest(raw: Mapping[str, Any]) -> str:
    """sha256 over the whole session content (every key but `digest`, canonical JSON).

    Why the whole content: the model and data identities alone would let an edited event, option or
    ordering through, and resuming would then replay a search that never ran.
    """
    body = {k: v for k, v in raw.items() if k != "digest"}
    text = json.dumps(jsonable(body), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_schema(raw: Mapping[str, Any], path: Path, fmt: int) -> None:
    unknown = sorted(set(raw) - KNOWN_KEYS)
    if unknown:
        raise SessionFileError(f"session {path}: expected only quantscan's keys, found unknown {', '.join(unknown)}")
    missing = [k for k in (*REQUIRED_KEYS, *(("digest",) if fmt >= 2 else ())) if k not in raw]
    if missing:
        raise SessionFileError(f"session {path} is incomplete: expected keys {', '.join(missing)}, found none")
    wrong = [k for k, kind in SHAPES.items() if k in raw and not isinstance(raw[k], kind)]
    if wrong:
        raise SessionFileError(f"session {path} is damaged: expected {wrong[0]} to be a {SHAPES[wrong[0]].__name__}, "
                               f"found {type(raw[wrong[0]]).__name__}")
    if fmt >= 2 and raw.get("digest") != content_digest(raw):
        raise SessionFileError(f"session {path} was edited after quantscan wrote it (its digest does not match "
                               "its content); start a new session")


def _check_contents(raw: Mapping[str, Any], path: Path) -> None:
    """The values a resume reads, with the types it reads them as: a hand-edited session whose digest
    was recomputed passes the integrity check, and must still be one line, not a KeyError."""
    options, calib = raw.get("options"), raw.get("calibration")
    checks = [
        ("options.scan", isinstance(options, dict) and isinstance(options.get("scan"), dict)),
        ("options.target_metric", isinstance(options, dict) and isinstance(options.get("target_metric"), str)),
        ("options.target_value", isinstance(options, dict) and isinstance(options.get("target_value"), (int, float))
         and not isinstance(options.get("target_value"), bool)),
        ("options.fallback", isinstance(options, dict) and isinstance(options.get("fallback"), str)),
        ("options.output", isinstance(options, dict) and isinstance(options.get(Col.OUTPUT), (str, type(None)))),
        ("options.scan values", isinstance(options, dict) and _scan_options_typed(options.get("scan", {}))),
        ("options.rounding", isinstance(options, dict) and _rounding_typed(options.get("rounding"))),
        ("calibration.path", isinstance(calib, dict) and isinstance(calib.get("path"), str)),
        ("model", isinstance(raw.get("model"), dict) and isinstance(raw["model"].get("path"), str)
         and isinstance(raw["model"].get("sha256"), str)),
        ("sites", isinstance(raw.get("sites"), list) and all(
            isinstance(s, dict) and isinstance(s.get(Col.NODE), str) and isinstance(s.get(Col.ORDER), int)
            for s in raw["sites"])),
        (Col.ORDER, isinstance(raw.get(Col.ORDER), list) and all(isinstance(n, str) for n in raw[Col.ORDER])),
        ("gain", isinstance(raw.get("gain", []), list) and all(_gain_row(g) for g in raw.get("gain", []))),
        ("events", isinstance(raw.get("events", []), list) and all(isinstance(e, dict) for e in raw.get("events", []))),
        ("spare", isinstance(raw.get("spare", []), list) and all(
            isinstance(e, dict) and isinstance(e.get("sites"), list) and "value" in e for e in raw.get("spare", []))),
    ]
    wrong = [name for name, ok in checks if not ok]
    if wrong:
        raise SessionFileError(f"session {path} is damaged: expected {wrong[0]} of the type quantscan writes, "
                               "found another; start a new session")


ROUNDING_TYPES: dict[str, tuple[type, ...]] = {
    "realisations": (int,), "spread": (int, float), "seed": (int,), "z": (int, float), "holdout": (str,)}
"""options.rounding (bisect/robust.Rounding.as_dict): realisations and spread required, the rest optional."""


def _rounding_typed(rounding: Any) -> bool:
    """options.rounding as Rounding.from_dict reads it: absent/empty (a session from before issue 32) or
    an object with each value of its type (numbers not booleans)."""
    if not rounding:
        return True
    return (isinstance(rounding, dict) and all(k in rounding for k in ("realisations", "spread"))
            and all(isinstance(rounding[k], kinds) and not isinstance(rounding[k], bool)
                    for k, kinds in ROUNDING_TYPES.items() if k in rounding))


SCAN_OPTION_TYPES: dict[str, tuple[type, ...]] = {
    "calib_method": (str,), "activations": (str, type(None)), "input_shape": (dict,), "input_dims": (list,),
    "const": (dict,), "state": (dict, type(None)), "limit": (int, type(None)), "eval": (str, type(None)),
    Col.OUTPUT: (list,), "preprocess": (str, type(None)), "preprocess_overrides": (dict,),
    "threads": (int, type(None)), "seed": (int,), "batch_size": (int, type(None)), "task": (str,),
    "charset": (str, type(None)), "mask_threshold": (int, float), "max_memory": (str, int, type(None)),
    "profile": (str, type(None)), "weights": (str, type(None)), "group_size": (int, type(None)),
    "scheme": (str, type(None)),
}
"""The JSON types of the scan options a session records (bisect/request.py `scan_record`)."""


def _scan_options_typed(scan: object) -> bool:
    if not isinstance(scan, dict):
        return False
    typed = all(not isinstance(scan[k], bool) and isinstance(scan[k], kinds)
                for k, kinds in SCAN_OPTION_TYPES.items() if k in scan)  # first: a `true` list is not iterated
    return typed and all(isinstance(v, str) for k in (Col.OUTPUT, "input_dims") for v in scan.get(k) or [])


def _gain_row(row: object) -> bool:
    """A gain table row: its node, and numbers (non-finite ones written as "nan"/"inf" strings)."""
    if not isinstance(row, dict) or not isinstance(row.get(Col.NODE), str):
        return False
    for key, value in row.items():
        if key.startswith((Col.GAIN_IF_FLOAT, Col.LOSS_IF_ONLY, "if_float", "if_only")) and value is not None:
            try:
                float(value)
            except (TypeError, ValueError):
                return False
    return True


def calibration_identity(folder: str | Path, files: Sequence[str | Path], samples: int) -> dict[str, Any]:
    """The calibration set's identity: folder, and a hash of the file names and sizes in order.

    Names and sizes, not contents: hashing every image on each resume would cost as much as reading
    the set; a renamed, added, removed or rewritten-with-another-size file still changes the hash.
    """
    digest = hashlib.sha256()
    for f in files:
        p = Path(f)
        size = p.stat().st_size if p.exists() else -1
        digest.update(f"{p.name}\0{size}\n".encode())
    return {"path": str(Path(folder).resolve()), "files_sha256": digest.hexdigest(), "samples": int(samples)}


@dataclass
class BisectSession:
    """Everything a resume needs: identities, options, the site ordering, the output gains, the events."""

    model_path: str
    model_sha256: str
    calibration: dict[str, Any]
    options: dict[str, Any]
    sites: list[dict[str, Any]]
    order: list[str]
    gain: list[dict[str, Any]]
    events: list[Event] = field(default_factory=list)
    status: str = "running"
    spare: list[dict[str, Any]] = field(default_factory=list)
    """Sets measured ahead of the search (bisect/speculate.py) that it has not asked for yet: a resume
    feeds them to the machine when it does, instead of measuring them again. Written only when any."""
    format: int = FORMAT
    created: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "tool": TOOL,
            "status": self.status,
            "created": self.created,
            "updated": time.time(),
            "model": {"path": self.model_path, "sha256": self.model_sha256},
            "calibration": self.calibration,
            "options": self.options,
            "sites": self.sites,
            Col.ORDER: self.order,
            "gain": jsonable(self.gain),
            "events": [e.as_dict() for e in self.events],
            **({"spare": jsonable(self.spare)} if self.spare else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], path: Path) -> BisectSession:
        fmt = raw.get("format")
        if raw.get("tool") != TOOL or not isinstance(fmt, int):
            raise SessionFileError(f"expected a quantscan bisect session in {path}, found another JSON file")
        if fmt > FORMAT:
            raise SessionFileError(
                f"session {path} has format {fmt}, this quantscan reads format {FORMAT} and older: upgrade quantscan"
            )
        _check_schema(raw, path, fmt)
        _check_contents(raw, path)
        try:
            return cls(
                model_path=str(raw["model"]["path"]),
                model_sha256=str(raw["model"]["sha256"]),
                calibration=dict(raw["calibration"]),
                options=dict(raw["options"]),
                sites=list(raw["sites"]),
                order=list(raw[Col.ORDER]),
                gain=list(raw.get("gain", [])),
                events=[event_from_dict(e) for e in raw.get("events", [])],
                spare=[dict(e) for e in raw.get("spare", [])],
                status=str(raw.get("status", "running")),
                format=fmt,
                created=float(raw.get("created", 0.0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SessionFileError(f"session {path} is incomplete or damaged (bad field: {exc})") from None

    def save(self, path: str | Path) -> None:
        """Atomic: a temp file in the same folder, fsync'd, then os.replace (a kill leaves old or new)."""
        raw = jsonable(self.to_json())
        raw["format"] = FORMAT
        raw["digest"] = content_digest(raw)
        write_json(Path(path), raw, indent=1)

    @classmethod
    def load(cls, path: str | Path) -> BisectSession:
        """Read and validate; a corrupt or truncated file is refused and left as it is."""
        p = Path(path)
        if not p.is_file():
            raise SessionFileError(f"expected a bisect session file, found nothing at {p}")
        try:
            raw = read_json(p, "bisect session")
        except FileError as exc:
            raise SessionFileError(f"{exc}: the session is corrupt or truncated; it was left untouched") from None
        if not isinstance(raw, dict):
            raise SessionFileError(f"expected a bisect session object in {p}, found {type(raw).__name__}")
        return cls.from_json(raw, p)

    def check_model(self, sha256: str, path: str | Path) -> None:
        if sha256 != self.model_sha256:
            raise SessionFileError(
                f"session belongs to a model with sha256 {self.model_sha256[:12]}…, found {sha256[:12]}… in {path}"
            )

    def check_calibration(self, identity: Mapping[str, Any]) -> None:
        ours = (self.calibration.get("files_sha256"), self.calibration.get("samples"))
        theirs = (identity.get("files_sha256"), identity.get("samples"))
        if ours != theirs:
            raise SessionFileError(
                f"session was measured on calibration set {self.calibration.get('path')} "
                f"({self.calibration.get('samples')} samples), found another set at {identity.get('path')} "
                f"({identity.get('samples')} samples, different files)"
            )

    def steps(self) -> list[Step]:
        return [e for e in self.events if isinstance(e, Step)]


def machine_for(session: BisectSession) -> Bisector:
    """Rebuild the machine a session describes and replay its events (no evaluation is repeated).

    A session that passed its digest can still hold values the machine refuses (an older format, or
    one written by a buggy version): those are one `SessionFileError` line, never a traceback.
    """
    try:
        return _machine_for(session)
    except SessionFileError:
        raise
    except (UsageError, KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
        raise SessionFileError(f"session for {session.model_path} is damaged: {type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:200]}") from None


def _machine_for(session: BisectSession) -> Bisector:
    opts = session.options
    target = Target(str(opts["target_metric"]), float(opts["target_value"]), opts.get(Col.OUTPUT))
    topo = [s[Col.NODE] for s in sorted(session.sites, key=lambda s: int(s[Col.ORDER]))]
    machine = Bisector(
        session.order,
        target,
        topo=topo,
        mode=str(opts.get("mode", "search")),
        keep_float=opts.get("keep_float", ()),
        force_quant=opts.get("force_quant", ()),
        early_stop=bool(opts.get("early_stop", False)),  # a session from before the stop replays without it
    )
    machine.replay(session.events)
    return machine


def describe(session: BisectSession, machine: Bisector | None = None) -> dict[str, Any]:
    """Where a session stands, as data for `bisect --show` (the CLI formats it)."""
    machine = machine or machine_for(session)
    pending = machine.next()
    steps = session.steps()
    return {
        "model": session.model_path,
        "status": session.status,
        "target": machine.target.as_dict(),
        "mode": machine.mode,
        "sites": len(session.order),
        "evaluations": len(steps),
        "seconds": round(sum(s.seconds for s in steps), 3),
        "outcome": None
        if machine.outcome is None
        else {
            "status": machine.outcome.status,
            "sites": list(machine.outcome.sites),
            "value": machine.outcome.value,
            "first_bad": machine.outcome.first_bad,
        },
        "next": None if pending is None else {"phase": pending.phase, "sites": list(pending.sites)},
        "keep_float": sorted(machine.keep_float),
        "force_quant": sorted(machine.force_quant),
        "steps": [s.as_dict() for s in steps],
    }
