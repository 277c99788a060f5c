"""gelu-tanh: every Erf-GELU form is replaced, marked approximate, and stays within the tanh
approximation's known error (|Δ| < 1e-3) of the Erf original under onnx.reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from builders import build, op_types, run
from quantscan.rewrites.gelu_tanh import gelu_tanh

X = np.linspace(-6, 6, 96, dtype=np.float32).reshape(4, 24)
CONSTS = {
    "sqrt2": np.array(1.4142135, np.float32),
    "inv_sqrt2": np.array(0.70710677, np.float32),
    "one": np.array(1.0, np.float32),
    "half": np.array(0.5, np.float32),
}
ERF = "e = Erf (s)\n"
FORMS = {
    "div-then-x-then-half": "s = Div (x, sqrt2)\n"
    + ERF
    + "a = Add (e, one)\n m = Mul (x, a)\n h = Mul (m, half)",
    "mul-then-halfx": "hx = Mul (half, x)\n s = Mul (x, inv_sqrt2)\n"
    + ERF
    + "a = Add (one, e)\n h = Mul (hx, a)",
    "half-then-x": "s = Div (x, sqrt2)\n" + ERF + "a = Add (e, one)\n m = Mul (a, half)\n h = Mul (x, m)",
}


def model(body: str, opset: int = 13) -> onnx.ModelProto:
    return build(
        f"""<ir_version: 8, opset_import: ["" : {opset}]>
        g (float[4,24] x) => (float[4,24] y) {{
            {body}
            y = Neg (h)
        }}""",
        CONSTS,
    )


@pytest.mark.parametrize("form", sorted(FORMS))
def test_erf_forms_become_tanh(form: str) -> None:
    m = model(FORMS[form])
    res = gelu_tanh(m)
    assert len(res.changes) == 1 and not res.exact
    ops = op_types(res.model)
    assert "Erf" not in ops and "Tanh" in ops and ops[-1] == "Neg"
    read_before = {i for n in m.graph.node for i in n.input}
    left = {t.name for t in res.model.graph.initializer} & set(CONSTS)
    assert left == set(CONSTS) - read_before  # constants the pattern read are pruned
    onnx.checker.check_model(res.model, full_check=True)
    (a,), (b,) = run(m, {"x": X}), run(res.model, {"x": X})
    err = np.abs(a - b).max()
    assert 0 < err < 1e-3  # an approximation: not bit-equal, within the tanh form's known error


def test_native_gelu_switches_attribute() -> None:
    m = build(
        '<ir_version: 9, opset_import: ["" : 20]> g (float[4,24] x) => (float[4,24] y) { y = Gelu (x) }'
    )
    res = gelu_tanh(m)
    attr = res.model.graph.node[0].attribute[0]
    assert attr.name == "approximate" and attr.s == b"tanh" and not res.exact


def test_shared_intermediate_refused() -> None:
    m = model(FORMS["div-then-x-then-half"] + "\n z = Relu (e)")
    m.graph.output.append(onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [4, 24]))
    res = gelu_tanh(m)
    assert not res.changes and "'e' has another consumer" in res.refusals[0].reason
