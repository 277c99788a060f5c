"""A seeded protobuf-level mutator and a crash-proof CLI driver, shared by tests/test_fuzz.py and benchmarks/fuzz.py.

Why our own mutator (not hypothesis): the interesting inputs are *almost valid* ONNX models, one
structural slip away from a real one (a deleted node, a rewired input, an attribute out of range, a
broken initializer, an odd element type or dim, another opset, truncated bytes). Mutating real
models at the protobuf level reaches those directly and reproducibly from one integer seed.

Why a worker process: a mutant can segfault onnx or onnxruntime, which would take pytest down; a
fresh process per run costs seconds of imports. One worker runs many mutants in-process through
`quantscan.cli.dispatch` with fds 1 and 2 redirected to a file (so onnxruntime's native log lines are
caught too), and the driver restarts it when it dies or hangs, recording a crash.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ODD_INTS = (-(2**63), -(2**31), -(2**31) + 1, -1000, -5, -1, 0, 1, 2, 3, 7, 1000, 2**31 - 1, 2**31, 2**63 - 1)
ODD_ELEM_TYPES = (0, 2, 3, 5, 6, 7, 9, 10, 11, 16, 17, 21, 23, 999)
ODD_DIMS = (0, 1, 2, 3, 7, 1000, 2**31, 2**40)
OPSETS = (1, 6, 7, 9, 11, 13, 17, 19, 21, 22, 99)


@dataclass
class Seed:
    """One model to mutate, with a calibration folder for `scan`."""

    name: str
    model: Path
    calib: Path


def _pick_node(model: onnx.ModelProto, rng: random.Random) -> onnx.NodeProto | None:
    nodes = model.graph.node
    return nodes[rng.randrange(len(nodes))] if len(nodes) else None


def _tensor_names(model: onnx.ModelProto) -> list[str]:
    g = model.graph
    names = [i.name for i in g.input] + [t.name for t in g.initializer]
    return names + [o for n in g.node for o in n.output if o]


def delete_node(model: onnx.ModelProto, rng: random.Random) -> str:
    if len(model.graph.node) < 2:
        return "delete_node(skip)"
    del model.graph.node[rng.randrange(len(model.graph.node))]
    return "delete_node"


def dup_node(model: onnx.ModelProto, rng: random.Random) -> str:
    node = _pick_node(model, rng)
    if node is None:
        return "dup_node(skip)"
    model.graph.node.insert(rng.randrange(len(model.graph.node) + 1), copy.deepcopy(node))
    return "dup_node"


def rewire(model: onnx.ModelProto, rng: random.Random) -> str:
    """Point one input at another tensor, or a later node's output (a cycle), or a name nobody makes."""
    node = _pick_node(model, rng)
    if node is None or not node.input:
        return "rewire(skip)"
    k = rng.randrange(len(node.input))
    choice = rng.random()
    if choice < 0.15:
        node.input[k] = "no_such_tensor"
    elif choice < 0.3 and node.output:
        node.input[k] = node.output[0]  # a self-loop
    else:
        node.input[k] = rng.choice(_tensor_names(model))
    return "rewire"


def attribute(model: onnx.ModelProto, rng: random.Random) -> str:
    """An integer attribute to an out-of-range value, a float to NaN/huge, or a float attr retyped."""
    candidates = [(n, a) for n in model.graph.node for a in n.attribute
                  if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS, onnx.AttributeProto.FLOAT)]
    if not candidates:
        node = _pick_node(model, rng)
        if node is None:
            return "attribute(skip)"
        node.attribute.append(onnx.helper.make_attribute(rng.choice(["axis", "alpha", "bogus"]), rng.choice(ODD_INTS)))
        return "attribute(add)"
    _node, attr = rng.choice(candidates)
    if attr.type == onnx.AttributeProto.INT:
        attr.i = rng.choice(ODD_INTS)
    elif attr.type == onnx.AttributeProto.INTS:
        if attr.ints and rng.random() < 0.8:
            attr.ints[rng.randrange(len(attr.ints))] = rng.choice(ODD_INTS)
        else:
            del attr.ints[:]
    else:
        attr.f = rng.choice([float("nan"), float("inf"), -1e30, 0.0, -1.0])
    return "attribute"


