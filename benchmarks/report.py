"""Build report.html for every asset model: build time and page size (issue 6: aim < 2 MB at 1,500 nodes).

Each model is scanned with `limit=8` samples (the page's size and build time do not depend on the
sample count), then the page is rendered from the run folder, as `quantscan report RUN_DIR` does.
The last row tiles the largest run's layers.csv to 1,500 sites: the asset models are smaller than
the issue's 1,500-node target, and only the layer table and the depth plot grow with the site count
(the top-layer plots are a fixed eight).

Run: python benchmarks/report.py [ASSETS_DIR]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from quantscan import scan
from quantscan.report.html import write_report

CONSTS = {"silero_vad_openvino_16k": {"state": 0.0}}
"""Inputs the calibration data does not cover (the recurrent state), as `--const NAME=VALUE`."""

REPEATS = 2
TILED_SITES = 1500


def _build(run_dir: Path) -> tuple[float, int]:
    """Best-of-REPEATS render time (s) and the page size (bytes)."""
    best = float("inf")
    for _ in range(REPEATS):
        t = time.perf_counter()
        path = write_report(run_dir)
        best = min(best, time.perf_counter() - t)
    return best, path.stat().st_size


def _tile(run_dir: Path, out: Path, sites: int) -> Path:
    """A copy of run_dir whose layers.csv repeats its rows (renamed, re-ordered) up to `sites` rows."""
    out.mkdir(parents=True, exist_ok=True)
    for f in run_dir.iterdir():
        if f.is_file() and f.name != "report.html":
            (out / f.name).write_bytes(f.read_bytes())
    layers = pd.read_csv(run_dir / "layers.csv", keep_default_na=False, na_values=[""])
    copies = []
    span = int(pd.to_numeric(layers["order"]).max()) + 1
    for k in range(-(-sites // len(layers))):
        c = layers.copy()
        if k:
            c["node"] = c["node"].astype(str) + f"#{k}"
        c["order"] = pd.to_numeric(c["order"]) + k * span
        copies.append(c)
    tiled = pd.concat(copies, ignore_index=True).head(sites)
    tiled["rank"] = range(1, len(tiled) + 1)
    tiled.to_csv(out / "layers.csv", index=False)
    return out


def main(assets: Path) -> None:
    print(f"{'model':34} {'nodes':>6} {'sites':>6} {'scan s':>7} {'build s':>8} {'page kB':>8}")
    largest: tuple[int, Path] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for model in sorted((assets / "models").glob("*.onnx")):
            out = Path(tmp) / model.stem
            t = time.perf_counter()
            result = scan(model, assets / "calib" / model.stem, out=out, limit=8, const=CONSTS.get(model.stem, {}))
            scan_s = time.perf_counter() - t
            build_s, size = _build(out)
            nodes = result.run_info.model.nodes
            print(
                f"{model.stem:34} {nodes:>6} {len(result.layers):>6} {scan_s:>7.1f} {build_s:>8.2f} {size / 1e3:>8.0f}"
            )
            if largest is None or len(result.layers) > largest[0]:
                largest = (len(result.layers), out)
        if largest is not None:
            tiled = _tile(largest[1], Path(tmp) / "tiled", TILED_SITES)
            build_s, size = _build(tiled)
            label = f"{largest[1].name} tiled"
            print(f"{label:34} {'':>6} {TILED_SITES:>6} {'':>7} {build_s:>8.2f} {size / 1e3:>8.0f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "assets")
