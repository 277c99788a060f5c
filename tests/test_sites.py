"""sites: where a chip quantizes, on hand-built graphs (no runtime needed)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
from onnx import numpy_helper

from quantscan.sites import DEFAULT_FUSED_ACTIVATIONS, PARAMETER_INPUTS, Site, find_sites


def parse(text: str, inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    for i, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type}_{i}"
    for name, value in (inits or {}).items():
        model.graph.initializer.append(numpy_helper.from_array(value, name))
    return model


def sites_of(
    model: onnx.ModelProto, *, folded: tuple[str, ...] = (), fused: frozenset[str] = DEFAULT_FUSED_ACTIVATIONS
) -> list[Site]:
    tensors = {i.name for i in model.graph.input} | {o for n in model.graph.node for o in n.output}
    return find_sites(model, float_tensors=tensors, original_order={}, bn_folded_into=folded, fused_activations=fused)


CONV = {"w": np.ones((4, 3, 3, 3), np.float32), "b": np.zeros(4, np.float32)}


def conv_model(body: str, out: str = "float[1,4,8,8] y", extra: str = "") -> onnx.ModelProto:
    return parse(
        f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,8,8] x{extra}) => ({out}) {{
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            {body}
        }}""",
        CONV,
    )


def test_conv_bn_relu_is_one_site_with_the_relu_output() -> None:
    # the prepared graph has the BN folded into the Conv already; bn_folded_into says so
    model = conv_model("y = Relu (c)")
    (site,) = sites_of(model, folded=("Conv_0",))
    assert site.kernel == "Conv+BatchNormalization+Relu"
    assert site.output == "y" and site.inputs == ["x"]
    assert (site.weight, site.weight_axis, site.bias) == ("w", 0, "b")
    assert site.conv_like and site.fused


def test_reshape_passes_through_and_is_not_a_site() -> None:
    model = conv_model("r = Reshape (c, shape)\n y = Relu (r)", out="float[1,256] y")
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 256], np.int64), "shape"))
    sites = sites_of(model)
    assert [s.op_type for s in sites] == ["Conv", "Relu"]
    assert sites[0].output == "c" and sites[1].inputs == ["r"]


def test_resize_scales_and_clip_bounds_are_never_quantized() -> None:
    assert {2} <= PARAMETER_INPUTS["Resize"] and {1, 2} <= PARAMETER_INPUTS["Clip"]
    model = parse(
        """<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,8,8] x, float[4] scales, float lo, float hi) => (float[1,3,16,16] y) {
            n = Neg (x)
            r = Resize <mode = "nearest"> (n, , scales)
            m = Abs (r)
            y = Clip (m, lo, hi)
        }"""
    )
    sites = {s.op_type: s for s in sites_of(model)}
    assert sites["Resize"].inputs == ["n"]
    assert sites["Abs"].kernel == "Abs+Clip" and sites["Abs"].inputs == ["r"]  # lo/hi are parameters


def test_decomposed_layernorm_is_one_kernel() -> None:
    gamma = np.ones(16, np.float32)
    model = parse(
        """<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,8,16] x) => (float[2,8,16] y) {
            t = Neg (x)
            m = ReduceMean <axes = [-1]> (t)
            d = Sub (t, m)
            p = Pow (d, two)
            v = ReduceMean <axes = [-1]> (p)
            ve = Add (v, eps)
            s = Sqrt (ve)
            n = Div (d, s)
            sc = Mul (n, gamma)
            y = Add (sc, beta)
        }""",
        {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32), "gamma": gamma, "beta": gamma * 0},
    )
    neg, ln = sites_of(model)
    assert neg.op_type == "Neg"
    assert ln.kernel == "LayerNorm[ReduceMean+Sub+Pow+ReduceMean+Add+Sqrt+Div+Mul+Add]"
    assert ln.inputs == ["t"] and ln.output == "y" and ln.sensitive


def test_the_profile_fused_activation_list_is_honoured() -> None:
    model = conv_model("y = LeakyRelu (c)")
    assert [s.kernel for s in sites_of(model)] == ["Conv+LeakyRelu"]
    assert [s.kernel for s in sites_of(model, fused=frozenset({"Relu"}))] == ["Conv", "LeakyRelu"]


def test_decomposed_hardswish_fuses_only_when_the_profile_lists_it() -> None:
    model = conv_model("a = Add (c, three)\n k = Clip (a, zero, six)\n m = Mul (c, k)\n y = Div (m, six)")
    for name, value in (("three", 3.0), ("zero", 0.0), ("six", 6.0)):
        model.graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), name))
    (site,) = sites_of(model)
    assert site.kernel == "Conv+HardSwish[Add+Clip+Mul+Div]" and site.output == "y"
    without = sites_of(model, fused=frozenset({"Relu"}))
    assert [s.kernel for s in without] == ["Conv", "HardSwish[Add+Clip+Mul+Div]"]


def test_initializers_listed_as_inputs_still_count_as_weights() -> None:
    # keep_initializers_as_inputs exports (IR >= 4) list every initializer as a graph input too
    model = conv_model(
        "a = Add (c, three)\n k = Clip (a, zero, six)\n m = Mul (c, k)\n y = Div (m, six)",
        extra=", float three, float zero, float six, float[4,3,3,3] w, float[4] b",
    )
    for name, value in (("three", 3.0), ("zero", 0.0), ("six", 6.0)):
        model.graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), name))
    (site,) = sites_of(model)
    assert site.kernel == "Conv+HardSwish[Add+Clip+Mul+Div]"
    assert (site.weight, site.inputs) == ("w", ["x"])


# --- the model inputs as sites (issue 26) ---------------------------------------------------------------

FOCUS = """<ir_version: 8, opset_import: ["" : 13]>
    g (float[1,3,8,8] x, float[1,3,4,4] other) => (float[1,4,4,4] y, float[1,4,4,4] z) {
        s0 = Slice (x, st0, en, ax, two)
        s1 = Slice (x, st1, en, ax, two)
        c = Concat <axis = 1> (s0, s1)
        y = Conv (c, w)
        m = Concat <axis = 1> (s0, other)
        z = Conv (m, w)
    }"""


def test_an_input_reaching_its_kernel_through_moves_is_one_site_sharing_them() -> None:
    """YOLOX's Focus in small: a Concat of the input's own Slices carries the input (the Conv reads the
    input's values, moved); a Concat with another tensor computes a new scale and does not."""
    from quantscan.sites import INPUT_OP, input_sites

    inits = {"st0": np.array([0, 0], np.int64), "st1": np.array([1, 1], np.int64),
             "en": np.array([8, 8], np.int64), "ax": np.array([2, 3], np.int64), "two": np.array([2, 2], np.int64),
             "w": np.ones((4, 6, 1, 1), np.float32)}
    model = parse(FOCUS, inits)
    kernels = sites_of(model)
    (site,) = input_sites(model, kernels)
    assert (site.node, site.op_type, site.output, site.nodes) == ("x", INPUT_OP, "x", [])
    assert site.shares == ["c"] and site.is_input
    assert input_sites(model, kernels, fixed=["x"]) == []  # a --const or --state input is no site
    assert [s.node for s in input_sites(model, [k for k in kernels if "c" not in k.inputs])] == []
