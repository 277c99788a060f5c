"""Time `quantscan check MODEL --profile all` against one single-profile run per shipped profile.

Issue 44's goal: on PP-OCRv4 rec and a YOLO detector, `check --profile all` runs in under a minute.
Three figures per model, each the best of REPEATS runs:
- "CLI all": the whole command as a user runs it (`python -m quantscan check MODEL --profile all`,
  interpreter start, model load, CSVs written), wall clock;
- "API all": `check(model, ["all"])` in process (one load and analysis, rules per profile);
- "API singles": the sum of `check(model, [name])` over the shipped profiles (a load and analysis
  each), what a user running one command per chip waits for, less the interpreter starts.
Run: python benchmarks/check_all.py [ASSETS_DIR] [MODEL ...]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import code_state, cpu_note, fmt_ratio, fmt_s, markdown_table

from quantscan.compat.check import check
from quantscan.compat.profiles import shipped_names

REPEATS = 3
MODELS = ("ppocrv4_rec", "ddddocr_common_det")
GOAL_S = 60.0


def _best(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _cli_all(model: Path) -> None:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "quantscan", "check", str(model), "--profile", "all", "--out", out,
                        "--force", "--quiet"], check=True, capture_output=True)


def _singles(model: Path) -> None:
    for name in shipped_names():
        check(model, [name])


def main(assets: Path, models: list[str]) -> None:
    rows = []
    for name in models:
        path = assets / "models" / f"{name}.onnx"
        cli = _best(lambda: _cli_all(path))  # noqa: B023 - called within the iteration
        api = _best(lambda: check(path, ["all"]))  # noqa: B023
        singles = _best(lambda: _singles(path), repeats=1)  # noqa: B023
        rows.append([name, f"{path.stat().st_size / 1e6:.1f}", fmt_s(cli), "yes" if cli < GOAL_S else "NO",
                     fmt_s(api), fmt_s(singles), fmt_ratio(singles, api)])
    print(f"{len(shipped_names())} shipped profiles; {code_state(Path(__file__).resolve().parents[1])}; {cpu_note()}")
    print(markdown_table(["model", "MB", "CLI all s", f"< {GOAL_S:.0f} s", "API all s", "API singles s",
                          "singles / all"], rows))


if __name__ == "__main__":
    default = Path(__file__).resolve().parents[1].parent / "shared" / "assets"
    args = sys.argv[1:]
    assets = Path(args.pop(0)) if args and Path(args[0]).is_dir() else default
    main(assets, args or list(MODELS))
