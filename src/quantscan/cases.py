"""The case library: what was changed on a model and why, kept as plain files and reused on the next one.

Why: the same conversion problem comes back on the next model of a family (a MaxPool with ceil_mode on
an RK chip, HardSwish spelt with Div on a Horizon chip). A case records, from a run folder, the model
signature, the chip profile, the check findings the rewrites made go away (the *pattern*), the recipe
(the rewrites, in order) with their proofs, the bisection plan and the run's metrics. `match_cases`
finds the cases whose pattern a new model's findings contain ("seen in case X"); `recipe` gives what
`rewrite --case X` replays, with a fresh proof on the new model.

Layout: one folder per case, `<library>/<id>/case.json` plus copies of the proofs
(`<id>/proofs/*.rewrite.json`); plain JSON, reviewable, fit for a team folder kept in git. Paths inside
are file names only. The library is `--cases DIR`, else `$QUANTSCAN_CASES`, else `~/.quantscan/cases`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import pandas as pd

from quantscan.columns import Col
from quantscan.errors import FileError, ModelError, UsageError
from quantscan.readers.jsonfile import field, json_kind, read_json, read_json_object
from quantscan.runfolder import atomic_write_text, json_text, read_plan, read_run_json, read_table

CASES_ENV = "QUANTSCAN_CASES"
CASE_FILE = "case.json"
PATTERN_KEYS = ("profile", Col.OP_TYPE, "rule", "attribute")
"""A finding's pattern: which profile, on which op, which rule, about which attribute (not the node)."""


def cases_dir(given: str | Path | None = None) -> Path:
    """`--cases DIR`, else $QUANTSCAN_CASES, else ~/.quantscan/cases (per user)."""
    if given is not None:
        return Path(given)
    env = os.environ.get(CASES_ENV)
    return Path(env) if env else Path.home() / ".quantscan" / "cases"


def patterns(findings: pd.DataFrame) -> set[tuple[str, str, str, str]]:
    """The distinct patterns of a compat.csv table (severity info left out: notes are not problems)."""
    if findings is None or findings.empty:
        return set()
    rows = findings[findings["severity"] != "info"] if "severity" in findings.columns else findings
    found: set[tuple[str, str, str, str]] = set()
    for r in rows.to_dict("records"):
        profile, op_type, rule, attribute = (_text(r.get(k)) for k in PATTERN_KEYS)
        found.add((profile, op_type, rule, attribute))
    return found


def _text(value: Any) -> str:
    """A table cell as text: missing or NaN is ''."""
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


@dataclass(frozen=True)
class CaseMatch:
    """A library case whose pattern the new model's findings contain."""

    case_id: str
    note: str
    pattern: list[dict[str, str]]
    recipe: list[str]
    proof: str

    def line(self) -> str:
        what = "; ".join(f"{p[Col.OP_TYPE]} {p['rule']}" + (f" ({p['attribute']})" if p["attribute"] else "")
                         for p in self.pattern)
        return (f"seen in case {self.case_id}: {what} on {self.pattern[0]['profile']} -> "
                f"{' + '.join(self.recipe) or 'no rewrite'} ({self.proof}); {self.note}")


# --- saving -----------------------------------------------------------------------------------------------


def _model_signature(path: Path | None, sha256: str) -> dict[str, Any]:
    info: dict[str, Any] = {"name": path.name if path is not None else "", "sha256": sha256}
    if path is not None and path.is_file():
        proto = _load(path)
        ops: dict[str, int] = {}
        for node in proto.graph.node:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        info["ops"] = dict(sorted(ops.items()))
        info["opset"] = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    return info


def _check(model: Path | onnx.ModelProto, profile: str) -> pd.DataFrame:
    from quantscan.compat.check import check

    proto = model if isinstance(model, onnx.ModelProto) else _load(model)
    return check(proto, [profile]).findings


def _load(path: Path) -> onnx.ModelProto:
    """A model a run folder or rewrite record names (the scanned or the original model): not ONNX is one line."""
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, ValueError... on a file that is not a model
        raise ModelError(f"case save: expected an ONNX model at {path}, found {type(exc).__name__}") from None


