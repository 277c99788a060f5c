"""Time `quantscan check` per asset model and profile, beyond model load.

"Load" is reading the file, shape inference (twice when input dims are symbolic) and the
profile-independent analysis; "check" is rules + partitions for one profile on that analysis.
Run: python benchmarks/check.py [ASSETS_DIR]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from quantscan.compat.analysis import ModelAnalysis, analyse
from quantscan.compat.check import run_rules
from quantscan.compat.partitions import colour, partition
from quantscan.compat.profiles import Profile, list_profiles, load_profile

REPEATS = 3


def _best(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _check_one(analysis: ModelAnalysis, profile: Profile) -> None:
    found = run_rules(analysis, profile)
    partition(analysis, colour(analysis, found))


def main(assets: Path) -> None:
    profiles = [load_profile(p.name) for p in list_profiles()]
    header = f"{'model':32} {'MB':>6} {'load s':>7} " + " ".join(f"{p.name:>11}" for p in profiles)
    print(header)
    print("-" * len(header))
    for path in sorted((assets / "models").glob("*.onnx"), key=lambda p: p.stat().st_size):
        load = _best(partial(analyse, path))
        analysis = analyse(path)
        cells = [f"{_best(partial(_check_one, analysis, p)) * 1000:9.1f}ms" for p in profiles]
        size = path.stat().st_size / 1e6
        print(f"{path.stem:32} {size:6.1f} {load:7.3f} " + " ".join(f"{c:>11}" for c in cells))


if __name__ == "__main__":
    default = Path(__file__).resolve().parents[1].parent / "shared" / "assets"
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else default)
