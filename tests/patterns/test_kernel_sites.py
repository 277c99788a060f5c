"""Each decomposed-kernel spelling is one quantization site (CONTRACT.md "Quantization sites"): the site
reads only the kernel's data input and is quantized only at its output, whatever the exporter wrote
in between. Hand-built graphs (onnx.parser); `t = Neg(x)` first, so the kernel input is an inner tensor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

import quantscan
from quantscan.sites import Site, find_sites

CONSTS = """
    one = Constant <value = float {1.0}> ()
    half = Constant <value = float {0.5}> ()
    two = Constant <value = float {2.0}> ()
    three = Constant <value = float {3.0}> ()
    cubic = Constant <value = float {0.044715}> ()
    k = Constant <value = float {0.7978846}> ()
    eps = Constant <value = float {1e-5}> ()
    mhalf = Constant <value = float {-0.5}> ()
    ax = Constant <value = int64[1] {-1}> ()
"""
MEAN = ",".join(["0.0625"] * 16)


def ln_head(mean: str, var: str) -> str:
    """LayerNorm up to variance + eps (`ve`), with `d` = t - mean; `wm` is the 1/16 mean vector."""
    return f"""wm = Constant <value = float[16,1] {{{MEAN}}}> ()
    m = {mean}
    d = Sub (t, m)
    p = Mul (d, d)
    v = {var}
    ve = Add (v, eps)
"""


RM = "ReduceMean <axes = [-1]> (t)", "ReduceMean <axes = [-1]> (p)"

KERNELS = {
    # name: (body reading t and writing h, the kernel label)
    "gelu tanh, pow": (
        "c = Pow (t, three)\n kc = Mul (c, cubic)\n u = Add (t, kc)\n w = Mul (k, u)\n th = Tanh (w)\n"
        " a = Add (th, one)\n hx = Mul (t, half)\n h = Mul (hx, a)",
        "GELU[Mul+Pow+Mul+Add+Mul+Tanh+Add+Mul]",
    ),
    "gelu tanh, x·x·x": (
        "x2 = Mul (t, t)\n c = Mul (x2, t)\n kc = Mul (cubic, c)\n u = Add (kc, t)\n w = Mul (u, k)\n"
        " th = Tanh (w)\n a = Add (one, th)\n g = Mul (t, a)\n h = Mul (g, half)",
        "GELU[Mul+Mul+Mul+Add+Mul+Tanh+Add+Mul+Mul]",
    ),
    "gelu tanh, 0.5·x first": (
        "hx = Mul (half, t)\n c = Pow (t, three)\n kc = Mul (c, cubic)\n u = Add (t, kc)\n w = Mul (k, u)\n"
        " th = Tanh (w)\n a = Add (th, one)\n h = Mul (hx, a)",
        "GELU[Mul+Pow+Mul+Add+Mul+Tanh+Add+Mul]",
    ),
    "hardswish, x·hardsigmoid": (
        "s = HardSigmoid <alpha = 0.16666667, beta = 0.5> (t)\n h = Mul (t, s)",
        "HardSwish[HardSigmoid+Mul]",
    ),
    "softmax": ("e = Exp (t)\n s = ReduceSum (e, ax)\n h = Div (e, s)", "Softmax[Exp+ReduceSum+Div]"),
    "softmax, stable": (
        "mx = ReduceMax <axes = [-1]> (t)\n d = Sub (t, mx)\n e = Exp (d)\n s = ReduceSum (e, ax)\n"
        " h = Div (e, s)",
        "Softmax[ReduceMax+Sub+Exp+ReduceSum+Div]",
    ),
    "layernorm, matmul mean, sqrt+reciprocal": (
        ln_head("MatMul (t, wm)", "MatMul (p, wm)")
        + "s = Sqrt (ve)\n r = Reciprocal (s)\n h = Mul (d, r)",
        "LayerNorm[MatMul+Sub+Mul+MatMul+Add+Sqrt+Reciprocal+Mul]",
    ),
    "layernorm, pow -0.5": (
        ln_head(*RM)
        + "r = Pow (ve, mhalf)\n h = Mul (r, d)",
        "LayerNorm[ReduceMean+Sub+Mul+ReduceMean+Add+Pow+Mul]",
    ),
    "layernorm, div(1, sqrt)": (
        ln_head(*RM)
        + "s = Sqrt (ve)\n r = Div (one, s)\n h = Mul (d, r)",
        "LayerNorm[ReduceMean+Sub+Mul+ReduceMean+Add+Sqrt+Div+Mul]",
    ),
    "layernorm, sqrt then div": (
        ln_head(*RM)
        + "s = Sqrt (ve)\n h = Div (d, s)",
        "LayerNorm[ReduceMean+Sub+Mul+ReduceMean+Add+Sqrt+Div]",
    ),
}


def model_of(body: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(
        f"""<ir_version: 8, opset_import: ["" : 13]>
        g (float[N,4,16] x) => (float[N,4,16] y) {{
            {CONSTS}
            t = Neg (x)
            {body}
            y = Abs (h)
        }}"""
    )
    for i, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type}_{i}"
    onnx.checker.check_model(model, full_check=True)
    return model


def sites_of(model: onnx.ModelProto) -> list[Site]:
    tensors = {i.name for i in model.graph.input} | {
        o for n in model.graph.node if n.op_type != "Constant" for o in n.output
    }
    return find_sites(model, float_tensors=tensors, original_order={})


@pytest.mark.parametrize("name", sorted(k for k in KERNELS if not k.startswith("hardswish")))
def test_each_spelling_is_one_site_quantized_at_its_input_and_output(name: str) -> None:
    body, label = KERNELS[name]
    model = model_of(body)
    neg, kernel, absolute = sites_of(model)
    assert (neg.kernel, absolute.kernel) == ("Neg", "Abs")
    assert kernel.kernel == label and kernel.sensitive
    assert kernel.inputs == ["t"] and kernel.output == "h" and absolute.inputs == ["h"]
    assert kernel.node == next(n.name for n in model.graph.node if "t" in n.input)  # its first node


def test_hardsigmoid_hardswish_is_one_activation_its_producer_absorbs() -> None:
    """x·HardSigmoid(x) is a fused activation like a native HardSwish: the Neg before it absorbs it."""
    body, label = KERNELS["hardswish, x·hardsigmoid"]
    neg, absolute = sites_of(model_of(body))
    assert neg.kernel == f"Neg+{label}" and neg.inputs == ["x"] and neg.output == "h"
    assert absolute.inputs == ["h"]


def test_hardsigmoid_hardswish_fuses_into_its_conv() -> None:
    model = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[1,3,8,8] x) => (float[1,4,8,8] y) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            s = HardSigmoid <alpha = 0.16666667, beta = 0.5> (c)
            y = Mul (c, s)
        }"""
    )
    model.graph.initializer.extend([
        onnx.numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w"),
        onnx.numpy_helper.from_array(np.zeros(4, np.float32), "b"),
    ])
    for i, node in enumerate(model.graph.node):
        node.name = f"{node.op_type}_{i}"
    (site,) = sites_of(model)
    assert site.kernel == "Conv+HardSwish[HardSigmoid+Mul]" and site.output == "y" and site.inputs == ["x"]


