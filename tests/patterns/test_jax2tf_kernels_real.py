"""The jax2tf kernels on the real model they were copied from: magika's byte classifier (zoo entry
magika_v3_3, magika==1.0.3 from PyPI, fetched and its inputs built by benchmarks/zoo.py: real files' first
and last KiB).

Issue 40 found it scanned as 55 sites, 48 of them the insides of its two LayerNorms (E[x²] − E[x]²,
Reshape/Expand, Sqrt→Reciprocal) and two tanh-GELUs (x³ as a Mul chain), with no per-channel figures on
7. Here: every LayerNorm and GELU node is inside one kernel site, ≥ 90% of the sites have per-channel
rows, and each recognised LayerNorm (GELU) computes, on the real inputs, what numpy's LayerNorm formula
(jax's tanh-GELU formula) gives from its input, and for a LayerNorm the axes, epsilon, scale and bias as
the match read them (onnxruntime runs the export).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import quantscan
from quantscan.graph.index import GraphIndex
from quantscan.patterns import gelu, layernorm_moments
from quantscan.patterns.base import Match
from quantscan.patterns.layernorm import LayerNormMatch
from scripts import load_script

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parents[2]
NAME = "magika_v3_3"


def _zoo() -> Any:
    return load_script(REPO / "benchmarks" / "zoo.py", "quantscan_zoo_benchmark")


@pytest.fixture(scope="module")
def magika(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    zoo = _zoo()
    entry = next(m for m in zoo.load_zoo()["models"] if m["name"] == NAME)
    cache = tmp_path_factory.mktemp("zoo-cache")
    return zoo.fetch_model(entry, cache), zoo.build_calib(entry, cache)


def test_magika_scans_as_its_kernels(magika: tuple[Path, Path]) -> None:
    model, calib = magika
    result = quantscan.scan(model, calib, limit=4, gain_candidates=0, no_report=True, quiet=True)
    kernels = [s.kernel.split("[")[0] for s in result.sites]
    assert kernels.count("LayerNorm") == 2 and kernels.count("GELU") == 2 and kernels.count("Softmax") == 1
    for site in result.sites:  # no site is a part of a LayerNorm or an activation
        inside = {n for n in site.nodes if "/LayerNorm_" in n or "/ApplyActivation_" in n}
        assert not inside or site.kernel.startswith(("LayerNorm[", "GELU[")), site.kernel
    with_channels = set(result.channels["node"])
    assert sum(s.node in with_channels for s in result.sites) >= 0.9 * len(result.sites)


def test_each_recognised_layernorm_computes_layernorm(magika: tuple[Path, Path]) -> None:
    path, calib = magika
    model = onnx.load(path)
    index = GraphIndex.of(model)
    found = [m for n in index.nodes if isinstance(m := layernorm_moments.match_at(index, n), LayerNormMatch)]
    assert len(found) == 2
    extra = [t for m in found for t in (m.x, m.output) if t not in {o.name for o in model.graph.output}]
    model.graph.output.extend(onnx.ValueInfoProto(name=t) for t in extra)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = np.load(next(calib.glob("*.npy")))[:4]
    values = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"bytes": feed}), strict=True))
    for m in found:
        x = values[m.x].astype(np.float64)
        mean = x.mean(axis=m.axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=m.axes, keepdims=True)
        assert m.scale is not None and m.bias is not None
        scale, bias = index.constant(m.scale), index.constant(m.bias)
        want = (x - mean) / np.sqrt(var + m.eps) * scale + bias
        # E[x²] − E[x]² in float32 loses digits where the variance is small beside the mean², so the
        # export differs from the float64 formula by float32 cancellation (2.7e-4 of the norm on
        # LayerNorm_0, 1.5e-6 on LayerNorm_1), not by a different function (a wrong axis: order 1)
        relative = np.linalg.norm(values[m.output] - want) / np.linalg.norm(want)
        assert relative < 1e-3, (m.output, relative)


def test_each_recognised_gelu_computes_tanh_gelu(magika: tuple[Path, Path]) -> None:
    """The two ApplyActivation blocks, matched at their Tanh, compute jax's tanh GELU of their input."""
    path, calib = magika
    model = onnx.load(path)
    index = GraphIndex.of(model)
    found = [m for n in index.nodes if n.op_type == "Tanh" and isinstance(m := gelu.match_tanh_at(index, n), Match)]
    assert len(found) == 2
    model.graph.output.extend(onnx.ValueInfoProto(name=t) for m in found for t in (m.x, m.output))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = np.load(next(calib.glob("*.npy")))[:4]
    values = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"bytes": feed}), strict=True))
    for m in found:
        x = values[m.x].astype(np.float64)
        want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
        np.testing.assert_allclose(values[m.output], want, rtol=1e-4, atol=1e-5, err_msg=m.output)
