"""Mixed bit widths per site (bisect/menu.py, menu_run.py, `bisect --menu`).

Oracles: the byte counts and the Pareto rule written out; a brute-force front; and, end to end, every
front point's figure recomputed from the FP32 model with each site's weights on the written-out grid of
its precision (int4 groups with the largest magnitude on -8, int8/int16 absmax per output column), run
by onnxruntime, pooled cosine written out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from tests.bisect.test_weight_exports import _int4_groups_written_out, _pooled_cosine

from builders import write_chain
from quantscan.bisect import menu as mn
from quantscan.graph.mixed import W4, W8
from quantscan.schemes import ChipSchemes, parse_scheme


def test_weight_bytes_are_the_written_out_counts() -> None:
    """A [384, 96] MatMul weight (output axis 1): int4 in groups of 128 = 384*96/2 + 4 * 3*96 scales."""
    assert mn.weight_bytes([384, 96], 1, "int4", 128) == 384 * 96 // 2 + 4 * 3 * 96
    assert mn.weight_bytes([384, 96], 1, "int4", None) == 384 * 96 // 2 + 4 * 96
    assert mn.weight_bytes([384, 96], 1, "int8", None) == 384 * 96 + 4 * 96
    assert mn.weight_bytes([384, 96], 1, "int16", None) == 2 * 384 * 96 + 4 * 96
    assert mn.weight_bytes([384, 96], 1, "float", None) == 2 * 384 * 96
    assert mn.weight_bytes([8, 3, 3, 3], 0, "int4", 2) == 8 * 27 // 2 + 4 * 8 * 2 * 3 * 3  # ceil(3/2) groups


def test_menus_follow_the_schemes_each_profile_lists() -> None:
    rk3588 = ChipSchemes(("w8a8", "w8a16"))
    llm = ChipSchemes(("w4a16", "w4a16-g32", "w4a16-g64", "w4a16-g128", "w8a8", "w8a8-g128"), a16="float")
    qnn = ChipSchemes(("w8a8", "w8a16", "w4a16-g64"))
    assert mn.site_menu(parse_scheme("w8a8"), rk3588).precisions == ("int8", "int16", "float")
    on_llm = mn.site_menu(parse_scheme("w4a16-g128", a16="float"), llm)
    assert on_llm.precisions == ("int4", "int8", "float") and on_llm.int4_group == 128
    assert on_llm.labels["int4"] == "int8" and on_llm.labels["int8"] == W8  # int4 is the scheme's own
    on_qnn = mn.site_menu(parse_scheme("w8a8"), qnn)
    assert on_qnn.precisions == ("int4", "int8", "int16", "float") and on_qnn.int4_group == 64
    assert on_qnn.labels["int4"] == W4 and on_qnn.labels["int8"] == "int8"
    assert mn.site_menu(parse_scheme("w8a8"), None).precisions == mn.PRECISIONS
    assert mn.site_menu(parse_scheme("w8a8"), qnn, int16_ok=False).precisions == ("int4", "int8", "float")


def _point(value: float, size: int, ms: float | None = None, tag: str = "") -> mn.MenuPoint:
    return mn.MenuPoint({"s": tag or f"{value}-{size}-{ms}"}, value, size, ms)


def test_front_is_the_brute_force_set_of_undominated_points() -> None:
    rng = np.random.default_rng(3)
    points = [_point(float(v), int(b), float(m)) for v, b, m in
              zip(rng.random(40).round(2), rng.integers(1, 20, 40), rng.random(40).round(1), strict=True)]
    front = mn.pareto_front(points)

    def beaten(p: mn.MenuPoint) -> bool:
        return any(q.value >= p.value and q.bytes <= p.bytes and q.est_ms <= p.est_ms  # type: ignore[operator]
                   and (q.value, q.bytes, q.est_ms) != (p.value, p.bytes, p.est_ms) for q in points)

    assert {id(p) for p in front} == {id(p) for p in points if not beaten(p)}
    assert [p.bytes for p in front] == sorted(p.bytes for p in front)


def test_greedy_takes_the_most_gain_per_byte_first_and_may_skip_a_level() -> None:
    """Site a: int8 +0.01 for 100 extra bytes; site b: int8 buys nothing, float +0.05 for 300 bytes: the
    walk moves b straight to float (ratio 1.7e-4) before a (1e-4), and a to float (no gain) last."""
    sizes = {("a", "int4"): 100, ("a", "int8"): 200, ("a", "float"): 400,
             ("b", "int4"): 100, ("b", "int8"): 200, ("b", "float"): 400}
    gain = {("a", "int4"): 0.0, ("a", "int8"): 0.01, ("a", "float"): 0.01,
            ("b", "int4"): 0.0, ("b", "int8"): 0.0, ("b", "float"): 0.05}
    steps = mn._greedy_steps(["a", "b"], ("int4", "int8", "float"), gain, lambda s, p: sizes[s, p])
    assert steps == [("b", "float"), ("a", "int8"), ("a", "float")]


def test_search_measures_the_ends_each_site_alone_and_every_move() -> None:
    """An additive model of 5 sites: levels + (levels - 1) x sites + moves evaluations, all-cheapest and
    all-widest on the front, every front point undominated among the measured."""
    sites = [f"s{i}" for i in range(5)]
    worth = {"int4": 0.0, "int8": 1.0, "float": 1.2}
    weight = {s: i + 1 for i, s in enumerate(sites)}

    def evaluate(a: mn.Assignment) -> float:
        return sum(worth[p] * weight[s] for s, p in a.items())

    def size(s: str, p: str) -> int:
        return {"int4": 1, "int8": 2, "float": 4}[p] * 10

    record = mn.menu_search(sites, ("int4", "int8", "float"), size, evaluate)
    moves = [p for p in record.points if p.how.startswith("step")]
    assert len(record.points) == 3 + 2 * 5 + len(moves) and len(moves) == 10
    front = mn.pareto_front(record.points)
    assert front[0].how == "all int4" and front[-1].how == "all float"
    assert not any(mn.dominates(q, p) for p in front for q in record.points)


def _bisect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quantscan", "bisect", *args, "--quiet"],
                          capture_output=True, text=True, timeout=900)


def _written_out(model: onnx.ModelProto, sites: dict[str, str], base: str, group: int | None) -> onnx.ModelProto:
    """The FP32 chain with each MatMul weight on its precision's grid (a site the assignment does not name:
    the scheme's own, `base`)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    for node in out.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits:
            continue
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        precision = sites.get(node.name, base)
        if precision == "int4":
            codes, scales = _int4_groups_written_out(w, group or w.shape[0])
            fq = codes.astype(np.float32) * np.repeat(scales, group or w.shape[0], axis=0)[:w.shape[0]]
        elif precision in ("int8", "int16"):
            top = 127 if precision == "int8" else 32767
            scale = (np.abs(w).max(axis=0) / top).astype(np.float32)
            fq = (np.clip(np.rint(w / scale), -top, top) * scale).astype(np.float32)
        else:
            fq = w
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(fq.astype(np.float32), node.input[1]))
    return out


