"""A stand-in for tpu-mlir's four console scripts, for `quantscan vendor tpu-mlir` tests (CI never installs it).

Called as `fake_tpu_mlir.py TOOL ARGS...` by the wrappers `fakes.fake_tpu_mlir_python` puts on PATH. It keeps the real
tools' file protocol and naming, and computes with onnx's ReferenceEvaluator:
- model_transform writes a top MLIR with one op per ONNX node named `<output>_<OpType>` (`#locN = loc(..)`),
  leaving out Add nodes (tpu-mlir folds a MatMul's bias Add into the MatMul), plus a sidecar with the model;
- run_calibration writes a table; model_deploy writes `<name>_<chip>_int8_sym_tpu.mlir` and `..._final.mlir`
  where every op is `!quant.uniform<i8..>` except those the quantize table sets to F32/F16;
- model_runner dumps every op's tensor: exact FP32 for the top MLIR; for the final one each int8 op's value
  rounded to a 1/16 grid (the FP32 value, not propagated), float ops exact.
FAKE_TPU_FAIL=<tool> makes that tool exit 1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

GRID = 16.0


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(op name, op type) of the nodes the fake converter keeps."""
    return [(f"{n.output[0]}_{n.op_type}", n.op_type) for n in model.graph.node if n.op_type != "Add"]


def _mlir(ops: list[tuple[str, str]], types: dict[str, str]) -> str:
    locs = [f'#loc{i} = loc("{name}")' for i, (name, _) in enumerate(ops)]
    lines = [f'    %{i} = "top.{op}"(%x) : (tensor<1x16xf32>) -> tensor<1x16x{types.get(name, "f32")}> loc(#loc{i})'
             for i, (name, op) in enumerate(ops)]
    return "module {\n" + "\n".join(lines) + "\n}\n" + "\n".join(locs) + "\n"


def transform(args: list[str]) -> None:
    """The one tool here besides model_runner that reads the ONNX model: its ops go into the sidecar, so
    run_calibration and model_deploy start without importing onnx (ml_dtypes alone is ~0.55 CPU s a process)."""
    import onnx

    model = onnx.load(_arg(args, "--model_def"))
    out = Path(_arg(args, "--mlir"))
    out.write_text(_mlir(_ops(model), {}))
    Path(str(out) + ".fake.json").write_text(json.dumps({"model": _arg(args, "--model_def"), "float": None,
                                                         "ir_version": model.ir_version, "ops": _ops(model)}))


def deploy(args: list[str]) -> None:
    top = Path(_arg(args, "--mlir"))
    side = json.loads(Path(str(top) + ".fake.json").read_text())
    ops = [(name, op) for name, op in side["ops"]]  # model_transform's, as the real deploy reads the top MLIR
    modes = {}
    if "--quantize_table" in args:
        for line in Path(_arg(args, "--quantize_table")).read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, mode = line.split()
                modes[name] = mode
    types = {name: {"F32": "f32", "F16": "f16"}.get(modes.get(name, ""), "!quant.uniform<i8:f32, 0.0625>")
             for name, _ in ops}
    stem = f"{top.stem}_{_arg(args, '--processor')}_int8_sym"
    for kind in ("tpu", "final"):
        path = Path(f"{stem}_{kind}.mlir")
        path.write_text(_mlir(ops, types))
        Path(str(path) + ".fake.json").write_text(json.dumps({"model": side["model"], "float": sorted(
            n for n, t in types.items() if not t.startswith("!"))}))
    Path(_arg(args, "--model")).write_text("fake bmodel")


def runner(args: list[str]) -> None:
    import numpy as np
    import onnx
    from onnx.reference import ReferenceEvaluator

    mlir = Path(_arg(args, "--model"))
    side = json.loads(Path(str(mlir) + ".fake.json").read_text())
    model = onnx.load(side["model"])
    names = [o for n in model.graph.node for o in n.output]
    with np.load(_arg(args, "--input")) as data:
        feeds = {k: data[k] for k in data.files}
    got = ReferenceEvaluator(model).run(names, feeds)
    values = dict(zip(names, got, strict=True))
    dump = {}
    for name, op in _ops(model):
        x = values[name[: -len(op) - 1]].astype(np.float32)
        exact = side["float"] is None or name in side["float"]
        dump[name] = x if exact else np.round(x * GRID) / GRID
    np.savez(_arg(args, "--output"), **dump)


def main() -> int:
    tool, args = sys.argv[1], sys.argv[2:]
    print(f"TPU-MLIR v0.0.0-fake {tool} {' '.join(args)}", flush=True)
    if os.environ.get("FAKE_TPU_FAIL") == tool:
        print("Traceback (most recent call last):\nRuntimeError: fake failure", flush=True)
        return 1
    if tool == "run_calibration":
        method = _arg(args, "--cali_method") if "--cali_method" in args else "kl (default)"
        Path(_arg(args, "-o")).write_text(f"# fake table\n# quantization threshold calculation method: {method}\n")
        return 0
    {"model_transform": transform, "model_deploy": deploy, "model_runner": runner}[tool](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
