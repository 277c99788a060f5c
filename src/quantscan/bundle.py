"""Deliverables bundle: one zip with every conversion-relevant fact about a model, for a vendor or a team.

What goes in: the run folder's files (run.json with versions, model sha256 and the input contract;
layers/tensors/ops tables; compat.csv and partitions.csv when a profile was checked; plan files when a
bisection ran; summary.md and report.html), plus whatever the user adds: rewritten models with their
`.rewrite.json` proofs, extracted minimal models with their `.inputs.npz`/`.expected.npz`. A
`MANIFEST.json` lists every member with its sha256 and says what each kind of file is.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from quantscan import runfolder
from quantscan.errors import UsageError

APPENDED_SIDECARS = (".rewrite.json", ".log")
"""`OUT.onnx.rewrite.json` (a rewrite's proof), `OUT.onnx.log` (an --until-fails search log)."""
REPLACED_SIDECARS = (".inputs.npz", ".expected.npz")
"""`OUT.inputs.npz` / `OUT.expected.npz`: an extracted model's real inputs and expected outputs."""


@dataclass
class Bundle:
    path: Path
    members: list[str]


def _members(run_dir: Path, extras: Sequence[Path]) -> list[tuple[str, Path]]:
    if not (run_dir / runfolder.RUN_JSON).is_file():
        raise UsageError(f"bundle: expected a quantscan run folder (with run.json), found none in {run_dir}")
    items = [(f"run/{p.name}", p) for p in runfolder.run_members(run_dir)]
    seen: set[Path] = set()
    for extra in extras:
        if not extra.is_file():
            raise UsageError(f"bundle: expected a file to include, found nothing at {extra}")
        if extra.resolve() in seen:  # the same file twice: one entry
            continue
        seen.add(extra.resolve())
        folder = _free_folder({name for name, _ in items}, extra.name)
        items.append((f"{folder}{extra.name}", extra))
        sides = [extra.with_name(extra.name + s) for s in APPENDED_SIDECARS]
        sides += [extra.with_suffix(s) for s in REPLACED_SIDECARS]
        items += [(f"{folder}{side.name}", side) for side in sides if side.is_file()]
    return items


def _free_folder(used: set[str], name: str) -> str:
    """`models/`, else `models/2/`, `models/3/`...: two includes with one basename stay two entries."""
    folder, k = "models/", 1
    while f"{folder}{name}" in used:
        k += 1
        folder = f"models/{k}/"
    return folder


def make_bundle(run_dir: str | Path, out: str | Path, *, include: Sequence[str | Path] = (),
                force: bool = False) -> Bundle:
    """Write `out` (a .zip) atomically; refuses to write over a file that is part of the bundle, or
    over an existing file that is not a quantscan bundle unless `force`."""
    run, target = Path(run_dir), Path(out)
    items = _members(run, [Path(p) for p in include])
    if any(target.exists() and src.resolve() == target.resolve() for _, src in items):
        raise UsageError(f"bundle: expected an output path outside the bundled files, found {target}")
    runfolder.refuse_foreign_overwrite(target, "-o", runfolder.is_quantscan_zip, force)
    manifest = {"format": 1, "tool": "quantscan", "members": {}}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, src in items:
            data = src.read_bytes()
            manifest["members"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}  # type: ignore[index]
            zf.writestr(name, data)
        run_json = runfolder.read_run_json(run / runfolder.RUN_JSON)
        manifest["model"] = run_json.get("model")
        manifest["versions"] = run_json.get("versions")
        manifest["input_contract"] = run_json.get("input_contract")
        zf.writestr("MANIFEST.json", runfolder.json_text(manifest, indent=1))
    runfolder.atomic_write_bytes(target, buf.getvalue())
    return Bundle(target, [n for n, _ in items] + ["MANIFEST.json"])