@pytest.mark.parametrize(("scheme", "base", "group"), [("w4af-g16", "int4", 16), ("w8af", "int8", None)])
def test_every_front_point_equals_the_written_out_weights(tmp_path: Path, scheme: str, base: str,
                                                          group: int | None) -> None:
    """`bisect --menu` on the chain, no profile (menu int4/int8/int16/float): each front point's searched and
    held-out figures equal its written-out model; the chosen point's exported model gives its claim."""
    model_path, calib = write_chain(tmp_path, samples=8)
    out = tmp_path / "m"
    run = _bisect(str(model_path), "--calib", str(calib), "--out", str(out), "--scheme", scheme, "--menu",
                  "--target-cosine", "0.9995", "--export", "qdq-blocked")
    assert run.returncode in (0, 1), run.stderr
    menu = json.loads((out / "menu.json").read_text())
    assert menu["menu"]["precisions"] == ["int4", "int8", "int16", "float"]
    fp32 = onnx.load(model_path)
    x = np.load(calib / "x.npy")
    feeds = [{"x": x[i:i + 1]} for i in range(x.shape[0])]
    used = set()
    for point in menu["front"]:
        oracle = _written_out(fp32, point["sites"], base, group)
        assert point["value"] == pytest.approx(_pooled_cosine(fp32, oracle, feeds[0::2]), abs=1e-6)
        assert point["held_out_value"] == pytest.approx(_pooled_cosine(fp32, oracle, feeds[1::2]), abs=1e-6)
        used |= set(point["sites"].values())
    assert {"int4", "int8"} <= used  # the front mixes bit widths
    if menu["chosen"] is not None:  # the cheapest meeting the target searched; exit 0 when held out too
        assert menu["chosen"]["value"] >= 0.9995
        assert run.returncode == (0 if menu["chosen"]["held_out_value"] >= 0.9995 else 1) and menu["reached"] == (
            run.returncode == 0)
        exported = onnx.load(out / "menu_weights_qdq.onnx")
        assert _pooled_cosine(fp32, exported, feeds[1::2]) == pytest.approx(menu["chosen"]["held_out_value"],
                                                                             abs=1e-6)


