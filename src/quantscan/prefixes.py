"""The prefix kit: first-N-kernel models for toolchains that cannot dump their layers.

Why: `quantscan dumps` places the first layer where a board departs from the int8 simulation, but it
needs per-layer dumps, and closed compilers (Hailo, Ascend/HiSilicon ATC, QNN on a phone, ...) often give
only the network's outputs. A model cut after kernel k has kernel k's output as its own output: compile
each prefix with the vendor's tool, run it on the board, and its output *is* the board's value of that
tensor. Gathered per sample, those outputs are the contract's npy dumps (one .npz per sample, keys =
tensor names of the original model), and `dumps --prefixes KIT` reads them so.

- `write_kit(model, out, every=K, calib=...)`: `prefix_NNN.onnx` for every K-th kernel (kernel
  boundaries are sites.py's, through `extract.Extractor`, on the model after the scan's cleanup rewrite:
  a cut inside a fused Conv+BN+activation would compile into another kernel than the full model's), each
  the ancestors of its end tensor with that tensor as its one output, the model's own inputs, names and
  opset; with --calib, the samples' inputs
  (`inputs/<sample>.npz`, what to feed every prefix) and the FP32 values of every end tensor
  (`fp32/<sample>.npz`: itself a valid npy dumps folder, the dumps of a board without error);
  `prefixes.json` says which prefix ends at which tensor and where the board's outputs go.
- `read_kit(folder)` and `board_dumps(kit, outputs)`: the board's outputs
  (`OUTPUTS/prefix_NNN/<sample>.npy`, or `.npz` keyed by the end tensor) as a `DumpSet`;
  `write_gathered` writes the same as an npy dumps folder.

A prefix re-calibrated on its own by the vendor sees the same tensors on the same samples as the full
model (min/max calibration gives the same ranges), so its output is what the full model's layer would be.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from quantscan import graph as qgraph
from quantscan.calib import load_calibration
from quantscan.calib.npyfile import npz_bytes
from quantscan.columns import Col
from quantscan.device.dumps import DumpSet
from quantscan.errors import UsageError
from quantscan.extract import Extractor
from quantscan.graph.infer import check_model
from quantscan.model import ModelArg, graph_inputs
from quantscan.readers.arrays import read_npy, read_npz
from quantscan.readers.jsonfile import read_json_object
from quantscan.runfolder import PRODUCER, atomic_write_bytes, atomic_write_text, json_text
from quantscan.runner import Runner

PREFIXES_JSON = "prefixes.json"
KIT_FORMAT = 1
DEFAULT_SAMPLES = 8
"""Samples whose inputs and FP32 outputs the kit carries by default: enough for `dumps`' pooled figures,
few enough to run every prefix on a board by hand."""


@dataclass(frozen=True)
class Prefix:
    """One prefix model: the first `kernels` kernels up to (and ending at) the kernel of `node`."""

    index: int
    """1-based position of its end kernel among the model's kernels, in graph order."""
    file: str
    node: str
    kernel: str
    tensor: str
    """The tensor it ends at: the kernel's output, named as in the original model (the dumps key)."""
    nodes: int

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "file": self.file, Col.NODE: self.node, Col.KERNEL: self.kernel,
                "tensor": self.tensor, "nodes": self.nodes}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Prefix:
        return cls(int(raw["index"]), str(raw["file"]), str(raw[Col.NODE]), str(raw.get(Col.KERNEL, "")),
                   str(raw["tensor"]), int(raw.get("nodes", 0)))

    @property
    def stem(self) -> str:
        return Path(self.file).stem


@dataclass
class PrefixKit:
    """What `prefixes.json` holds: the model, its kernels' prefixes and the samples the kit carries."""

    folder: Path
    model: str
    model_sha256: str
    inputs: list[str]
    kernels: int
    every: int
    prefixes: list[Prefix]
    samples: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": KIT_FORMAT,
            "tool": "quantscan",
            "model": self.model,
            "model_sha256": self.model_sha256,
            "inputs": self.inputs,
            "kernels": self.kernels,
            "every": self.every,
            "samples": self.samples,
            "prefixes": [p.to_json() for p in self.prefixes],
            "board_outputs": HOW_TO,
        }


HOW_TO = {
    "layout": "OUTPUTS/<prefix file stem>/<sample>.npy (the prefix's one output, as float), or .npz keyed by "
              "the prefix's tensor",
    "samples": "<sample> is a name from `samples` (the calibration file stems; inputs/<sample>.npz holds the "
               "inputs to feed, keyed by the model's input names)",
    "reference": "fp32/<sample>.npz: the FP32 value of every prefix's tensor (an npy dumps folder of a board "
                 "without error)",
    "compare": "quantscan dumps MODEL --calib CALIB --dumps OUTPUTS --format npy --prefixes KIT",
}
"""How a user turns the board's prefix outputs into dumps (written into prefixes.json)."""


