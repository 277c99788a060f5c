"""The chip profiles of issue 44 hold what their vendor documents say.

Each fact is a quote from a public document (written out here, as read) and the value it fixes,
written out by hand. A fact holds when the profile cites the quote (in a source, note or its document
list: a reader can find where the value came from) and stores that value. For qnn-htp the quotes
from onnxruntime's QNN quantization config are also read from the installed onnxruntime: its defaults
are the oracle there. Five facts or more per profile (issue 44's goal); hisilicon-svp's are the ATC
family's, which it borrows, and it may raise nothing above a warning.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import pytest

from builders import build
from quantscan.compat import load_profile
from quantscan.compat.check import check
from quantscan.compat.profiles import Limit, Profile


@dataclass(frozen=True)
class Fact:
    quote: str
    """The document's words, as the profile cites them."""
    value: Callable[[Profile], object]
    """Where the profile keeps what the quote says."""
    expected: object


def limit(p: Profile, op: str, attribute: str, when: str = "any") -> Limit:
    found = [lim for lim in p.limits if op in lim.ops and lim.attribute == attribute and lim.when == when]
    assert len(found) == 1, f"{p.name}: {len(found)} limits on {op}.{attribute} ({when})"
    return found[0]


def bounds(lim: Limit) -> tuple[object, ...]:
    """A limit as (min, max, allowed, unverified): what a finding compares against and its severity cap."""
    return lim.min, lim.max, lim.allowed, lim.origin.unverified


def scheme(p: Profile) -> tuple[str, str, bool, str]:
    return p.activations, p.weights, p.per_channel_weights, p.fallback_precision


