"""The model input as a site (issue 26 item 3): what it finds and what it costs.

Cases: the power-mel speaker-encoder stand-in of tests/scanning/test_input_site_lstm.py (Transpose -> LSTM
-> projection) on the CMU ARCTIC speech clips of the silero asset, and silero-vad itself. Per case: the
input's share of values in its most used uint8 code, the output cosine with the input alone quantized at 8
and 16 bits (run.json `inputs[*].quantization`), the all-int8 cosine, the input's `gain_if_float` and rank,
the LSTM's gain (no longer charged with the input's error), and the cost: the scan's time, the
`input_sites` phase and the gain phase, as ratios to one FP32 pass over the evaluation set.

    PYTHONPATH=src python benchmarks/input_sites.py [--samples N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import quantscan
from quantscan.columns import Col
from quantscan.runner import Runner

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ASSETS = ROOT.parent / "shared" / "assets"


def fp32_seconds(model: Path, calib: Path, samples: int, const: dict[str, float]) -> float:
    """One FP32 pass over the evaluation samples (the unit of the cost ratios)."""
    from quantscan.calib import load_calibration
    from quantscan.model import load_model

    loaded = load_model(model)
    data = load_calibration(calib, loaded.inputs, limit=samples, consts=const)
    session = Runner(threads=1).session(loaded.proto)
    started = time.perf_counter()
    for feeds in data.samples():
        session.run(feeds)
    return time.perf_counter() - started


def row(name: str, model: Path, calib: Path, samples: int, const: dict[str, float]) -> str:
    result = quantscan.scan(model, calib, limit=samples, gain_samples=0, threads=1, const=const, quiet=True,
                            no_report=True)
    layers = result.layers
    inputs = layers[layers[Col.OP_TYPE] == "input"]
    first = inputs.iloc[0]
    q = next(i["quantization"] for i in result.run_info.inputs if i["name"] == first[Col.OUTPUT])
    kernels = layers[layers[Col.OP_TYPE] != "input"]
    lstm = kernels[kernels[Col.OP_TYPE] == "LSTM"]
    lstm_gain = float(lstm[Col.GAIN_IF_FLOAT].iloc[0]) if len(lstm) else float("nan")
    times = result.run_info.times_s
    unit = fp32_seconds(model, calib, samples, const)
    return (f"| {name} | {samples} | {100 * q['top_code_share']:.1f}% | {q['output_cosine']:.4f} | "
            f"{q['output_cosine_16bit']:.4f} | {result.headline.cosine:.4f} | {float(first[Col.GAIN_IF_FLOAT]):+.4f} | "
            f"{int(first[Col.RANK])} | {lstm_gain:+.4f} | {first[Col.DIAGNOSIS_CAUSE] or 'none'} | "
            f"{times['total'] / unit:.0f} | {times['input_sites'] / unit:.1f} | {times['impact'] / unit:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=32)
    args = parser.parse_args()
    from tests.scanning.test_input_site_lstm import read_wav, write_case

    print("| case | samples | values in top code | cosine, input alone 8 bit | 16 bit | all-int8 | input gain_if_float "
          "| input rank | LSTM gain | input cause | scan / FP32 pass | input_sites / FP32 | gain phase / FP32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    silero = ASSETS / "calib" / "silero_vad_openvino_16k"
    with tempfile.TemporaryDirectory() as tmp:
        path, calib, _ = write_case(Path(tmp), [read_wav(w) for w in sorted(silero.glob("*.wav"))])
        print(row("power-mel LSTM encoder (ARCTIC speech)", path, calib, args.samples, {}))
    print(row("silero_vad_openvino_16k", ASSETS / "models" / "silero_vad_openvino_16k.onnx", silero, args.samples,
              {"state": 0.0}))
    np.random.seed(0)


if __name__ == "__main__":
    main()