def _proof_line(proof: Mapping[str, Any]) -> str:
    worst = max((float(o.get("max_abs", 0.0)) for o in proof.get("outputs", [])), default=0.0)
    return f"proof {'passed' if proof.get('passed') else 'FAILED'}, max_abs {worst:.3g}"


def _case_id(model_name: str, sha: str, recipe: Sequence[str], profile: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(model_name).stem or "model")[:40]
    digest = hashlib.sha256(f"{sha}|{profile}|{','.join(recipe)}".encode()).hexdigest()[:8]
    return f"{stem}-{digest}"


def _recover_figures(record: dict[str, Any]) -> dict[str, Any]:
    """A `rewrite --recover` record's measured figures (what each pass bought), else nothing."""
    rec = record.get("recover")
    if not isinstance(rec, dict):
        return {}
    listed = rec.get("trials")
    trials = [{k: t.get(k) for k in ("rewrite", "kept", "cosine_before", "cosine_after")}
              for t in (listed if isinstance(listed, list) else []) if isinstance(t, dict)]
    return {"recover": {"profile": rec.get("profile"), "baseline_cosine": rec.get("baseline_cosine"),
                        "final_cosine": rec.get("final_cosine"), "kept": rec.get("kept"), "trials": trials}}


def save_case(
    run_dir: str | Path,
    note: str,
    *,
    cases: str | Path | None = None,
    rewrite_records: Sequence[str | Path] = (),
    profile: str | None = None,
) -> Path:
    """Record a case from a run folder (a scan of the rewritten model) into the library; returns its folder.

    The rewrite records default to `<model>.rewrite.json` beside the run's model; the profile to the
    run's `--profile`. The pattern is the findings of the original model (the first record's source)
    that the rewritten model no longer has.
    """
    run = Path(run_dir)
    info = read_run_json(run / "run.json")
    model_path = run_model_path(run, info)
    records = [Path(r) for r in rewrite_records] or [p for p in [model_path.with_name(model_path.name +
                                                                                     ".rewrite.json")] if p.is_file()]
    if not records:
        raise UsageError(f"case save: expected a rewrite record ({model_path.name}.rewrite.json beside the run's "
                         "model, or --rewrite FILE), found none: a case records what was changed")
    proofs = [read_record(r) for r in records]
    profile = profile or (info.get("options") or {}).get("profile")
    if not profile:
        raise UsageError("case save: expected the chip profile (the run's --profile, or --profile P), found none")
    profile_name = Path(str(profile)).stem if str(profile).endswith(".toml") else str(profile)
    source = Path(str(proofs[0].get("source", "")))
    before = _check(source, str(profile)) if source.is_file() else pd.DataFrame()
    # the scan checks with fixed input shapes: re-check like `before` when we can; no compat.csv is no findings
    after = _check(model_path, str(profile)) if model_path.is_file() else (read_table(run / "compat.csv")
                                                                          if (run / "compat.csv").is_file()
                                                                          else pd.DataFrame())
    if after is None:
        raise UsageError(f"case save: expected compat.csv to be a CSV table, found an unreadable file in {run}")
    resolved = resolved_patterns(before, after, {str(c.get(Col.NODE, "")) for p in proofs for s in p.get("steps", [])
                                                 for c in s.get("changes", [])})
    recipe = [s["rewrite"] for p in proofs for s in p.get("steps", []) if s.get("rewrite") != "opset"]
    case_id = _case_id(source.name or model_path.name, str((info.get("model") or {}).get("sha256", "")), recipe,
                       profile_name)
    folder = cases_dir(cases) / case_id
    plan = read_plan(run / "plan.json", strict=True)
    case = {
        "format": 1,
        "id": case_id,
        "note": note,
        "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": _model_signature(source if source.is_file() else None, _sha_of(source)),
        "rewritten_model": _model_signature(model_path if model_path.is_file() else None,
                                            str((info.get("model") or {}).get("sha256", ""))),
        "profile": profile_name,
        "pattern": [dict(zip(PATTERN_KEYS, p, strict=True)) for p in resolved],
        "findings_before": len(before),
        "findings_after": len(after),
        "recipe": recipe,
        "opset": next((p.get("opset_after") for p in proofs if p.get("opset_after") != p.get("opset_before")), None),
        "rewrites": [{"file": f"proofs/{r.name}", "steps": [s.get("rewrite") for s in p.get("steps", [])],
                      "changes": sum(len(s.get("changes", [])) for s in p.get("steps", [])),
                      "op_counts_before": p.get("op_counts_before"), "op_counts_after": p.get("op_counts_after"),
                      "proof": _proof_line(p.get("proof", {})), **_recover_figures(p)}
                     for r, p in zip(records, proofs, strict=True)],
        "plan": None if plan is None else {"target": plan.get("target"), "status": plan.get("status"),
                                           "sites": len(plan.get("sites", [])), "achieved": plan.get("achieved")},
        "metrics_after": (info.get("headline") or {}),
    }
    for r, proof in zip(records, proofs, strict=True):
        atomic_write_text(folder / "proofs" / r.name, _without_paths(proof))
    atomic_write_text(folder / CASE_FILE, json_text(case, indent=1))
    return folder