def test_a_kernel_whose_intermediate_is_read_elsewhere_is_not_grouped() -> None:
    body, _ = KERNELS["softmax"]
    model = model_of(body.replace("h = Div (e, s)", "h0 = Div (e, s)\n h = Add (h0, e)"))
    assert all(not s.kernel.startswith("Softmax") for s in sites_of(model))


@pytest.mark.parametrize("name", ["gelu tanh, x·x·x", "softmax, stable", "layernorm, matmul mean, sqrt+reciprocal"])
def test_the_scan_puts_fake_quant_only_at_the_kernel_boundary(tmp_path: Path, name: str) -> None:
    """The saved QDQ model quantizes x, t (the kernel input), h (its output) and y: nothing inside."""
    model = model_of(KERNELS[name][0])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(0).normal(0, 2, (8, 4, 16)).astype(np.float32))
    result = quantscan.scan(path, calib)
    kernel = next(s for s in result.sites if s.kernel == KERNELS[name][1])
    assert kernel.inputs == ["t"] and kernel.output == "h"
    quantized = {n.input[0].removesuffix("__f32") for n in result.qdq_model.graph.node
                 if n.op_type == "QuantizeLinear"}  # the QDQ model renames the float tensor it quantizes
    assert quantized <= {"x", "t", "h", "y"} and {"t", "h"} <= quantized
    row = result.layers.set_index("node").loc[kernel.node]
    assert row["kernel"] == KERNELS[name][1] and row["isolated_cosine"] > 0.9