def test_menu_refuses_an_export_it_does_not_write(tmp_path: Path) -> None:
    model_path, calib = write_chain(tmp_path, samples=4)
    run = _bisect(str(model_path), "--calib", str(calib), "--out", str(tmp_path / "m"), "--menu",
                  "--target-cosine", "0.99", "--export", "rknn")
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "--export with --menu: expected qdq-blocked or matmulnbits" in run.stderr


def test_ends_are_measured_even_for_one_site() -> None:
    record = mn.menu_search(["only"], ("int8", "float"), lambda s, p: 1 if p == "int8" else 2,
                            lambda a: 1.0 if a["only"] == "float" else 0.5)
    assert [p.how for p in record.points] == ["all int8", "all float", "only float alone", "step 1 of 1: only to float"]
    assert list(record.gains) == ["float"] and record.gains["float"]["only"] == 0.5


def _worst_cosine(fp32: onnx.ModelProto, other: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> float:
    """The headline without --state: the worst output's pooled cosine (every output counts)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    a, b = (ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            for m in (fp32, other))
    sums = np.zeros((len(a.get_outputs()), 3))
    for feed in feeds:
        for k, (x, y) in enumerate(zip(a.run(None, feed), b.run(None, feed), strict=True)):
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            sums[k] += [(x64 * y64).sum(), (x64 * x64).sum(), (y64 * y64).sum()]
    return float(min(s[0] / np.sqrt(s[1] * s[2]) for s in sums))


def test_menu_on_the_trained_char_lm_under_rk3588_llm(tmp_path: Path) -> None:
    """The decoder LM (17 MatMul weights) under rk3588-llm's menu (w4a16-g32 as the run's scheme; w8a8 offers
    int8; no int16: its a16 is fp16): int4/int8/float; every front point's figures equal its written-out
    weights, and the front's bytes run from all-int4 to all-float."""
    from tests.test_lm_task import LM, exporter

    from quantscan.calib import load_calibration
    from quantscan.model import graph_inputs, read_model_file

    ex = exporter()
    _, held = ex.corpus()
    calib = tmp_path / "steps"
    ex.write_steps(str(LM), ex.encode(held), calib, 1000, 8)
    out = tmp_path / "m"
    run = _bisect(str(LM), "--calib", str(calib), "--out", str(out), "--profile", "rk3588-llm", "--scheme",
                  "w4a16-g32", "--menu", "--target-cosine", "0.999", "--export", "matmulnbits")
    assert run.returncode in (0, 1), run.stderr
    menu = json.loads((out / "menu.json").read_text())
    assert menu["menu"]["precisions"] == ["int4", "int8", "float"] and menu["menu"]["int4_group_size"] == 32
    assert len(menu["weighted_sites"]) == 17
    fp32 = onnx.load(LM)
    feeds = list(load_calibration(calib, graph_inputs(read_model_file(LM))).samples())
    front = menu["front"]
    assert front[0]["counts"] == {"int4": 17, "int8": 0, "float": 0}
    assert front[-1]["counts"] == {"int4": 0, "int8": 0, "float": 17}
    for point in front:
        oracle = _written_out(fp32, point["sites"], "int4", 32)
        assert point["value"] == pytest.approx(_worst_cosine(fp32, oracle, feeds[0::2]), abs=1e-6)
        assert point["held_out_value"] == pytest.approx(_worst_cosine(fp32, oracle, feeds[1::2]), abs=1e-6)
    assert menu["chosen"]["value"] >= 0.999
    assert run.returncode == (0 if menu["chosen"]["held_out_value"] >= 0.999 else 1)
    cheaper = [p for p in front if p["weight_bytes"] < menu["chosen"]["weight_bytes"]]
    assert all(p["value"] < 0.999 for p in cheaper)
    exported = onnx.load(out / "menu_matmulnbits.onnx")
    assert any(n.op_type == "MatMulNBits" for n in exported.graph.node)
    assert _worst_cosine(fp32, exported, feeds[1::2]) == pytest.approx(menu["chosen"]["held_out_value"], abs=1e-6)