FACTS: dict[str, list[Fact]] = {
    "ax650": [
        Fact("Supported ONNX opset_version >= 11", lambda p: (p.opset_min, p.opset_max), (11, None)),
        Fact("default: U8. option: U8, S8, U16, S16, FP32", lambda p: (p.activations, p.fallback_precision),
             ("uint8", "int16")),
        Fact("default: S8. option: S8, FP32", lambda p: p.weights, "int8"),
        Fact("count_include_pad: Only supports setting to 1",
             lambda p: bounds(limit(p, "AveragePool", "count_include_pad")), (None, None, (1,), False)),
        Fact("dilations: only support 1", lambda p: bounds(limit(p, "MaxPool", "dilation")),
             (None, None, (1,), False)),
        Fact("dilations: currently only setting to 1", lambda p: bounds(limit(p, "ConvTranspose", "dilation")),
             (None, None, (1,), False)),
        Fact("mode: Only supports constant", lambda p: bounds(limit(p, "Pad", "pad_mode")),
             (None, None, ("constant",), False)),
        Fact("supports models including CPU and NPU subgraphs", lambda p: p.unsupported, "cpu"),
    ],
    "neutron": [
        Fact("8-bit symmetric weights and 8-bit asymmetric activations (via the PT2E quantization flow), per-tensor "
             "granularity.", scheme, ("uint8", "int8", False, "float")),
        Fact("Only batch size 1 is supported on neutron.", lambda p: bounds(limit(p, "Conv", "batch")),
             (None, 1, None, False)),
        Fact("Requires addition of `Split` and `Concatenation` operators, which are not supported on Neutron.",
             lambda p: bounds(limit(p, "Conv", "group", "grouped")), (None, 1, None, False)),
        Fact("Neutron IR only supports the default `False`", lambda p: bounds(limit(p, "MaxPool", "ceil_mode")),
             (None, None, (0,), False)),
        Fact("The Neutron IR MaxPool2D does not support dilation.", lambda p: bounds(limit(p, "MaxPool", "dilation")),
             (None, None, (1,), False)),
        Fact("if dim == 0: return False", lambda p: bounds(limit(p, "Concat", "axis")), (1, None, None, False)),
        Fact("if is_transposed: return False", lambda p: "ConvTranspose" in p.npu_ops, False),
    ],
    "ascend310": [
        Fact("Opset v9/v10/v11/v12/v13/v14/v15/v16/v17/v18", lambda p: (p.opset_min, p.opset_max), (9, 18)),
        Fact("带offset:(默认值)数据量化使用非对称量化", lambda p: p.activations, "uint8"),
        Fact("H和W维度取值范围为[1, 63]", lambda p: bounds(limit(p, "Conv", "stride")), (1, 63, None, False)),
        Fact("H和W维度取值范围为[1, 255]", lambda p: bounds(limit(p, "Conv", "dilation")), (1, 255, None, False)),
        Fact("取值范围为[0, 255]", lambda p: bounds(limit(p, "Conv", "pads")), (0, 255, None, False)),
        Fact("1 <= input_w <= 4096", lambda p: bounds(limit(p, "AveragePool", "width")), (1, 4096, None, False)),
        Fact("取值步长大于63时,会使用AI CPU计算", lambda p: (limit(p, "AveragePool", "stride").max,
                                                  limit(p, "AveragePool", "stride").on_violation), (63, "cpu")),
        Fact("kernel_shape[0] * kernel_shape[1] > 256时", lambda p: limit(p, "AveragePool", "dilated_kernel_area").max,
             256),
    ],
    "qnn-htp": [
        Fact("activation_type: QuantType = QuantType.QUInt8", lambda p: p.activations, "uint8"),
        Fact("activation_symmetric: bool = False", lambda p: p.activations, "uint8"),
        Fact("Q16_TYPES = {QInt16, QUInt16}", lambda p: p.fallback_precision, "int16"),
        Fact("QNN does not support per-channel MatMul", lambda p: p.per_channel_weights, True),
        Fact("QNN Pool only supports dilations 1!", lambda p: bounds(limit(p, "AveragePool", "dilation")),
             (None, None, (1,), False)),
        Fact("QNN NPU does not support PoolMax3d!", lambda p: bounds(limit(p, "MaxPool", "spatial_rank")),
             (None, 2, None, False)),
        Fact("QNN's TransposeConv2d operator only supports default dilation values of 1.",
             lambda p: bounds(limit(p, "ConvTranspose", "dilation")), (None, None, (1,), False)),
        Fact("session.disable_cpu_ep_fallback", lambda p: p.unsupported, "cpu"),
    ],
    "hailo8": [
        Fact("8/16bit uint for the activations", lambda p: (p.activations, p.fallback_precision), ("uint8", "int16")),
        Fact("4/8/16bit int representation for the weights", lambda p: p.weights, "int8"),
        Fact("Hailo uses unsigned integers for all quantized values", lambda p: "uint16" in p.npu_dtypes, True),
        Fact("quantization_param(output_layer1, precision_mode=a16_w16)", lambda p: p.fallback_precision, "int16"),
        Fact("Equalization (Meller2019)", lambda p: (p.per_channel_weights, p.quantization.unverified), (False, True)),
        Fact("section 5.5 'Supported Layers'", lambda p: (p.ops.unverified, p.limits), (True, ())),
    ],
    "hisilicon-svp": [
        Fact("图像分析引擎1为ACL接口,图像分析引擎2为SVP ACL接口", lambda p: p.vendor, "HiSilicon"),
        Fact("带offset:(默认值)数据量化使用非对称量化", lambda p: p.activations, "uint8"),
        Fact("H和W维度取值范围为[1, 63]", lambda p: bounds(limit(p, "Conv", "stride")), (1, 63, None, True)),
        Fact("H和W维度取值范围为[1, 255]", lambda p: bounds(limit(p, "Conv", "dilation")), (1, 255, None, True)),
        Fact("取值范围为[0, 255]", lambda p: bounds(limit(p, "Conv", "pads")), (0, 255, None, True)),
        Fact("1 <= input_w <= 4096", lambda p: bounds(limit(p, "AveragePool", "width")), (1, 4096, None, True)),
    ],
}


