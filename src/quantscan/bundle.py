"""Deliverables bundle: one zip with every conversion-relevant fact about a model, for a vendor or a team.

What goes in: the run folder's files, subfolders included (run.json with versions, model sha256 and the
input contract; layers/tensors/ops tables; compat.csv and partitions.csv when a profile was checked;
plan files and the session when a bisection ran; summary.md and report.html), plus whatever the user
adds with `include`: other run folders (a separate `check` or `bisect` --out folder goes in whole, under
its own name), rewritten models with their `.rewrite.json` proofs, extracted minimal models with their
`.inputs.npz`/`.expected.npz`/`.extract.json`. A `MANIFEST.json` lists every member with its sha256 and
carries the model identity, the versions (vendor tools when a vendor run is in the bundle) and the
input contract with the preprocessing as applied.

Portable: the text members (JSON, CSV, Markdown, HTML, logs) have the local folders they mention cut
off, so `/home/me/proj/calib/x` reads `calib/x` and no member names a path that exists only on the
machine that wrote it; the manifest lists which members were rewritten. Readable by the team: members
and the zip itself are 0644 whatever the writer's umask (a bundle is made to be handed over).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantscan import runfolder
from quantscan.errors import FileError, UsageError
from quantscan.readers.jsonfile import read_json
from quantscan.readers.text import read_bytes

APPENDED_SIDECARS = (".rewrite.json", ".log")
"""`OUT.onnx.rewrite.json` (a rewrite's proof), `OUT.onnx.log` (an --until-fails search log)."""
REPLACED_SIDECARS = (".inputs.npz", ".expected.npz", ".extract.json")
"""`OUT.inputs.npz` / `OUT.expected.npz` / `OUT.extract.json`: an extracted model's real inputs, expected
outputs, and the record of which kernel and finding it reproduces."""
TEXT_SUFFIXES = frozenset({".json", ".csv", ".md", ".html", ".log", ".txt"})
"""Members whose local paths are rewritten to relative ones."""
MEMBER_MODE = 0o644
"""Permissions of every member and of the zip: readable by the team whatever the umask."""


@dataclass
class Bundle:
    path: Path
    members: list[str]


def _folder_files(folder: Path) -> list[Path]:
    """Every file under `folder`, sorted, hidden temp files of interrupted writes left out."""
    return [p for p in sorted(folder.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)]


def _members(run_dir: Path, extras: Sequence[Path]) -> list[tuple[str, Path]]:
    if not (run_dir / runfolder.RUN_JSON).is_file():
        raise UsageError(f"bundle: expected a quantscan run folder (with run.json), found none in {run_dir}")
    items = [(f"run/{p.relative_to(run_dir).as_posix()}", p) for p in _folder_files(run_dir)]
    seen: set[Path] = {p.resolve() for _, p in items}
    for extra in extras:
        if extra.is_dir():
            prefix = _free_name({name.split("/")[0] for name, _ in items}, extra.resolve().name)
            items += [(f"{prefix}/{p.relative_to(extra).as_posix()}", p) for p in _folder_files(extra)
                      if p.resolve() not in seen]
            seen.update(p.resolve() for p in _folder_files(extra))
            continue
        if not extra.is_file():
            raise UsageError(f"bundle: expected a file or folder to include, found nothing at {extra}")
        if extra.resolve() in seen:  # the same file twice: one entry
            continue
        seen.add(extra.resolve())
        folder = _free_folder({name for name, _ in items}, extra.name)
        items.append((f"{folder}{extra.name}", extra))
        sides = [extra.with_name(extra.name + s) for s in APPENDED_SIDECARS]
        sides += [extra.with_suffix(s) for s in REPLACED_SIDECARS]
        items += [(f"{folder}{side.name}", side) for side in sides if side.is_file() and side.resolve() not in seen]
        seen.update(side.resolve() for side in sides if side.is_file())
    return items


def _free_folder(used: set[str], name: str) -> str:
    """`models/`, else `models/2/`, `models/3/`...: two includes with one basename stay two entries."""
    folder, k = "models/", 1
    while f"{folder}{name}" in used:
        k += 1
        folder = f"models/{k}/"
    return folder


def _free_name(used: set[str], name: str) -> str:
    """A top-level folder name for an included folder: its own name, else name-2, name-3..."""
    candidate, k = name, 1
    while candidate in used or candidate in ("run", "models", "MANIFEST.json"):
        k += 1
        candidate = f"{name}-{k}"
    return candidate


def local_roots(paths: Iterable[str | Path]) -> list[str]:
    """Absolute folders to cut from text members, longest first: the parent of every path given (so
    a file or folder keeps its own name) and every ancestor of those parents."""
    roots: set[str] = set()
    for raw in paths:
        if not raw:
            continue
        p = Path(raw)
        if not p.is_absolute():
            continue
        for parent in [*p.resolve().parents, *p.parents]:
            if str(parent) not in ("/", ""):
                roots.add(str(parent))
    return sorted(roots, key=len, reverse=True)


def relative_text(text: str, roots: Sequence[str]) -> str:
    """`text` with every `ROOT/` cut off (longest root first); a bare root (not the start of a longer
    name) becomes `.`."""
    for root in roots:
        text = text.replace(root + "/", "")
        text = re.sub(re.escape(root) + r"(?![\w.@+-])", ".", text)
    return text


def _paths_named(items: Sequence[tuple[str, Path]], run_json: Mapping[str, Any]) -> list[str]:
    """Where the bundled files and the run's inputs live on this machine, and the usual bases."""
    named = [str(src.resolve()) for _, src in items] + [str(src.absolute()) for _, src in items]
    for key in ("model", "calibration", "evaluation"):
        section = run_json.get(key)
        if isinstance(section, Mapping) and section.get("path"):
            named.append(str(section["path"]))
    named += [str(Path.cwd() / "x"), str(Path.home() / "x")]
    return named


def _vendor_versions(items: Sequence[tuple[str, Path]]) -> dict[str, Any]:
    """Tool and version of every vendor run (vendor.json) in the bundle."""
    found: dict[str, Any] = {}
    for name, src in items:
        if src.name == "vendor.json":
            try:
                data = read_json(src, "vendor.json")
            except FileError:
                continue
            if isinstance(data, Mapping):  # strings only: the manifest says what ran, not what a file claimed
                found[name] = {k: data[k] if isinstance(data.get(k), str) else None
                               for k in ("tool", "version", "target")}
    return found


def _zip_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = (0o100000 | MEMBER_MODE) << 16  # a regular file, rw-r--r--
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def make_bundle(run_dir: str | Path, out: str | Path, *, include: Sequence[str | Path] = (),
                force: bool = False) -> Bundle:
    """Write `out` (a .zip) atomically; refuses to write over a file that is part of the bundle, or
    over an existing file that is not a quantscan bundle unless `force`."""
    run, target = Path(run_dir), Path(out)
    items = _members(run, [Path(p) for p in include])
    if any(target.exists() and src.resolve() == target.resolve() for _, src in items):
        raise UsageError(f"bundle: expected an output path outside the bundled files, found {target}")
    runfolder.refuse_foreign_overwrite(target, "-o", runfolder.is_quantscan_zip, force)
    run_json = runfolder.read_run_json(run / runfolder.RUN_JSON)
    roots = local_roots(_paths_named(items, run_json))
    members: dict[str, dict[str, Any]] = {}
    rewritten: list[str] = []
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, src in items:
            data = read_bytes(src, "bundle")
            if src.suffix.lower() in TEXT_SUFFIXES:
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    text = None
                if text is not None and (portable := relative_text(text, roots)) != text:
                    data = portable.encode("utf-8")
                    rewritten.append(name)
            members[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            zf.writestr(_zip_info(name), data)
        versions = dict(run_json.get("versions") or {})
        vendors = _vendor_versions(items)
        if vendors:
            versions["vendor"] = vendors
        manifest = {
            "format": 1,
            "tool": "quantscan",
            "members": members,
            "model": run_json.get("model"),
            "versions": versions,
            "input_contract": run_json.get("input_contract"),
            "preprocessing": run_json.get("preprocessing"),
            "paths": "relative: local folders cut from text members",
            "paths_rewritten": rewritten,
        }
        text = relative_text(runfolder.json_text(manifest, indent=1), roots)
        zf.writestr(_zip_info("MANIFEST.json"), text)
    runfolder.atomic_write_bytes(target, buf.getvalue())
    os.chmod(target, MEMBER_MODE)
    return Bundle(target, [n for n, _ in items] + ["MANIFEST.json"])
