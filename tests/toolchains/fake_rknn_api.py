"""A stand-in for `rknn.api` (copied to <tmp>/rknn/api.py by the tests): the driver's file protocol
end to end without the toolkit. Its "simulator" rounds every tensor to a 1/16 grid, so the figures
quantscan reads back have an independent numpy oracle. Output formats copy rknn-toolkit2 2.5.0's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

GRID = 16.0


def simulate(x: np.ndarray, grid: float = GRID) -> np.ndarray:
    return np.round(x * grid) / grid


class RKNN:
    def __init__(self, verbose: bool = False, verbose_file: str | None = None) -> None:
        sys.stdout.write("I rknn-toolkit2 version: 0.0.0-fake\n")
        self.model: onnx.ModelProto | None = None
        self.path = ""
        self.stem = ""
        self.float16: set[str] | None = None
        """After a hybrid step 2: the tensors set to float16 (the simulator's grid is 2**len finer)."""

    def config(self, **kwargs: Any) -> int:
        return 0

    def load_onnx(self, model: str, inputs: Any = None, input_size_list: Any = None) -> int:
        self.path = model
        self.model = onnx.load(model)
        self.stem = Path(model).stem
        return 0

    def build(self, do_quantization: bool = True, dataset: str | None = None, **kwargs: Any) -> int:
        assert self.model is not None and dataset and Path(dataset).read_text().strip()
        self._table(set())
        return 0

    def _table(self, float16: set[str]) -> None:
        """The verbose log's layer table; a node whose output the cfg set to float16 runs FLOAT16."""
        assert self.model is not None
        out = sys.stdout
        out.write("D RKNN: [00:00:00.000]                 Network Layer Information Table\n")
        out.write("D RKNN: [00:00:00.000] ID   OpType  DataType Target InputShape  OutputShape  Cycles  RW  FullName\n")
        for i, node in enumerate(self.model.graph.node, start=1):
            if float16 and node.op_type == "Add":
                continue  # a hybrid build folds the Add into its MatMul (as step 1's cfg says)
            target = "CPU" if node.op_type == "Relu" and i == 3 else "NPU"  # one planted CPU placement
            dtype = "FLOAT16" if node.output[0] in float16 else "INT8"
            out.write(f"D RKNN: [00:00:00.000] {i:<4} {node.op_type:<8} {dtype:<8} {target}    (1,16)  (1,16)  "
                      f"0/0/0  1  {node.op_type}:{node.name}\n")
        out.write("D RKNN: [00:00:00.000] <<<<<<<< end: rknn::RKNNModelRegCmdbuildPass\n")

    def hybrid_quantization_step1(self, dataset: str = "", **kwargs: Any) -> int:
        assert self.model is not None
        tensors = [n.output[0] for n in self.model.graph.node if n.op_type != "Add"]  # Add folds into MatMul
        Path(f"{self.stem}.quantization.cfg").write_text("custom_quantize_layers: {}\nquantize_parameters:\n" + "".join(
            f"    {t}:\n        qtype: asym\n" for t in ["x", *tensors]))
        Path(f"{self.stem}.model").write_text(self.path)
        Path(f"{self.stem}.data").write_text("fake")
        return 0

    def hybrid_quantization_step2(self, model_input: str, data_input: str, model_quantization_cfg: str) -> int:
        assert self.model is None, "step 2 on an RKNN object that loaded a model fails in 2.5.0"
        text = Path(model_quantization_cfg).read_text()
        custom, known, section = {}, set(), ""
        for line in text.splitlines():
            if not line.startswith(" "):
                section = line.split(":")[0]
                continue
            if line.startswith("    ") and not line.startswith("     "):
                name, _, value = line.strip().rpartition(":")
                name = name.strip().strip('"')
                if section == "custom_quantize_layers":
                    custom[name] = value.strip()
                else:
                    known.add(name)
        unknown = sorted(set(custom) - known)
        if unknown:  # what rknn-toolkit2 2.5.0 does with a name its step 1 does not know
            sys.stdout.write(f"E hybrid_quantization_step2: Invalid operands name '{unknown[0]}' "
                             "in custom_quantize_layers\n")
            return -1
        self.model = onnx.load(Path(model_input).read_text())
        self.float16 = {k for k, v in custom.items() if v == "float16"}
        self._table(self.float16)
        return 0

    def init_runtime(self, **kwargs: Any) -> int:
        return 0

    def _run(self, arrays: list[np.ndarray]) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        assert self.model is not None
        names = [i.name for i in self.model.graph.input]
        feeds = dict(zip(names, arrays, strict=True))
        ref = ReferenceEvaluator(self.model)
        every = [o for n in self.model.graph.node for o in n.output]
        values = ref.run(every, feeds)
        tensors = dict(zip(every, values, strict=True))
        return [tensors[o.name] for o in self.model.graph.output], tensors

    def inference(self, inputs: list[np.ndarray], data_format: Any = None, **kwargs: Any) -> list[np.ndarray]:
        outputs, _ = self._run(inputs)
        return [simulate(o, GRID * 2.0 ** len(self.float16 or ())) for o in outputs]

    def accuracy_analysis(self, inputs: list[str], output_dir: str = "./snapshot", **kwargs: Any) -> int:
        assert self.model is not None
        _, tensors = self._run([np.load(p) for p in inputs])
        root = Path(output_dir)
        for sub in ("golden/npy", "simulator/npy"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        lines = ["layer_name   simulator_error", "         entire   single", "-" * 40]
        mapping = ["layer_name   file_name", "-" * 40]
        for node in self.model.graph.node:
            name = node.output[0]
            x, y = tensors[name].astype(np.float64), simulate(tensors[name]).astype(np.float64)
            cos = float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))
            euc = float(np.sqrt(((x - y) ** 2).sum()))
            lines.append(f"[{node.op_type}] {name}    {cos:.5f} | {euc:.5f}   {cos:.5f} | {euc:.5f}")
            mapping.append(f"{name}    {name}.txt")
            np.save(root / "golden" / "npy" / f"{name}.npy", tensors[name])
            np.save(root / "simulator" / "npy" / f"{name}.npy", simulate(tensors[name]))
        (root / "error_analysis.txt").write_text("\n".join(lines) + "\n")
        (root / "map_name_to_file.txt").write_text("\n".join(mapping) + "\n")
        return 0

    def release(self) -> None:
        os.environ.pop("FAKE_RKNN", None)
