"""Per-kernel sizes of the RKNN Model Zoo architectures, as quantscan's cost model sees them, in one JSON.

    python benchmarks/cost_zoo_layers.py MODELS_DIR [benchmarks/cost_zoo_layers.json]

MODELS_DIR holds the ONNX files benchmarks/cost_zoo_build.py writes, plus ppocrv4_det.onnx
(rapidocr-onnxruntime==1.4.4's ch_PP-OCRv4_det_infer.onnx, benchmarks/zoo.json) and ppocrv4_rec.onnx
(../shared/assets/models). Kernels are grouped as the rk3588 profile fuses them (rk3568 and rk3576 share
its fusions); each row is what the roofline reads: op, role, site, MACs, elementwise work, input and
output elements, weight elements, depthwise, channels. benchmarks/cost_fit.py reads this file only, so
the fit runs without torch or the models.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from quantscan.compat.profiles import load_profile
from quantscan.cost import Pricer

SHAPES = {"ppocrv4_det": {"x": [1, 3, 480, 480]}, "ppocrv4_rec": {"x": [1, 3, 48, 320]}}
"""The zoo table's input shapes where the file's own are symbolic."""
FIELDS = ["op", "role", "site", "macs", "ops", "in", "out", "w", "dw", "cin", "cout"]


def layers(path: Path) -> dict[str, object]:
    pricer = Pricer.of(path, load_profile("rk3588"), SHAPES.get(path.stem))
    # every kernel, the ones compat would put on the CPU too: the zoo's models run whole on the NPU
    # (the profile's op list is toolkit 1.4.0's; the zoo was measured with 2.3.2)
    rows = [[k.to_json()[f] for f in FIELDS] for k in pricer.kernels if k.role != "free"]
    cpu = [k.op for k in pricer.kernels if k.device == "cpu"]
    return {"macs": sum(k.macs for k in pricer.kernels), "cpu_ops": cpu, "kernels": rows}


def main(argv: list[str]) -> int:
    folder = Path(argv[1])
    out = Path(argv[2]) if len(argv) > 2 else Path(__file__).with_name("cost_zoo_layers.json")
    models = {p.stem: layers(p) for p in sorted(folder.glob("*.onnx"))}
    doc = {"about": __doc__.strip().splitlines()[0], "fields": FIELDS, "models": models}
    text = json.dumps(doc, separators=(",", ":"))
    out.write_text(text.replace('],[', '],\n[') + "\n", encoding="utf-8")
    for name, m in models.items():
        print(f"{name:16s} {m['macs'] / 1e9:7.2f} GMAC {len(m['kernels']):4d} kernels  cpu: {len(m['cpu_ops'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
