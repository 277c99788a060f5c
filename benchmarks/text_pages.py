"""Text pages for a text detector, built from the assets' real text-line crops.

    python benchmarks/text_pages.py OUT [--pages 8] [--size 320] [--assets ../shared/assets]

Why: PP-OCRv4 det fed photographs (the zoo's calibration set) sees almost no text, so its probability map is
~1e-7 everywhere, int8 rounds it to 0 and every cosine of it is noise (issue 38: held-out all-int8 0.00000, an
interval [0.51, 1.0]). Stacking the PP-OCRv4 rec crops (photographed English text lines, 320x48) six to a page on
the crops' own paper grey gives the detector real text at its input size. Page k takes the crops k, k+5, k+10, ...
(mod the crop count), so no two pages hold the same lines in the same places. Writes PNGs and a preprocess.json
with the detector's preprocessing (rapidocr's: BGR, /255, ImageNet mean and std, NCHW).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image


def pages(crops: list[Path], count: int, size: int, per_page: int = 6) -> list[Image.Image]:
    """`count` pages of `per_page` crops each, stacked with an 8-pixel gap on the median grey of the crops."""
    images = [Image.open(c).convert("RGB") for c in crops]
    grey = tuple(int(v) for v in np.median(np.concatenate([np.asarray(i).reshape(-1, 3) for i in images]), axis=0))
    out = []
    for k in range(count):
        page = Image.new("RGB", (size, size), grey)
        y = 8
        for j in range(per_page):
            crop = images[(k + 5 * j) % len(images)]
            if crop.width > size:
                crop = crop.resize((size, round(crop.height * size / crop.width)))
            if y + crop.height > size:
                break
            page.paste(crop, (0, y))
            y += crop.height + 8
        out.append(page)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--pages", type=int, default=8)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--assets", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "assets")
    args = parser.parse_args()
    crops = sorted((args.assets / "calib" / "ppocrv4_rec").glob("*.png"))
    if not crops:
        raise SystemExit(f"expected the PP-OCRv4 rec crops under {args.assets / 'calib' / 'ppocrv4_rec'}, found none")
    args.out.mkdir(parents=True, exist_ok=True)
    names = []
    for k, page in enumerate(pages(crops, args.pages, args.size)):
        names.append(f"{k:03d}_page.png")
        page.save(args.out / names[-1])
    spec = {"input": "x", "shape": [1, 3, args.size, args.size], "channel_order": "BGR", "scale": 1 / 255,
            "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "layout": "NCHW", "files": names}
    (args.out / "preprocess.json").write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(names)} pages to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
