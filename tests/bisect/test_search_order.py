"""Issue 38 part 4: with `loss_if_only` measured, the search tries first the sites whose loss alone is large,
even where their one-pass gain is small (a non-additive loss: PicoDet's p2o.Conv.4 costs 0.12 of cosine alone,
while every site's gain is <= 0.021)."""

from __future__ import annotations

import math

import pandas as pd

from quantscan.columns import Col
from quantscan.scanning.gain import sensitivity_order


def table(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    """(node, gain_if_float_cosine, loss_if_only) rows in graph order."""
    return pd.DataFrame(
        [{Col.NODE: n, Col.ORDER: k, Col.GAIN_IF_FLOAT_COSINE: g, Col.LOSS_IF_ONLY: loss}
         for k, (n, g, loss) in enumerate(rows)]
    )


def test_a_large_loss_alone_comes_before_a_larger_gain() -> None:
    t = table([("a", 0.02, 0.001), ("b", 0.001, 0.12), ("c", 0.005, 0.0)])
    assert sensitivity_order(t, "cosine") == ["b", "a", "c"]


def test_without_loss_if_only_the_order_is_by_gain() -> None:
    t = table([("a", 0.02, math.nan), ("b", 0.001, math.nan), ("c", 0.005, math.nan)])
    assert sensitivity_order(t, "cosine") == ["a", "c", "b"]
    assert sensitivity_order(t.drop(columns=[Col.LOSS_IF_ONLY]), "cosine") == ["a", "c", "b"]


def test_sqnr_target_keeps_the_gain_order() -> None:
    """loss_if_only holds the SQNR itself for an SQNR target (higher is better): not a loss to rank by."""
    sqnr = "gain_if_float_sqnr_db"
    t = pd.DataFrame([
        {Col.NODE: "a", Col.ORDER: 0, sqnr: 3.0, Col.GAIN_IF_FLOAT_COSINE: 0.01, Col.LOSS_IF_ONLY: 20.0},
        {Col.NODE: "b", Col.ORDER: 1, sqnr: 1.0, Col.GAIN_IF_FLOAT_COSINE: 0.0, Col.LOSS_IF_ONLY: 40.0},
    ])
    assert sensitivity_order(t, "sqnr_db") == ["a", "b"]
