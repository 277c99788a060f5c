"""Shared model builders and oracles for the tests (no tests here): ONNX-text models, the reference oracle.

The oracle is onnx.reference.ReferenceEvaluator on the *original* model: pure numpy kernels that are
independent from the rewrite code and from onnxruntime.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx.version_converter
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from quantscan.graph.index import GraphIndex


def build(text: str, initializers: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A model from ONNX text, with numpy initializers appended (the parser wants literal values)."""
    model = onnx.parser.parse_model(text)
    for name, value in (initializers or {}).items():
        model.graph.initializer.append(numpy_helper.from_array(value, name=name))
    onnx.checker.check_model(model, full_check=True)
    return model


class BatchNormalization(OpRun):
    """Inference-mode BN for every opset.

    onnx.reference's BatchNormalization_9 (opsets 9-13) switches to batch statistics whenever the
    `momentum` attribute is present, which Paddle exports always set: that is not what the spec (or any
    runtime) does for those opsets, so the oracle uses this kernel instead.
    """

    op_domain = ""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None, **_):  # type: ignore[no-untyped-def]
        if training_mode:
            raise NotImplementedError("training-mode BN is not an inference oracle")
        shape = (-1,) + (1,) * (x.ndim - 2)
        eps = 1e-5 if epsilon is None else epsilon
        y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape)
        return ((y + bias.reshape(shape)).astype(x.dtype),)


def write_model_and_samples(tmp_path: Path, model: onnx.ModelProto, x: np.ndarray) -> tuple[Path, Path]:
    """`model.onnx` and a calibration folder holding `x` as the graph input "x" (one .npy: N samples)."""
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", x)
    return path, calib


def evaluator(model: onnx.ModelProto) -> ReferenceEvaluator:
    return ReferenceEvaluator(model, new_ops=[BatchNormalization])


def tensor_range(model_path: Path, x: np.ndarray, tensor: str) -> tuple[float, float]:
    """min/max of one tensor over the samples `x` (fed as the graph input "x"), by onnx's reference kernels:
    the independent figure a calibrated range is checked against."""
    model = onnx.load(str(model_path))
    model.graph.output.append(onnx.helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None))
    values = evaluator(model).run([tensor], {"x": x})[0]
    return float(values.min()), float(values.max())


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(o) for o in evaluator(model).run(None, feeds)]


def assert_same_outputs(
    a: onnx.ModelProto, b: onnx.ModelProto, feeds: dict[str, np.ndarray], rel: float = 1e-4
) -> None:
    """Outputs equal within float32 rounding: max-abs ≤ rel × (output range, at least 1)."""
    assert [o.name for o in a.graph.output] == [o.name for o in b.graph.output]
    for x, y in zip(run(a, feeds), run(b, feeds), strict=True):
        assert x.shape == y.shape
        scale = max(float(np.ptp(x)) if x.size else 0.0, 1.0)
        np.testing.assert_allclose(y, x, atol=rel * scale, rtol=0)