def initializer(model: onnx.ModelProto, rng: random.Random) -> str:
    """Truncate raw data, change dims or element type, or fill with NaN."""
    inits = model.graph.initializer
    if not len(inits):
        return "initializer(skip)"
    t = inits[rng.randrange(len(inits))]
    choice = rng.random()
    if choice < 0.25 and t.raw_data:
        t.raw_data = t.raw_data[: rng.randrange(len(t.raw_data))]
        return "initializer(truncate)"
    if choice < 0.5 and t.dims:
        t.dims[rng.randrange(len(t.dims))] = rng.choice(ODD_DIMS)
        return "initializer(dims)"
    if choice < 0.7:
        t.data_type = rng.choice(ODD_ELEM_TYPES)
        return "initializer(dtype)"
    if t.data_type == onnx.TensorProto.FLOAT:
        try:
            arr = numpy_helper.to_array(t).copy()
        except Exception:
            return "initializer(skip)"
        if arr.size:
            arr.flat[rng.randrange(arr.size)] = rng.choice([np.nan, np.inf])
            t.CopyFrom(numpy_helper.from_array(arr, t.name))
            return "initializer(nan)"
    return "initializer(skip)"


def io_type(model: onnx.ModelProto, rng: random.Random) -> str:
    """An input or output to an odd element type, an odd dim, or no shape; or rank 0."""
    values = [*model.graph.input, *model.graph.output]
    if not values:
        return "io_type(skip)"
    vi = rng.choice(values)
    tt = vi.type.tensor_type
    choice = rng.random()
    if choice < 0.4:
        tt.elem_type = rng.choice(ODD_ELEM_TYPES)
        return "io_type(dtype)"
    if choice < 0.7 and len(tt.shape.dim):
        tt.shape.dim[rng.randrange(len(tt.shape.dim))].dim_value = rng.choice(ODD_DIMS)
        return "io_type(dim)"
    if choice < 0.85:
        del tt.shape.dim[:]
        return "io_type(rank0)"
    tt.ClearField("shape")
    return "io_type(noshape)"


NEGATIVE_DIMS = (-1, -1, -5, -(2**31), 0)


def negative_dim(model: onnx.ModelProto, rng: random.Random) -> str:
    """A declared dim (input, output or value_info) to -1 ("dynamic" in some exporters), another negative
    value or 0; half the time with the opset lowered below the analysis opset as well, so the version
    converter sees it (issue 42: onnx's C++ asserted on that path)."""
    values = [vi for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]
              if vi.type.HasField("tensor_type") and len(vi.type.tensor_type.shape.dim)]
    if not values:
        return "negative_dim(skip)"
    dims = rng.choice(values).type.tensor_type.shape.dim
    dims[rng.randrange(len(dims))].dim_value = rng.choice(NEGATIVE_DIMS)
    if rng.random() < 0.5:
        for imp in model.opset_import:
            if imp.domain in ("", "ai.onnx") and imp.version > 9:
                imp.version = rng.choice((9, 10, 11, 12))
                return "negative_dim+opset"
    return "negative_dim"


def opset(model: onnx.ModelProto, rng: random.Random) -> str:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = rng.choice(OPSETS)
            return "opset"
    return "opset(skip)"


def rename(model: onnx.ModelProto, rng: random.Random) -> str:
    """Duplicate or empty a tensor name (the bytes-level invalid UTF-8 case is `serialize`'s)."""
    node = _pick_node(model, rng)
    if node is None or not node.output:
        return "rename(skip)"
    node.output[0] = rng.choice(["", _tensor_names(model)[0], node.input[0] if node.input else "x"])
    return "rename"


MUTATIONS: tuple[Callable[[onnx.ModelProto, random.Random], str], ...] = (
    delete_node, dup_node, rewire, attribute, attribute, initializer, io_type, opset, rename,
)
MODEL_MUTATIONS = (*MUTATIONS, negative_dim)
"""`mutate(..., every_kind=True)`: also negative declared dims (after the round-3 seeds were fixed)."""


