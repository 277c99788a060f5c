"""Errors / warnings / CPU islands per asset model and profile, before and after `--all-for-profile`.

What `rewrite --all-for-profile P` then `check --profile P` does on the public assets: the plan, whether
its numeric proof passed (on the model's calibration set, 4 samples), and the check counts before ->
after. A plan that cannot run (a refused opset, a proof without data) is shown with its reason and the
counts stay the "before" ones.
Run: python benchmarks/all_for_profile.py [ASSETS_DIR] [PROFILE ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx

from quantscan.calib import CalibSet, load_calibration
from quantscan.compat.check import check
from quantscan.compat.rewrite_plan import plan_for_profile, split_applicable
from quantscan.errors import QuantscanError
from quantscan.model import graph_inputs
from quantscan.rewrites.pipeline import rewrite

PROFILES = ("horizon-x3", "rk3568", "rk3588")
KEYS = ("errors", "warnings", "cpu_islands")


def _calib(assets: Path, path: Path) -> CalibSet | None:
    folder = assets / "calib" / path.stem
    try:
        return load_calibration(folder, graph_inputs(onnx.load(path)), limit=4) if folder.exists() else None
    except QuantscanError:
        return None


def _counts(model: object, profile: str) -> dict[str, object]:
    return check(model, [profile]).summary_rows()[0]  # type: ignore[arg-type]


def _row(assets: Path, path: Path, profile: str) -> str:
    before = _counts(path, profile)
    plan = plan_for_profile(path, profile)
    steps, _ = split_applicable(path, [r.value for r in plan.rewrites])
    named = steps + [f"fix-dim {d}" for d in plan.fix_dims] + ([f"opset {plan.opset}"] if plan.opset else [])
    after, status = before, "nothing to rewrite"
    if steps or plan.fix_dims or plan.opset:
        try:
            rep = rewrite(path, steps, fix_dim=plan.fix_dims, opset=plan.opset, calib=_calib(assets, path),
                          limit=4, write=False)
            after = _counts(rep.model, profile)
            status = "proof ok" if rep.passed else "proof FAILED"
        except QuantscanError as exc:
            status = f"not applied: {str(exc)[:70]}"
    cells = " ".join(f"{before[k]!s:>4} -> {after[k]!s:<4}" for k in KEYS)
    return f"{path.stem:26} {profile:11} {cells} {status:14} {', '.join(named) or '-'}"


def main(assets: Path, profiles: tuple[str, ...]) -> None:
    header = f"{'model':26} {'profile':11} " + " ".join(f"{k:>12}" for k in KEYS) + f" {'status':14} plan"
    print(header)
    print("-" * len(header))
    for path in sorted((assets / "models").glob("*.onnx")):
        for profile in profiles:
            print(_row(assets, path, profile), flush=True)


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "assets"
    main(root, tuple(sys.argv[2:]) or PROFILES)
