"""What the guarded readers cost over the bare calls they replaced (issue 42), on files of realistic size.

JSON: `readers.jsonfile.read_json` (size cap, UTF-8, the bracket-depth scan, then json.loads) against
`json.loads(path.read_text())`, on a bisect-session-like file. Arrays: `readers.arrays.read_npz` (every
header checked, then each member read within the budget) against `dict(np.load(path))`, on a dump-like
.npz. Best of 5; prints one ratio row each.

    python benchmarks/readers.py [--mb 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from quantscan.readers.arrays import read_npz
from quantscan.readers.jsonfile import read_json


def _best(fn: Callable[[], object], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _session_like(mb: float) -> dict[str, object]:
    """Steps and gains like a long bisect session's: small objects with names, numbers, nested lists."""
    rng = np.random.default_rng(0)
    n = int(mb * 1e6 / 160)
    rows = [{"node": f"/model/layer{i}/Conv", "order": i, "gain": float(rng.normal()),
             "sites": [f"s{i}", f"s{i + 1}"], "value": {"cosine": float(rng.random())}} for i in range(n)]
    return {"tool": "quantscan", "format": 2, "gain": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=20.0, help="size of each test file in MB")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "session.json"
        js.write_text(json.dumps(_session_like(args.mb)))
        npz = Path(tmp) / "000.npz"
        arrays = {f"/model/layer{i}/output_0": np.ones((1, 64, 40, 40), np.float32)
                  for i in range(max(1, int(args.mb * 1e6 / (64 * 40 * 40 * 4))))}
        np.savez(npz, **arrays)  # type: ignore[arg-type]
        rows = [
            ("JSON", js, _best(lambda: json.loads(js.read_text(encoding="utf-8"))),
             _best(lambda: read_json(js, "bench"))),
            (".npz", npz, _best(lambda: {k: v for k, v in np.load(npz).items()}),
             _best(lambda: read_npz(npz, "bench"))),
        ]
    print("| file | MB | bare s | guarded s | ratio |")
    print("|---|---|---|---|---|")
    for kind, _path, bare, guarded in rows:
        print(f"| {kind} | {args.mb:.0f} | {bare:.3f} | {guarded:.3f} | {guarded / bare:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
