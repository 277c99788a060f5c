"""--recover: the keep-only-if-better loop, its files, the never-worse guarantee, a real model.

Oracles: the scan's own all-int8 measurement re-run independently on the written model (the figure
recover reports must be the one `scan` would give), the runner's FP32 proof of the written model
against the input, and byte equality with the input when nothing is kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from builders import write_chain
from conftest import asset_calib, asset_model
from quantscan import recover as recover_module
from quantscan.calib import load_calibration
from quantscan.model import load_model
from quantscan.recover import int8_cosine, recover
from quantscan.rewrites.pipeline import prove


def test_chain_recovers_and_reports(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=16)
    out = tmp_path / "out.onnx"
    report = recover(model, calib, out=out)
    alone = [t.recipe for t in report.trials if len(t.recipe) == 1]
    assert alone == [("equalize",), ("smooth",), ("bias-correct",)]  # each pass tried on the input
    assert report.final >= report.baseline
    measured = [t.cosine_after for t in report.trials if t.applied and t.proof_passed]
    if report.kept:  # the best recipe measured, above the input by more than the noise floor
        assert report.final == max(measured) and report.final - report.baseline > report.noise
        assert [t.recipe for t in report.trials if t.kept] == [tuple(report.kept)]
    else:
        assert all(c <= report.baseline + max(report.noise, 1e-5) for c in measured)
    # the reported figure is what the scan's measurement gives on the written file
    written = load_model(out)
    assert int8_cosine(written, calib)[1] == pytest.approx(report.final, abs=1e-6)
    record = json.loads((tmp_path / "out.onnx.recover.json").read_text())
    assert record["kept"] == report.kept and len(record["trials"]) == len(report.trials)
    steps = json.loads((tmp_path / "out.onnx.rewrite.json").read_text())["steps"]
    assert [s["rewrite"] for s in steps] == report.kept  # what the case library reads as the recipe
    if "bias-correct" not in report.kept:  # exact passes only: the FP32 function is unchanged
        proof = prove(onnx.load(model), written.proto, calib=load_calibration(calib, written.inputs), tolerance=1e-5)
        assert proof.passed


def test_never_worse_returns_the_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pass measured worse than the input: nothing kept, the input written back unchanged."""
    model, calib = write_chain(tmp_path, samples=8)
    calls = iter([0.99, 0.99, 0.99] + [0.98 - 0.01 * k for k in range(7)])  # input, 2 ulp jitters, recipes
    monkeypatch.setattr(recover_module, "int8_cosine", lambda *a, **k: ("y", next(calls)))
    out = tmp_path / "same.onnx"
    report = recover(model, calib, out=out)
    assert report.kept == [] and report.final == 0.99 and report.noise == 0.0
    assert onnx.load(out).graph == onnx.load(model).graph


def test_refuses_its_own_input_as_output(tmp_path: Path) -> None:
    from quantscan.errors import UsageError

    model, calib = write_chain(tmp_path, samples=4)
    with pytest.raises(UsageError, match="other than the input"):
        recover(model, calib, out=model)


@pytest.mark.real
def test_mtcnn_pnet_never_worse(assets, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    report = recover(asset_model(assets, "mtcnn_pnet"), asset_calib(assets, "mtcnn_pnet"), profile="rk3588",
                     limit=8, out=tmp_path / "pnet.onnx")
    assert report.final >= report.baseline
    assert int8_cosine(load_model(tmp_path / "pnet.onnx"), asset_calib(assets, "mtcnn_pnet"), profile="rk3588",
                       limit=8)[1] == pytest.approx(report.final, abs=1e-6)


def test_case_library_records_the_recover_recipe(tmp_path: Path) -> None:
    import quantscan
    from quantscan.cases import recipe, save_case

    model, calib = write_chain(tmp_path, samples=8)
    out = tmp_path / "rec.onnx"
    report = recover(model, calib, profile="rk3588", out=out)
    run = tmp_path / "run"
    quantscan.scan(out, calib, profile="rk3588", gain_candidates=0, out=run, no_report=True)
    folder = save_case(run, "recovered chain", cases=tmp_path / "cases")
    case = json.loads((folder / "case.json").read_text())
    assert case["recipe"] == report.kept
    assert case["rewrites"][0]["recover"]["final_cosine"] == pytest.approx(report.final)
    assert recipe(case["id"], tmp_path / "cases")[0] == report.kept


def test_ulp_jitter_moves_every_weight_by_one_ulp(tmp_path: Path) -> None:
    import numpy as np
    from onnx import numpy_helper

    from quantscan.recover import ulp_jitter

    model = onnx.load(write_chain(tmp_path, samples=2)[0])
    jittered = ulp_jitter(model, 0)
    for a, b in zip(model.graph.initializer, jittered.graph.initializer, strict=True):
        x, y = numpy_helper.to_array(a), numpy_helper.to_array(b)
        steps = np.abs(x.view(np.int32).astype(np.int64) - y.view(np.int32).astype(np.int64))
        assert steps.max() == 1 and steps.min() >= 0  # every value one float32 step away (or zero crossing)