def op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def rng_array(shape: tuple[int, ...], seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def calib_images(calib_dir: Path, limit: int = 4) -> list[np.ndarray]:
    """NCHW float32 tensors from an asset image folder, per its preprocess.json (images already sized)."""
    from PIL import Image

    spec = json.loads((calib_dir / "preprocess.json").read_text())
    out = []
    for name in spec["files"][:limit]:
        img = np.asarray(Image.open(calib_dir / name).convert("RGB"), dtype=np.float32)
        if spec.get("channel_order") == "BGR":
            img = img[..., ::-1]
        img = img * float(spec["scale"])
        img = (img - np.array(spec["mean"], np.float32)) / np.array(spec["std"], np.float32)
        out.append(np.ascontiguousarray(img.transpose(2, 0, 1)[None]).astype(np.float32))
    return out


WIDTH = 16
"""Width of the chain model: a MatMul+Add+Relu chain with one outlier channel (a per-tensor scale
then crushes the others), so sites differ clearly in how much keeping them float helps."""


def chain_model(layers: int = 10, seed: int = 0, outlier: int = 2) -> onnx.ModelProto:
    """x[N,16] -> (MatMul, Add bias, Relu) x layers -> MatMul -> y[N,10] (scores)."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev = "x"
    for i in range(layers):
        w = rng.normal(0, 1.5 / np.sqrt(WIDTH), (WIDTH, WIDTH)).astype(np.float32)
        b = rng.normal(0, 0.1, WIDTH).astype(np.float32)
        if i == outlier:
            b[0] = 30.0  # one channel far from the others: per-tensor int8 loses the small ones
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"], name=f"mm{i}"),
            helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"add{i}"], name=f"add{i}"),
            helper.make_node("Relu", [f"add{i}"], [f"h{i}"], name=f"relu{i}"),
        ]
        prev = f"h{i}"
    head = rng.normal(0, 1 / np.sqrt(WIDTH), (WIDTH, 10)).astype(np.float32)
    inits.append(numpy_helper.from_array(head, "whead"))
    nodes.append(helper.make_node("MatMul", [prev, "whead"], ["y"], name="head"))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def write_chain(tmp: Path, samples: int = 32, **kwargs: int) -> tuple[Path, Path]:
    """The chain model file and a calibration folder of `samples` rows for input x."""
    model_path = tmp / "chain.onnx"
    onnx.save(chain_model(**kwargs), model_path)
    calib = tmp / "calib"
    calib.mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    np.save(calib / "x.npy", rng.normal(0, 1, (samples, WIDTH)).astype(np.float32))
    return model_path, calib


FLOAT_MIN = float(np.finfo(np.float32).min)


def attention_model(masked_from: int = 5, tokens: int = 8, dim: int = 16, seed: int = 0) -> onnx.ModelProto:
    """A tiny attention block as exporters write it: MatMul scores, an Add of a float-min mask
    (key positions >= `masked_from` masked with -3.4e38), Softmax, MatMul with the values, a projection.

    Built with onnx.helper (the parser cannot spell -3.4e38 constants readably).
    """
    from onnx import helper

    rng = np.random.default_rng(seed)
    mask = np.zeros((1, 1, tokens), np.float32)
    mask[..., masked_from:] = FLOAT_MIN
    inits = {
        "wq": rng.normal(0, 1.0, (dim, dim)).astype(np.float32),
        "wk": rng.normal(0, 1.0, (dim, dim)).astype(np.float32),
        "wv": rng.normal(0, 1.0 / np.sqrt(dim), (dim, dim)).astype(np.float32),
        "wo": rng.normal(0, 1.0 / np.sqrt(dim), (dim, dim)).astype(np.float32),
        "inv_sqrt_d": np.array(1.0 / np.sqrt(dim), np.float32),
        "mask": mask,
    }
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Mul", ["s", "inv_sqrt_d"], ["s2"], name="scale"),
        helper.make_node("Add", ["s2", "mask"], ["a"], name="mask_add"),
        helper.make_node("Softmax", ["a"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
        helper.make_node("MatMul", ["p", "v"], ["o"], name="context"),
        helper.make_node("MatMul", ["o", "wo"], ["y"], name="out_proj"),
    ]
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", tokens, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", tokens, dim])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def pattern_index(
    body: str, *, consts: str = "", inputs: str = "float[4,16] x", output: str = "float[4,16] y", opset: int = 14
) -> GraphIndex:
    """The graph index of an ONNX-text `body` that computes `h`, read by a `y = Neg(h)` so that `h` is an
    inner tensor (what a kernel pattern sees in a real model), with `consts` (Constant nodes) first."""
    model = onnx.parser.parse_model(
        f"""<ir_version: 8, opset_import: ["" : {opset}]>
        g ({inputs}) => ({output}) {{
            {consts}
            {body}
            y = Neg (h)
        }}"""
    )
    return GraphIndex.of(model)


def if_wrapped(model: onnx.ModelProto, setting: str = "sr", value: int = 16000) -> onnx.ModelProto:
    """`model` behind an If on `setting == value`, as silero-vad's shipped model is built: the then
    branch is the model's graph, the else branch a copy whose first output is negated (so the branch
    taken is visible in the outputs). Branch tensors are prefixed `then/`, `else/`; initializers stay in
    the outer graph and both branches read them from there."""
    graph = model.graph
    outer = {i.name for i in graph.input} | {t.name for t in graph.initializer}

    def branch(prefix: str, negate: bool) -> onnx.GraphProto:
        def name(t: str) -> str:
            return t if not t or t in outer else f"{prefix}/{t}"

        nodes = []
        for n in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = f"{prefix}/{n.name}" if n.name else ""
            copy.input[:] = [name(t) for t in n.input]
            copy.output[:] = [name(t) for t in n.output]
            nodes.append(copy)
        outputs = []
        for k, o in enumerate(graph.output):
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(o)
            vi.name = name(o.name)
            if negate and k == 0:
                nodes.append(helper.make_node("Neg", [vi.name], [vi.name + "_neg"], name=f"{prefix}/neg"))
                vi.name += "_neg"
            outputs.append(vi)
        return helper.make_graph(nodes, prefix, [], outputs)

    nodes = [
        helper.make_node("Constant", [], ["setting_value"], value=numpy_helper.from_array(np.array(value, np.int64))),
        helper.make_node("Equal", [setting, "setting_value"], ["is_setting"]),
        helper.make_node("If", ["is_setting"], [o.name for o in graph.output], name="If_0",
                         then_branch=branch("then", False), else_branch=branch("else", True)),
    ]
    inputs = [*graph.input, helper.make_tensor_value_info(setting, TensorProto.INT64, [])]
    wrapped = helper.make_graph(nodes, "wrapped", inputs, list(graph.output), list(graph.initializer))
    out = helper.make_model(wrapped, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    onnx.checker.check_model(out)
    return out


VAD_HIDDEN = 4


def vad_like() -> onnx.ModelProto:
    """silero-vad's wheel pattern in small: If(sr == 16000) around the network; inside, Ifs whose
    conditions test sizes ("squeeze if dim == 1" on a tensor sized by x's batch and length, one on the
    state's shape) and an LSTM whose initial state comes from `state` [2, N, h]."""
    f = TensorProto.FLOAT
    h = VAD_HIDDEN

    def const(name: str, value: object) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(value, np.int64), name)

    squeeze_then = helper.make_graph([helper.make_node("Squeeze", ["xu", "ax2"], ["sq_t"])], "sq_then", [],
                                     [helper.make_tensor_value_info("sq_t", f, ["N", "T"])])
    squeeze_else = helper.make_graph([helper.make_node("Identity", ["xu"], ["sq_e"])], "sq_else", [],
                                     [helper.make_tensor_value_info("sq_e", f, ["N", "T", 1])])
    h0_then = helper.make_graph([helper.make_node("Slice", ["state", "z1", "o1", "z1"], ["h0_t"])], "h_then", [],
                                [helper.make_tensor_value_info("h0_t", f, [1, "N", h])])
    h0_else = helper.make_graph([helper.make_node("Slice", ["state", "o1", "t1", "z1"], ["h0_e"])], "h_else", [],
                                [helper.make_tensor_value_info("h0_e", f, [1, "N", h])])
    net = [
        helper.make_node("Unsqueeze", ["x", "ax2"], ["xu"]),                       # [N, T, 1]
        helper.make_node("Shape", ["xu"], ["xs"]),
        helper.make_node("Gather", ["xs", "m1"], ["last"], axis=0),
        helper.make_node("Equal", ["last", "one"], ["is1"]),
        helper.make_node("If", ["is1"], ["xq"], name="If_squeeze", then_branch=squeeze_then,
                         else_branch=squeeze_else),
        helper.make_node("Unsqueeze", ["xq", "ax2"], ["xq3"]),                     # [N, T, 1] again
        helper.make_node("Transpose", ["xq3"], ["seq"], perm=[1, 0, 2]),           # [T, N, 1]
        helper.make_node("Shape", ["state"], ["ss"]),
        helper.make_node("Gather", ["ss", "zero"], ["layers"], axis=0),
        helper.make_node("Equal", ["layers", "two"], ["is2"]),
        helper.make_node("If", ["is2"], ["h0"], name="If_state", then_branch=h0_then, else_branch=h0_else),
        helper.make_node("LSTM", ["seq", "W", "R", "", "", "h0"], ["", "hn"], name="LSTM_0", hidden_size=h),
        helper.make_node("Squeeze", ["hn", "z1"], ["out"]),                        # [N, h]
    ]
    then = helper.make_graph(net, "then", [], [helper.make_tensor_value_info("out", f, ["N", h])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["neg"]), helper.make_node("ReduceMean", ["neg"], ["o8"],
                               axes=[1], keepdims=1), helper.make_node("Expand", ["o8", "shape_nh"], ["out8"])],
                              "else", [], [helper.make_tensor_value_info("out8", f, ["N", h])])
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(1, 4 * h, 1)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(size=(1, 4 * h, h)).astype(np.float32) * 0.3, "R"),
             const("ax2", [2]), const("m1", -1), const("one", 1), const("zero", 0), const("two", 2),
             const("z1", [0]), const("o1", [1]), const("t1", [2]), const("rate", 16000),
             const("shape_nh", [1, h])]
    graph = helper.make_graph(
        [helper.make_node("Equal", ["sr", "rate"], ["is16"]),
         helper.make_node("If", ["is16"], ["y"], name="If_0", then_branch=then, else_branch=other)],
        "vad_like",
        [helper.make_tensor_value_info("x", f, ["N", "T"]), helper.make_tensor_value_info("state", f, [2, "N", h]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", f, ["N", h])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def reference_outputs(model: Path, qdq: Path, calib: Path) -> tuple[np.ndarray, np.ndarray]:
    """First output of the FP32 model and of the saved QDQ model on every .npz sample of `calib`, both run
    by onnx's ReferenceEvaluator (the QDQ model raised to opset 21, where it has int16 QDQ): the oracle
    the scan's own figures are held to."""
    fp32 = ReferenceEvaluator(str(model))
    fq = ReferenceEvaluator(onnx.version_converter.convert_version(onnx.load(qdq), 21))
    xs, ys = [], []
    for f in sorted(calib.glob("*.npz")):
        feed = dict(np.load(f))
        xs.append(np.asarray(fp32.run(None, feed)[0], np.float64))
        ys.append(np.asarray(fq.run(None, feed)[0], np.float64))
    return np.concatenate(xs), np.concatenate(ys)



def loop_decoder(seed: int = 0, limit: float = 3.0) -> onnx.ModelProto:
    """SLANet's pattern in small: a top-level encoder (MatMul+Relu, a Div by a constant, dynamic batch),
    then an attention-style decoder inside a Loop whose stop condition reads data (ReduceMax < limit,
    at most 4 steps), then a head (MatMul, Softmax) on the Loop's last state. The body's MatMul/Tanh are
    quantizable nodes no flag folds; the top-level MatMuls are the sites a scan or bisect can measure."""
    f = TensorProto.FLOAT
    rng = np.random.default_rng(seed)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["s_in", "Wb"], ["bm"], name="body/MatMul"),
         helper.make_node("Tanh", ["bm"], ["bt"], name="body/Tanh"),
         helper.make_node("Add", ["bt", "d"], ["s_out"], name="body/Add"),
         helper.make_node("ReduceMax", ["s_out"], ["peak"], keepdims=0, name="body/ReduceMax"),
         helper.make_node("Less", ["peak", "limit"], ["go_on"], name="body/Less"),
         helper.make_node("Identity", ["s_out"], ["s_step"], name="body/Identity")],
        "decoder_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_in", f, ["N", 8])],
        [helper.make_tensor_value_info("go_on", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", f, ["N", 8]),
         helper.make_tensor_value_info("s_step", f, ["N", 8])])
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="enc/MatMul"),
        helper.make_node("Relu", ["h"], ["hr"], name="enc/Relu"),
        helper.make_node("Div", ["hr", "two"], ["d"], name="enc/Div"),
        helper.make_node("Loop", ["steps", "start", "d"], ["s_last", "s_all"], name="decoder/Loop", body=body),
        helper.make_node("MatMul", ["s_last", "W2"], ["logits"], name="head/MatMul"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="head/Softmax"),
    ]
    inits = [numpy_helper.from_array(rng.normal(size=(4, 8)).astype(np.float32), "W1"),
             numpy_helper.from_array((rng.normal(size=(8, 8)) * 0.5).astype(np.float32), "Wb"),
             numpy_helper.from_array(rng.normal(size=(8, 3)).astype(np.float32), "W2"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(limit, np.float32), "limit"),
             numpy_helper.from_array(np.array(4, np.int64), "steps"),
             numpy_helper.from_array(np.array(True), "start")]
    graph = helper.make_graph(nodes, "loop_decoder", [helper.make_tensor_value_info("x", f, ["N", 4])],
                              [helper.make_tensor_value_info("probs", f, ["N", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


DECODER_TOKENS = ("<tr>", "</tr>", "<td></td>", "<td", ">", " colspan=\"2\"")
"""A class table in SLANet's form: these characters between sos (class 0) and eos (the last class)."""


def greedy_decoder(steps: int = 6, dim: int = 4, seed: int = 0) -> onnx.ModelProto:
    """SLANet's decoder in small: an encoder MatMul gives a context, then a Loop that adds the embedding
    of its previous token, picks the next by ArgMax and carries it one-hot into the next step; the steps'
    scores come out [N, T, C] through Transpose and Softmax, with the `character` metadata of
    `DECODER_TOKENS` (C = len + 2: a count CTC's blank + space would fit too)."""
    f = TensorProto.FLOAT
    classes = len(DECODER_TOKENS) + 2
    rng = np.random.default_rng(seed)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["prev", "E"], ["emb"], name="body/MatMul"),
         helper.make_node("Add", ["emb", "ctx"], ["z"], name="body/Add"),
         helper.make_node("ArgMax", ["z"], ["tok"], axis=1, keepdims=0, name="body/ArgMax"),
         helper.make_node("OneHot", ["tok", "depth", "onoff"], ["nxt"], axis=-1, name="body/OneHot"),
         helper.make_node("Identity", ["cond"], ["cond_out"], name="body/cond"),
         helper.make_node("Identity", ["z"], ["z_step"], name="body/step")],
        "greedy_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("prev", f, ["N", classes])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("nxt", f, ["N", classes]),
         helper.make_tensor_value_info("z_step", f, ["N", classes])])
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["ctx"], name="enc/MatMul"),
        helper.make_node("Shape", ["ctx"], ["ctx_shape"], name="enc/Shape"),
        helper.make_node("ConstantOfShape", ["ctx_shape"], ["zeros"], name="enc/Zeros",
                         value=numpy_helper.from_array(np.zeros(1, np.float32))),
        helper.make_node("Add", ["zeros", "sos_row"], ["start_tok"], name="enc/Start"),
        helper.make_node("Loop", ["steps", "go", "start_tok"], ["last", "z_all"], name="decoder/Loop", body=body),
        helper.make_node("Transpose", ["z_all"], ["z_ntc"], perm=[1, 0, 2], name="head/Transpose"),
        helper.make_node("Softmax", ["z_ntc"], ["probs"], axis=-1, name="head/Softmax"),
    ]
    sos_row = np.zeros((1, classes), np.float32)
    sos_row[0, 0] = 1.0
    inits = [numpy_helper.from_array(rng.normal(size=(dim, classes)).astype(np.float32), "W"),
             numpy_helper.from_array((rng.normal(size=(classes, classes)) * 2).astype(np.float32), "E"),
             numpy_helper.from_array(sos_row, "sos_row"),
             numpy_helper.from_array(np.array(classes, np.int64), "depth"),
             numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "onoff"),
             numpy_helper.from_array(np.array(steps, np.int64), "steps"),
             numpy_helper.from_array(np.array(True), "go")]
    graph = helper.make_graph(nodes, "greedy_decoder", [helper.make_tensor_value_info("x", f, ["N", dim])],
                              [helper.make_tensor_value_info("probs", f, ["N", steps, classes])], inits)
    return _with_tokens(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def ctc_head(steps: int = 6, dim: int = 4, seed: int = 0) -> onnx.ModelProto:
    """A plain CTC head of the same [N, T, C] shape and metadata as `greedy_decoder`: MatMul, Softmax."""
    f = TensorProto.FLOAT
    classes = len(DECODER_TOKENS) + 2
    w = np.random.default_rng(seed).normal(size=(dim, classes)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["z"], name="head/MatMul"),
         helper.make_node("Softmax", ["z"], ["probs"], axis=-1, name="head/Softmax")],
        "ctc_head", [helper.make_tensor_value_info("x", f, ["N", steps, dim])],
        [helper.make_tensor_value_info("probs", f, ["N", steps, classes])], [numpy_helper.from_array(w, "W")])
    return _with_tokens(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def _with_tokens(model: onnx.ModelProto) -> onnx.ModelProto:
    model.ir_version = 8
    onnx.helper.set_model_props(model, {"character": "\n".join(DECODER_TOKENS)})
    onnx.checker.check_model(model, full_check=True)
    return model
