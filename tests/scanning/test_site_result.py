"""The typed site records a scan returns: layers.csv is exactly their rows, in rank order."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

import quantscan
from quantscan.columns import Col
from quantscan.scanning.site_result import layers_frame, sort_value


@pytest.mark.real
def test_layers_table_is_the_records_rows_with_cpu_rows(assets: Path) -> None:
    model = assets / "models" / "ppocr_mobile_v2_cls.onnx"
    result = quantscan.scan(model, assets / "calib" / "ppocr_mobile_v2_cls", limit=2, profile="ethos-u",
                            gain_candidates=2, gain_samples=2)
    pd.testing.assert_frame_equal(layers_frame(result.site_results), result.layers)
    assert [r.rank for r in result.site_results] == list(range(1, len(result.site_results) + 1))
    cpu = [r for r in result.site_results if not r.on_chip]
    assert cpu, "ethos-u runs some of this model's ops on the CPU"
    for r in cpu:  # a CPU row is no quantization site: no isolated figures, no int8 parameters
        assert r.isolated is None and r.activation is None and r.inputs is None
        assert r.cause == "cpu-fallback"
    by_tensor = result.tensors.set_index("tensor")
    for r in result.site_results:  # the cumulative figures are the tensors table's, measured once
        if r.output in by_tensor.index and not math.isnan(r.cumulative.cosine):
            assert r.cumulative.cosine == pytest.approx(float(by_tensor.loc[r.output, Col.CUMULATIVE_COSINE]))
    measured = [r for r in result.site_results if r.gain is not None and math.isfinite(r.gain.if_float)]
    assert measured and all(r.gain is not None for r in result.site_results)


def test_sort_value_orders_inf_and_nan_last() -> None:
    values = [math.nan, math.inf, 3.0, -math.inf, None]
    assert sorted(values, key=sort_value)[:3] == [-math.inf, 3.0, math.inf]
