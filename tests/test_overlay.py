"""`quantscan overlay`: node data that Model Explorer loads, validated against its documented schema.

The schema below is transcribed from ai-edge-model-explorer 0.1.34, model_explorer/node_data_builder.py
(`GraphNodeData`, `NodeDataResult`, `ThresholdItem`, `GradientItem`; JSON as `to_json_string` writes it).
The package itself pulls in flask, ipython and a native adapter, too heavy for a test dependency;
jsonschema (test extra) is the standard validator.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pandas as pd
import pytest

from quantscan.api import scan
from quantscan.cli import main
from quantscan.overlay import write_overlay

jsonschema = pytest.importorskip("jsonschema")

_NUM_OR_STR = {"type": ["number", "string"]}
_COLOR = {"type": "string"}
GRAPH_NODE_DATA_SCHEMA = {
    "type": "object",
    "required": ["results"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "results": {
            "type": "object",
            "additionalProperties": {
                "type": "object", "required": ["value"], "additionalProperties": False,
                "properties": {"value": _NUM_OR_STR, "bgColor": _COLOR, "textColor": _COLOR},
            },
        },
        "thresholds": {"type": "array", "items": {
            "type": "object", "required": ["value", "bgColor"], "additionalProperties": False,
            "properties": {"value": {"type": "number"}, "bgColor": _COLOR, "textColor": _COLOR}}},
        "gradient": {"type": "array", "items": {
            "type": "object", "required": ["stop"], "additionalProperties": False,
            "properties": {"stop": {"type": "number", "minimum": 0, "maximum": 1}, "bgColor": _COLOR,
                           "textColor": _COLOR}}},
        "hideInAggregatedStatsTable": {"type": "boolean"},
        "hideInChildrenStatsTable": {"type": "boolean"},
        "hideAggregatedStats": {"type": "array", "items": {"enum": ["min", "max", "sum", "avg"]}},
        "showExpandedSummaryOnGroupNode": {"type": "boolean"},
        "showLabelCountColumnsInChildrenStatsTable": {"type": "boolean"},
    },
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("overlay")
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[N, 3, 6, 6] x) => (float[N, 4, 6, 6] y) {
      c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
      r = Relu (c)
      y = Conv <pads = [1, 1, 1, 1]> (r, w2, b2)
    }
    """)
    rng = np.random.default_rng(1)
    model.graph.initializer.extend([
        onnx.numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w"),
        onnx.numpy_helper.from_array(rng.normal(size=4).astype(np.float32), "b"),
        onnx.numpy_helper.from_array(rng.normal(size=(4, 4, 3, 3)).astype(np.float32), "w2"),
        onnx.numpy_helper.from_array(rng.normal(size=4).astype(np.float32), "b2"),
    ])
    path = tmp / "m.onnx"
    onnx.save(model, path)
    calib = tmp / "calib"
    calib.mkdir()
    for i in range(4):
        np.savez(calib / f"{i}.npz", x=rng.normal(size=(1, 3, 6, 6)).astype(np.float32))
    scan(path, calib, out=tmp / "run", no_report=True)
    return tmp / "run"


def test_overlay_files_validate_and_carry_the_layers_figures(run_dir: Path, tmp_path: Path) -> None:
    paths = write_overlay(run_dir, tmp_path / "nodes.json")
    assert paths[0] == tmp_path / "nodes.json"
    layers = pd.read_csv(run_dir / "layers.csv")
    for path in paths:
        jsonschema.validate(json.loads(path.read_text(encoding="utf-8")), GRAPH_NODE_DATA_SCHEMA)
    main_data = json.loads(paths[0].read_text(encoding="utf-8"))
    expected = {r["node"]: round(float(r["cumulative_sqnr_db"]), 4) for r in layers.to_dict("records")}
    assert {k: v["value"] for k, v in main_data["results"].items()} == expected
    iso = json.loads((tmp_path / "nodes.isolated_sqnr.json").read_text(encoding="utf-8"))
    assert iso["results"][layers["node"][0]]["value"] == round(float(layers["isolated_sqnr_db"][0]), 4)


def test_overlay_writes_gain_after_bisect_and_the_cli_one_line_error(run_dir: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    bisected = tmp_path / "run"
    bisected.mkdir()
    for f in run_dir.iterdir():
        (bisected / f.name).write_bytes(f.read_bytes())
    layers = pd.read_csv(bisected / "layers.csv")
    layers["gain_if_float"] = np.linspace(0.0, 0.01, len(layers))
    layers.to_csv(bisected / "layers.csv", index=False)
    assert main(["overlay", str(bisected), "-o", str(tmp_path / "o" / "n.json")]) == 0
    gain = json.loads((tmp_path / "o" / "n.gain.json").read_text(encoding="utf-8"))
    jsonschema.validate(gain, GRAPH_NODE_DATA_SCHEMA)
    assert gain["results"][layers["node"].iloc[-1]]["value"] == 0.01 and gain["gradient"][0]["stop"] == 0
    assert main(["overlay", str(tmp_path / "missing"), "-o", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("quantscan: error:")


def test_overlay_reads_a_bisect_folder(run_dir: Path, tmp_path: Path) -> None:
    """`bisect --out DIR` on its own writes no run.json; overlay must still show its gains and its plan."""
    from quantscan.api import run_bisect

    model, calib = run_dir.parent / "m.onnx", run_dir.parent / "calib"
    out = tmp_path / "bisect"
    result = run_bisect(model, calib, target_cosine=0.999999, out=out)
    assert not (out / "run.json").exists()
    assert main(["overlay", str(out), "-o", str(tmp_path / "n.json")]) == 0
    gains = pd.read_csv(out / "gain.csv")
    data = json.loads((tmp_path / "n.json").read_text(encoding="utf-8"))
    jsonschema.validate(data, GRAPH_NODE_DATA_SCHEMA)
    for row in gains.to_dict("records"):  # every gain, to 4 significant digits (not rounded to 0)
        assert data["results"][row["node"]]["value"] == pytest.approx(row["gain_if_float"], rel=1e-3)
    plan = json.loads((tmp_path / "n.plan.json").read_text(encoding="utf-8"))
    jsonschema.validate(plan, GRAPH_NODE_DATA_SCHEMA)
    assert {k: v["value"] for k, v in plan["results"].items()} == {s.node: "float" for s in result.plan.sites}
    assert result.plan.sites, "the target must need at least one float site for this test to mean anything"
