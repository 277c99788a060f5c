"""NNCF's own bias correction and SmoothQuant on the same model and samples, for issue 27's side-by-side.

Two steps, two Pythons (NNCF lives in its own venv, never in quantscan's install):

    PYTHONPATH=src python benchmarks/peer_nncf.py export MODEL CALIB_DIR OUT.npz --limit 16
    /work/venvs/nncf/bin/python -P benchmarks/peer_nncf.py run MODEL OUT.npz

(-P: without it benchmarks/bisect.py shadows the stdlib module NNCF imports.)

`export` writes the calibration samples exactly as quantscan feeds them; `run` quantizes with
nncf.quantize (ONNX backend, preset MIXED: asymmetric activations like rk3588's, per-channel weights)
with bias correction off, NNCF's fast bias correction, and SmoothQuant (model_type TRANSFORMER) +
fast bias correction, and prints each QDQ model's pooled output cosine against FP32 on the same
samples (onnxruntime, as quantscan's cosine: one cosine over every output value of every sample).
The gains (variant minus no-correction) are what to set beside quantscan's --bias-correct / --smooth.
"""

from __future__ import annotations

import sys
from typing import Any


def export(model: str, calib: str, out: str, limit: int) -> None:
    import numpy as np

    from quantscan.calib import load_calibration
    from quantscan.model import load_model

    loaded = load_model(model)
    cs = load_calibration(calib, loaded.inputs, limit=limit)
    samples = list(cs.samples())
    names = list(samples[0])
    np.savez(out, **{f"{n}__{i}": s[n] for i, s in enumerate(samples) for n in names})
    print(f"wrote {len(samples)} samples of {names} to {out}")


def run(model: str, data: str) -> None:
    import nncf
    import numpy as np
    import onnx
    import onnxruntime as ort
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters

    raw = np.load(data)
    count = 1 + max(int(k.rsplit("__", 1)[1]) for k in raw.files)
    samples = [{k.rsplit("__", 1)[0]: raw[k] for k in raw.files if k.endswith(f"__{i}")} for i in range(count)]
    proto = onnx.load(model)
    dataset = nncf.Dataset(samples, lambda s: s)
    variants: dict[str, dict[str, Any]] = {
        "no correction": {"fast_bias_correction": True,
                          "advanced_parameters": AdvancedQuantizationParameters(disable_bias_correction=True)},
        "fast bias correction": {"fast_bias_correction": True},
        "bias correction": {"fast_bias_correction": False},
        "SmoothQuant + fast BC": {"fast_bias_correction": True, "model_type": nncf.ModelType.TRANSFORMER},
    }
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    fp32 = [ref.run(None, s) for s in samples]
    base = None
    for name, kw in variants.items():
        try:
            q = nncf.quantize(proto, dataset, preset=nncf.QuantizationPreset.MIXED, subset_size=len(samples), **kw)
        except Exception as exc:  # noqa: BLE001 - a variant NNCF cannot do is reported, not fatal
            print(f"| {name} | failed: {str(exc).splitlines()[0][:100]} |")
            continue
        sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
        dot = xx = yy = 0.0
        for s, ys in zip(samples, fp32, strict=True):
            got = sess.run(None, s)
            for x, y in zip(ys, got, strict=True):
                x64, y64 = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
                dot, xx, yy = dot + float(x64 @ y64), xx + float(x64 @ x64), yy + float(y64 @ y64)
        cos = dot / np.sqrt(xx * yy)
        base = cos if base is None else base
        print(f"| {name} | {cos:.5f} | {cos - base:+.5f} |", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "export":
        limit = int(sys.argv[sys.argv.index("--limit") + 1]) if "--limit" in sys.argv else 16
        export(sys.argv[2], sys.argv[3], sys.argv[4], limit)
    else:
        run(sys.argv[2], sys.argv[3])