def resolved_patterns(before: pd.DataFrame, after: pd.DataFrame, changed: set[str]) -> list[tuple[str, ...]]:
    """Patterns the rewrite made go away; of those, the ones on nodes it changed when there are any
    (a finding that vanished elsewhere is a side effect, not what the recipe is for)."""
    gone = patterns(before) - patterns(after)
    if before.empty or Col.NODE not in before.columns:
        return sorted(gone)
    touched = patterns(before[before[Col.NODE].astype(str).isin(changed)]) & gone
    return sorted(touched or gone)


def _sha_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


def _without_paths(record: Mapping[str, Any]) -> str:
    """A rewrite record as the library keeps it: its `source`/`out` paths reduced to file names."""
    data = dict(record)
    for key in ("source", "out"):
        if isinstance(data.get(key), str):
            data[key] = Path(data[key]).name
    return json_text(data, indent=1)


def run_model_path(run: Path, info: Mapping[str, Any]) -> Path:
    """The scanned model run.json names. A relative path is as the scan was given it, relative to where
    `scan` ran, which `case save` (often run from elsewhere) does not know: it is looked up against the
    run folder and each folder above it, then the current folder, and the first file whose sha256 is the
    one run.json recorded is taken (any existing file when none was recorded)."""
    model = info.get("model") or {}
    named = model.get("path", "") if isinstance(model, dict) else ""
    if not isinstance(named, str) or not Path(named).name:
        raise UsageError(f"case save: expected run.json to name the scanned model, found no model path in {run}")
    path = Path(named)
    if path.is_absolute():
        return path
    sha = model.get("sha256") if isinstance(model, dict) else None
    root = run.resolve()
    for base in (root, *root.parents, Path.cwd()):
        if (base / path).is_file() and (not sha or _sha_of(base / path) == sha):
            return base / path
    return root.parent / path


RECORD_SCHEMA: dict[str, type | tuple[type, ...]] = {
    "source": str, "out": str, "steps": list, "proof": dict, "opset_before": (int, type(None)),
    "opset_after": (int, type(None)), "op_counts_before": (dict, type(None)), "op_counts_after": (dict, type(None)),
    "recover": (dict, type(None)),
}
"""The rewrite record keys a case reads, with their JSON types."""