def mutate(data: bytes, seed: int, every_kind: bool = False) -> tuple[bytes, list[str]]:
    """One mutant of `data` from `seed`: 1-3 structural mutations, sometimes byte-level damage after.
    `every_kind` adds the mutations written after the CI seeds were chosen (so those seeds stay the same)."""
    rng = random.Random(seed)
    model = onnx.load_from_string(data)
    kinds = MODEL_MUTATIONS if every_kind else MUTATIONS
    done = [rng.choice(kinds)(model, rng) for _ in range(rng.choice((1, 1, 2, 3)))]
    out = model.SerializeToString()
    roll = rng.random()
    if roll < 0.08:
        out = out[: rng.randrange(1, len(out))]
        done.append("truncate")
    elif roll < 0.14:
        buf = bytearray(out)
        for _ in range(rng.randrange(1, 8)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        out = bytes(buf)
        done.append("flip_bytes")
    elif roll < 0.18 and model.graph.node and model.graph.node[0].name:
        name = model.graph.node[0].name.encode()
        out = out.replace(name, b"\xff" + name[1:], 1)
        done.append("bad_utf8")
    elif every_kind and roll < 0.22:
        out, where = _bad_utf8_text(model, rng)
        done.append(f"bad_utf8({where})")
    return out, done


def _bad_utf8_text(model: onnx.ModelProto, rng: random.Random) -> tuple[bytes, str]:
    """The graph name, a doc string or the producer name as bytes that are not UTF-8 (issue 42: only node and
    tensor names were checked)."""
    marker = "QSMARK"
    where = rng.choice(("graph.name", "graph.doc_string", "doc_string", "producer_name", "node.doc_string"))
    if where == "graph.name":
        model.graph.name = marker
    elif where == "graph.doc_string":
        model.graph.doc_string = marker
    elif where == "doc_string":
        model.doc_string = marker
    elif where == "producer_name":
        model.producer_name = marker
    elif model.graph.node:
        model.graph.node[rng.randrange(len(model.graph.node))].doc_string = marker
    return model.SerializeToString().replace(marker.encode(), b"\xfe\xff" + marker.encode()[2:], 1), where


# --- the driver ----------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One command on one mutant."""

    command: str
    seed: int
    mutations: list[str]
    exit: int | None
    stderr: str
    crashed: bool = False
    timed_out: bool = False
    modified: bool = False

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.stderr

    @property
    def multi_line_2(self) -> bool:
        return self.exit == 2 and len(self.stderr.strip().splitlines()) != 1


@dataclass
class Tally:
    rows: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, o: Outcome) -> None:
        c = self.rows.setdefault(o.command, Counter())
        c["runs"] += 1
        c[f"exit {o.exit}" if o.exit is not None else "none"] += 1
        c["tracebacks"] += o.traceback
        c["multi-line exit 2"] += o.multi_line_2
        c["crashes"] += o.crashed
        c["timeouts"] += o.timed_out
        c["inputs modified"] += o.modified

    def table(self) -> str:
        cols = ["runs", "exit 0", "exit 1", "exit 2", "exit 3", "tracebacks", "multi-line exit 2", "crashes",
                "timeouts", "inputs modified"]
        lines = ["| command | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for cmd, c in self.rows.items():
            lines.append(f"| {cmd} | " + " | ".join(f"{c[k]:,}" for k in cols) + " |")
        return "\n".join(lines)


WORKER = r"""
import json, os, sys, tempfile
sys.setrecursionlimit(5000)
ctl = os.fdopen(os.dup(1), "w")
from quantscan.cli import main
for line in sys.stdin:
    job = json.loads(line)
    with open(job["log"], "w") as log, open(job["err"], "w") as err:
        sys.stdout.flush(); sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(log.fileno(), 1); os.dup2(err.fileno(), 2)
        try:
            code = main(job["argv"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException as exc:
            import traceback; traceback.print_exc(); code = -1
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(saved[0], 1); os.dup2(saved[1], 2); os.close(saved[0]); os.close(saved[1])
    ctl.write(json.dumps({"exit": code}) + "\n"); ctl.flush()
"""


class Driver:
    """Runs CLI argv lists in a long-lived worker; a dead or hung worker is a crash, then restarted."""

    def __init__(self, src: Path, workdir: Path, timeout: float = 120.0, memory_mb: int = 4096) -> None:
        self.src, self.workdir, self.timeout, self.memory_mb = src, workdir, timeout, memory_mb
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": str(self.src), "OMP_NUM_THREADS": "1"}
        limit = self.memory_mb * 1024 * 1024

        def cap() -> None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        return subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=env, preexec_fn=cap, cwd=self.workdir)

    def run(self, argv: Sequence[str]) -> tuple[int | None, str, bool, bool]:
        """(exit, stderr, crashed, timed_out)."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        err = self.workdir / "stderr.txt"
        job = {"argv": list(argv), "log": str(self.workdir / "stdout.txt"), "err": str(err)}
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        stderr = err.read_text(errors="replace") if err.exists() else ""
        if not line:
            timed_out = not ready
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return None, stderr, not timed_out, timed_out
        return int(json.loads(line)["exit"]), stderr, False, False

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def op_calib(op_dir: Path, dest: Path) -> Path:
    """An .npz calibration folder from an op fixture's test_data_set_0/input_*.pb (scan reads .npz)."""
    model = onnx.load(str(op_dir / "model.onnx"))
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    arrays = {}
    for k, name in enumerate(names):
        tensor = onnx.TensorProto()
        tensor.ParseFromString((op_dir / "test_data_set_0" / f"input_{k}.pb").read_bytes())
        arrays[name] = numpy_helper.to_array(tensor)
    dest.mkdir(parents=True, exist_ok=True)
    np.savez(dest / "data.npz", **arrays)
    return dest


