"""records.Finding: typed fields, the CSV row round trip, and the rewrite id that fixes carry."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from builders import build, rng_array
from quantscan.compat import COLUMNS
from quantscan.compat.check import check
from quantscan.compat.fixes import limit_fix, unsupported_op_fix
from quantscan.compat.profiles import load_profile
from quantscan.records import FINDING_DETAIL_COLUMNS, Finding, Placement, RewriteId, Severity


def _full() -> Finding:
    return Finding(
        node="Conv_3",
        op_type="Conv",
        rule="param-limit",
        severity=Severity.ERROR,
        reason="stride 3 above the limit",
        attribute="stride",
        value="[3, 3]",
        limit="<= 2",
        fix="fix-dim batch=1",
        source="vendor doc",
        unverified=False,
        forces_cpu=True,
        rewrite=RewriteId.FIX_DIM,
        rewrite_args=("batch=1", "x:2=64"),
        placement=Placement.CPU,
        partition=2,
        profile="rk3568",
    )


@pytest.mark.parametrize(
    "finding",
    [
        _full(),
        Finding("", "", "opset", Severity.INFO, "opset 7 below range"),
        Finding("BN_1", "BatchNormalization", "unsupported-op", Severity.WARN, "folded", rewrite=RewriteId.FOLD_BN,
                fix="fold-bn", placement=Placement.NPU, profile="ethos-u"),
    ],
)
def test_finding_round_trips_through_its_row(finding: Finding) -> None:
    row = finding.to_row()
    assert list(row)[: len(COLUMNS)] == list(COLUMNS)
    assert list(row)[len(COLUMNS) :] == list(FINDING_DETAIL_COLUMNS)
    assert Finding.from_row(row) == finding


def test_finding_round_trips_through_csv_text() -> None:
    """pandas reads empty cells as NaN and ints as numbers: from_row still gives the same record."""
    findings = [_full(), Finding("", "", "opset", Severity.INFO, "opset 7 below range")]
    text = pd.DataFrame([f.to_row() for f in findings]).to_csv(index=False)
    rows = pd.read_csv(io.StringIO(text)).to_dict("records")
    assert [Finding.from_row(r) for r in rows] == findings


def test_row_holds_plain_words_and_fields_stay_typed() -> None:
    f = Finding("n", "Relu", "r", "warn", "why", placement="cpu", rewrite="gelu-tanh")  # type: ignore[arg-type]
    assert f.severity is Severity.WARN and f.placement is Placement.CPU and f.rewrite is RewriteId.GELU_TANH
    row = f.to_row()
    assert type(row["severity"]) is str and row["severity"] == "warn"
    assert type(row["placement"]) is str and row["placement"] == "cpu"
    assert row["partition"] == "" and row["rewrite"] == "gelu-tanh"


def test_unverified_error_is_capped_at_warn() -> None:
    f = Finding("n", "Conv", "r", Severity.ERROR, "why", unverified=True)
    assert f.capped().severity is Severity.WARN
    assert Finding("n", "Conv", "r", Severity.ERROR, "why").capped().severity is Severity.ERROR


def test_fixes_name_their_rewrite_in_text_and_field() -> None:
    ethos = load_profile("ethos-u")
    bn = unsupported_op_fix("BatchNormalization", ethos)
    assert (bn.text, bn.rewrite, bn.args) == ("fold-bn", RewriteId.FOLD_BN, ())
    batch = limit_fix("batch", "Conv", 4)
    assert (batch.text, batch.rewrite, batch.args) == ("fix-dim batch=1", RewriteId.FIX_DIM, ("batch=1",))
    words = unsupported_op_fix("NonZero", ethos)
    assert words.rewrite is None and words.text.startswith("move data-dependent indexing")


def test_check_records_match_the_tables_row_for_row() -> None:
    m = build(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[N,3,8,8] x) => (float[N,4,8,8] y) {
            c = Conv <pads=[1,1,1,1]> (x, W)
            y = BatchNormalization (c, g, be, mu, var)
        }""",
        {"W": rng_array((4, 3, 3, 3)), **{k: np.ones(4, np.float32) for k in ("g", "be", "mu", "var")}},
    )
    r = check(m, ["ethos-u"])
    assert len(r.records) == len(r.findings) > 0
    assert [f.to_row() for f in r.records] == [
        {**a, **b} for a, b in zip(r.findings.to_dict("records"), r.details.to_dict("records"), strict=True)
    ]
    rewrites = {(f.rewrite, f.rewrite_args) for f in r.records if f.rewrite is not None}
    assert (RewriteId.FOLD_BN, ()) in rewrites and (RewriteId.FIX_DIM, ("batch=1",)) in rewrites