def read_record(path: Path) -> dict[str, Any]:
    """A rewrite record (`rewrite -o` writes it beside the model), its fields checked before use: every step an
    object with a list of change objects, the proof an object with a list of output objects."""
    what = f"case save: rewrite record {path}"
    record = read_json_object(path, "case save: rewrite record")
    for key, kind in RECORD_SCHEMA.items():
        field(record, key, kind, what)
    for step in record.get("steps", []):
        if not isinstance(step, dict):
            raise FileError(f'{what}: expected "steps" to hold JSON objects, found a JSON {json_kind(step)}')
        field(step, "rewrite", str, f"{what} step")
        changes = field(step, "changes", list, f"{what} step", [])
        if not all(isinstance(c, dict) for c in changes):
            raise FileError(f'{what}: expected a step\'s "changes" to hold JSON objects, found another type')
    outputs = field(record.get("proof") or {}, "outputs", list, f"{what} proof", [])
    if not all(isinstance(o, dict) and isinstance(o.get("max_abs", 0.0), int | float) for o in outputs):
        raise FileError(f'{what}: expected the proof\'s "outputs" to be objects with a numeric "max_abs", found '
                        "another type")
    return record


# --- reading ----------------------------------------------------------------------------------------------


def list_cases(cases: str | Path | None = None) -> list[dict[str, Any]]:
    """Every case of the library (its case.json), oldest first; an absent library is empty."""
    root = cases_dir(cases)
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.glob(f"*/{CASE_FILE}")):
        try:
            case = read_json(path, "case.json")
        except FileError:
            continue
        if is_case(case):  # a hand-edited case of the wrong shape is skipped: it must not break every check
            found.append(case)
    return sorted(found, key=lambda c: (str(c.get("created", "")), str(c.get("id", ""))))


CASE_SCHEMA: dict[str, type | tuple[type, ...]] = {
    "id": str, "note": str, "created": str, "profile": str, "pattern": list, "recipe": list, "rewrites": list,
    "opset": (int, type(None)),
}
"""The case.json keys the readers rely on, with their JSON types (`id` and `pattern` required)."""


def is_case(case: object) -> bool:
    """A case.json the library can use: the keys readers rely on hold the types they expect."""
    if not isinstance(case, dict) or not isinstance(case.get("id"), str) or "pattern" not in case:
        return False
    for key, kind in CASE_SCHEMA.items():
        if key in case and (not isinstance(case[key], kind) or isinstance(case[key], bool)):
            return False
    return (all(isinstance(p, dict) for p in case["pattern"])
            and all(isinstance(r, str) for r in case.get("recipe", []))
            and all(isinstance(r, dict) for r in case.get("rewrites", [])))


def load_case(case_id: str, cases: str | Path | None = None) -> dict[str, Any]:
    """One case by id (or a unique prefix); a usage error lists the ids when none fits."""
    known = list_cases(cases)
    hits = [c for c in known if c.get("id") == case_id]
    hits = hits or [c for c in known if str(c.get("id", "")).startswith(case_id)]
    if len(hits) != 1:
        ids = ", ".join(str(c.get("id")) for c in known) or "(library empty)"
        raise UsageError(f"case: expected a case id of {cases_dir(cases)}, found {case_id!r} "
                         f"({'ambiguous' if hits else 'unknown'}; known: {ids})")
    return hits[0]


def match_cases(findings: pd.DataFrame, cases: str | Path | None = None) -> list[CaseMatch]:
    """Library cases whose whole pattern appears among `findings` (same profile, op, rule, attribute)."""
    have = patterns(findings)
    matches = []
    for case in list_cases(cases):
        wanted = {tuple(str(p.get(k, "")) for k in PATTERN_KEYS) for p in case.get("pattern", [])}
        if wanted and wanted <= have:
            proof = "; ".join(str(r.get("proof", "")) for r in case.get("rewrites", []))
            matches.append(CaseMatch(str(case["id"]), str(case.get("note", "")), list(case["pattern"]),
                                     list(case.get("recipe", [])), proof))
    return matches


def recipe(case_id: str, cases: str | Path | None = None) -> tuple[list[str], int | None]:
    """(rewrite ids in order, opset or None) that `rewrite --case` replays."""
    case = load_case(case_id, cases)
    steps = [str(s) for s in case.get("recipe", [])]
    if "fix-dim" in steps:
        raise UsageError(f"rewrite --case {case_id}: expected a recipe without fix-dim (its sizes are the "
                         "model's own), found fix-dim: give --fix-dim SPEC with the other steps instead")
    opset = case.get("opset")
    return steps, None if opset is None else int(opset)