def seeds(assets: Path, workdir: Path, models: Sequence[str] = ()) -> list[Seed]:
    """Every op fixture (with an .npz calibration built from its test data) and the named asset models."""
    found = []
    for op_dir in sorted((assets / "ops").iterdir()):
        if (op_dir / "model.onnx").is_file():
            try:
                calib = op_calib(op_dir, workdir / "calib" / op_dir.name)
            except Exception:
                continue
            found.append(Seed(f"ops/{op_dir.name}", op_dir / "model.onnx", calib))
    for name in models:
        found.append(Seed(name, assets / "models" / f"{name}.onnx", assets / "calib" / name))
    return found


COMMANDS = ("check", "scan", "bisect", "rewrite", "extract", "compare", "calib-advice")
"""Every command that reads a model (`fuzz(commands=...)`); the CI test runs check and scan."""


def command_argv(command: str, model: Path, calib: Path, out: Path, node: str) -> list[str]:
    """One quick run of `command` on a mutant: one calibration sample, no report, nothing left behind."""
    data = ["--calib", str(calib), "--limit", "1"]
    argv = {
        "check": ["--profile", "generic-npu", "--out", str(out)],
        "scan": [*data, "--out", str(out), "--no-report", "--quiet"],
        "bisect": [*data, "--holdout", "none", "--target-cosine", "0.999", "--out", str(out), "--quiet"],
        "rewrite": ["--fold-bn", "--opset", "13", *data, "-o", str(out / "rewritten.onnx"), "--out", str(out)],
        "extract": ["--node", node, "--calib", str(calib), "--samples", "1", "-o", str(out / "cut.onnx"),
                    "--out", str(out), "--quiet"],
        "compare": [str(model), *data, "--out", str(out)],
        "calib-advice": [*data, "--out", str(out), "--quiet"],
    }[command]
    return [command, str(model), *argv]


def fuzz(seed_models: Sequence[Seed], n: int, driver: Driver, workdir: Path, first_seed: int = 0,
         commands: Sequence[str] = ("check", "scan"), every_kind: bool = False) -> Iterator[Outcome]:
    """`n` mutants, round-robin over the seed models, each through every command."""
    for k in range(n):
        seed = first_seed + k
        base = seed_models[k % len(seed_models)]
        data, done = mutate(base.model.read_bytes(), seed, every_kind)
        path = workdir / f"mutant_{seed}.onnx"
        path.write_bytes(data)
        before = sha256(path)
        node = _first_node_name(base.model)
        for command in commands:
            out = Path(tempfile.mkdtemp(dir=workdir, prefix="out_"))
            argv = command_argv(command, path, base.calib, out, node)
            code, stderr, crashed, timed_out = driver.run(argv)
            yield Outcome(command, seed, [base.name, *done], code, stderr, crashed, timed_out,
                          modified=sha256(path) != before)
            shutil.rmtree(out, ignore_errors=True)
        path.unlink()


def _first_node_name(path: Path) -> str:
    """A node `extract --node` can cut at in the unmutated model (its first named node's output otherwise)."""
    model = onnx.load(str(path), load_external_data=False)
    named = [n.name for n in model.graph.node if n.name]
    return named[len(named) // 2] if named else model.graph.node[0].output[0]