def cited_text(p: Profile) -> str:
    """Everything a profile says about where its values come from."""
    sections = [p.quantization, p.opset, p.ops, p.fusion, p.dtypes, p.tensor, p.float16, p.consumer_range,
                p.requantize]
    parts = [*p.documents, p.note, *(s.source for s in sections if s is not None)]
    parts += [text for lim in p.limits for text in (lim.origin.source, lim.note)]
    return "\n".join(parts)


def test_every_new_profile_has_five_facts() -> None:
    assert all(len(facts) >= 5 for facts in FACTS.values()), {k: len(v) for k, v in FACTS.items()}


@pytest.mark.parametrize(("name", "fact"), [(name, fact) for name, facts in FACTS.items() for fact in facts],
                         ids=lambda x: x if isinstance(x, str) else x.quote[:40])
def test_profile_cites_the_quote_and_holds_its_value(name: str, fact: Fact) -> None:
    p = load_profile(name)
    assert fact.quote in cited_text(p), f"{name} does not cite: {fact.quote}"
    assert fact.value(p) == fact.expected


def test_qnn_quotes_are_onnxruntimes_own_defaults() -> None:
    """The installed onnxruntime's QNN config is what qnn-htp's scheme is read from: its defaults are
    asymmetric QUInt8 activations, 16-bit types are QInt16/QUInt16, and MatMul stays per tensor."""
    quant_config = pytest.importorskip("onnxruntime.quantization.execution_providers.qnn.quant_config")
    from onnxruntime.quantization import QuantType

    defaults = inspect.signature(quant_config.get_qnn_qdq_config).parameters
    assert defaults["activation_type"].default == QuantType.QUInt8
    assert defaults["activation_symmetric"].default is False
    assert quant_config.Q16_TYPES == {QuantType.QInt16, QuantType.QUInt16}
    assert "QNN does not support per-channel MatMul" in inspect.getsource(quant_config)


def test_hisilicon_svp_borrows_and_never_errors() -> None:
    """No public SVP list was read: every section and limit is unverified, and its ops are the ATC
    family's (a subset of ascend310's)."""
    svp, ascend = load_profile("hisilicon-svp"), load_profile("ascend310")
    sections = [svp.quantization, svp.opset, svp.ops, svp.fusion, svp.dtypes, svp.tensor]
    assert all(s.unverified for s in sections) and all(lim.origin.unverified for lim in svp.limits)
    assert svp.npu_ops <= ascend.npu_ops


POOL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 8, 16, 16] x) => (float[1, 8, 8, 8] y) {
  y = AveragePool<kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], count_include_pad = 0>(x)
}
"""

GROUPED = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 8, 8, 8] x) => (float[1, 8, 8, 8] y) {
  y = Conv<group = 2, kernel_shape = [1, 1]>(x, w)
}
"""


def _rule_rows(model: onnx.ModelProto, name: str, op: str) -> list[tuple[str, str]]:
    rows = check(model, [name]).findings
    rows = rows[rows["op_type"] == op]
    return list(zip(rows["attribute"], rows["severity"], strict=True))


def test_a_documented_limit_is_a_finding_at_its_severity() -> None:
    """The facts act: a padded count_include_pad=0 AveragePool is an ax650 finding (warn: Pulsar2 puts
    what the NPU cannot run in a CPU subgraph), a grouped 1x1 Conv is a neutron one, and the same Conv
    passes where no such limit is documented (ax650)."""
    pool = build(POOL)
    assert ("count_include_pad", "warn") in _rule_rows(pool, "ax650", "AveragePool")
    grouped = build(GROUPED, {"w": np.ones((8, 4, 1, 1), np.float32)})
    assert ("group", "warn") in _rule_rows(grouped, "neutron", "Conv")
    assert "group" not in {a for a, _ in _rule_rows(grouped, "ax650", "Conv")}