# --- building ---------------------------------------------------------------------------------------------


def kernel_ends(model: ModelArg, every: int = 1, **data: Any) -> tuple[Extractor, list[tuple[int, str, str, str]]]:
    """(extractor, [(1-based kernel index, first node, pattern, output tensor)]) of every `every`-th kernel
    and the last one, in graph order; a kernel whose output is not a float tensor is no dump and is skipped."""
    from quantscan.compare import load_side

    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise UsageError(f"--every: expected a positive integer, found {every!r}")
    _, proto, inputs = load_side(model)
    ex = Extractor(proto, inputs, **data)
    kernels = sorted(ex.kernels(), key=lambda k: max(k[0]))
    ends = []
    for position, (members, pattern) in enumerate(kernels, start=1):
        last = ex.nodes[max(members)]
        tensor = next((o for o in last.output if o), "")
        if tensor and (position % every == 0 or position == len(kernels)):
            ends.append((position, ex.nodes[min(members)].name, pattern, tensor))
    return ex, ends


def cleaned(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model after the scan's own cleanup (Identity/Dropout removed, constants folded), which is what
    its sites and `dumps` see: an Identity between a Conv+Add and its HardSigmoid would otherwise end a
    kernel early, at a tensor no dumps site has. Values are the same; the prefixes are cut from this copy."""
    from quantscan.rewrites.cleanup import cleanup

    return cleanup(proto).model


def prefix_model(ex: Extractor, tensor: str) -> tuple[onnx.ModelProto, int]:
    """The ancestors of `tensor` as a model whose one output is `tensor` (checked), and its node count.
    Graph inputs keep the original declarations (names, dims, dynamic axes): a prefix takes the same feeds."""
    kept = ex.ancestors(tensor)
    reads = {r for i in kept for r in ex.reads[i]}
    graph = helper.make_graph(
        [ex.nodes[i] for i in kept], f"{ex.proto.graph.name or 'graph'}_prefix",
        [vi for vi in ex.proto.graph.input if vi.name in reads and vi.name not in ex.inits],
        ex.typed([tensor]),
        initializer=[ex.inits[n] for n in ex.inits if n in reads],
    )
    out = helper.make_model(graph, opset_imports=list(ex.proto.opset_import), producer_name=PRODUCER)
    out.ir_version = ex.proto.ir_version
    out.functions.extend(ex.proto.functions)
    check_model(out, full_check=True)
    return out, len(kept)


def write_kit(
    model: str | Path,
    out: str | Path,
    *,
    every: int = 1,
    calib: str | Path | None = None,
    samples: int = DEFAULT_SAMPLES,
    consts: Mapping[str, float] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    runner: Runner | None = None,
) -> PrefixKit:
    """Write the kit into `out` (module docstring); every file atomically. Returns what prefixes.json says."""
    from quantscan.model import load_model

    loaded = load_model(model)
    ex, ends = kernel_ends(cleaned(loaded.proto), every, calib=calib, consts=consts, input_shapes=input_shapes,
                           seed=seed, runner=runner)
    ex.typed([tensor for *_, tensor in ends])  # an untypable end is refused before any file is written
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    width = max(3, len(str(ends[-1][0]))) if ends else 3
    prefixes = []
    for position, node, pattern, tensor in ends:
        proto, count = prefix_model(ex, tensor)
        name = f"prefix_{position:0{width}d}.onnx"
        atomic_write_bytes(folder / name, proto.SerializeToString())
        prefixes.append(Prefix(position, name, node, pattern, tensor, count))
    kit = PrefixKit(folder, str(loaded.path), loaded.sha256, [s.name for s in loaded.inputs], len(ex.kernels()),
                    every, prefixes)
    if calib is not None:
        kit.samples = _write_samples(loaded.proto, calib, folder, [p.tensor for p in prefixes], samples, consts,
                                     runner)
    atomic_write_text(folder / PREFIXES_JSON, json_text(kit.to_json(), indent=1))
    return kit


def _write_samples(proto: onnx.ModelProto, calib: str | Path, folder: Path, tensors: list[str], count: int,
                   consts: Mapping[str, float] | None, runner: Runner | None) -> list[str]:
    """inputs/<sample>.npz and fp32/<sample>.npz for the first `count` calibration samples; their names."""
    if count <= 0:
        raise UsageError(f"--samples: expected a positive number, found {count}")
    cset = load_calibration(calib, graph_inputs(proto), consts=consts, limit=count)
    names = sample_names(cset)
    session = (runner or Runner()).session(qgraph.expose(proto, tensors))
    for name, feeds in zip(names, cset.samples(), strict=False):
        values = session.run(feeds, tensors)
        atomic_write_bytes(folder / "inputs" / f"{name}.npz", npz_bytes(dict(feeds)))
        atomic_write_bytes(folder / "fp32" / f"{name}.npz", npz_bytes({t: values[t] for t in tensors}))
    return names


def sample_names(cset: Any) -> list[str]:
    """The dumps' sample keys: calibration file stems when each file is one sample, else 000, 001, ..."""
    if len(cset.files) == cset.n_samples:
        return [Path(f).stem for f in cset.files]
    return [f"{i:03d}" for i in range(cset.n_samples)]


# --- reading the board's outputs --------------------------------------------------------------------------


def read_kit(folder: str | Path) -> PrefixKit:
    """prefixes.json of a kit folder; anything else is bad input."""
    path = Path(folder) / PREFIXES_JSON
    try:
        raw = read_json_object(path, "--prefixes")
        return PrefixKit(Path(folder), str(raw["model"]), str(raw["model_sha256"]), list(raw.get("inputs", [])),
                         int(raw.get("kernels", 0)), int(raw.get("every", 1)),
                         [Prefix.from_json(p) for p in raw["prefixes"]], list(raw.get("samples", [])))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--prefixes: expected a kit folder written by `quantscan extract --prefixes` "
                         f"({PREFIXES_JSON} inside), found {path} unreadable ({exc})") from exc


def _output_files(kit: PrefixKit, outputs: Path) -> dict[str, dict[str, Path]]:
    """prefix file stem -> {sample: file} found under `outputs`."""
    found: dict[str, dict[str, Path]] = {}
    for prefix in kit.prefixes:
        sub = outputs / prefix.stem
        files = sorted([*sub.glob("*.npy"), *sub.glob("*.npz")]) if sub.is_dir() else []
        found[prefix.stem] = {f.stem: f for f in files}
    return found


def board_dumps(kit: PrefixKit, outputs: str | Path) -> DumpSet:
    """The board's prefix outputs as npy-format dumps: sample -> {end tensor: value}.

    A sample is one that at least one prefix output holds; a prefix without output for it is simply not
    dumped there (the first sample decides which tensors are compared, as for any dumps). No output at
    all is bad input, naming the layout expected."""
    folder = Path(outputs)
    if not folder.is_dir():
        raise UsageError(f"--dumps: expected the folder of the board's prefix outputs, found "
                         f"{'a file' if folder.exists() else 'nothing'} at {folder}")
    files = _output_files(kit, folder)
    samples = sorted({s for per in files.values() for s in per})
    if not samples:
        first = kit.prefixes[0].stem if kit.prefixes else "prefix_001"
        raise UsageError(f"--dumps: expected prefix outputs as {folder}/{first}/<sample>.npy (one folder per "
                         f"prefix of {kit.folder / PREFIXES_JSON}), found none")

    def load(i: int) -> dict[str, np.ndarray]:
        out = {}
        for prefix in kit.prefixes:
            path = files[prefix.stem].get(samples[i])
            if path is not None:
                out[prefix.tensor] = _read_output(path, prefix)
        return out

    return DumpSet("npy", folder, samples, load)


def _read_output(path: Path, prefix: Prefix) -> np.ndarray:
    """One prefix output file as float32: a .npy, or the prefix's tensor (or only array) of a .npz."""
    if path.suffix == ".npy":
        array = read_npy(path, "--dumps")
    else:
        data = read_npz(path, "--dumps")
        only = next(iter(data)) if len(data) == 1 else None
        key = prefix.tensor if prefix.tensor in data else only
        if key is None:
            raise UsageError(f"--dumps: expected '{prefix.tensor}' (or one array) in {path}, found "
                             f"{', '.join(list(data)[:4])}")
        array = data[key]
    if array.dtype.kind not in "fiub":
        raise UsageError(f"--dumps: expected numeric values in {path}, found {array.dtype}")
    return array.astype(np.float32, copy=False)


def write_gathered(kit: PrefixKit, outputs: str | Path, dest: str | Path) -> Path:
    """The board's prefix outputs as an npy dumps folder (`dest/<sample>.npz`), for tools that read that."""
    dumps = board_dumps(kit, outputs)
    target = Path(dest)
    for i, key in enumerate(dumps.keys):
        atomic_write_bytes(target / f"{key}.npz", npz_bytes(dumps.load(i)))
    return target
