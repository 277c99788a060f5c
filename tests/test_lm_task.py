"""`--task lm` on a decoder language model's decode step, and the zoo's char GPT end to end.

Oracles: the softmax and perplexity written out in numpy (no log-sum-exp shift, on logits small enough
for it), argmax agreement counted in a plain loop; on the committed trained model, onnxruntime's own
FP32 run over the same real text (the stdlib's help() pages, held out from training) with the cache
carried by hand, and the true next characters of that text.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import onnxruntime as ort
import pytest

from quantscan import taskmetrics as tm
from quantscan.api import scan
from quantscan.calib import load_calibration
from quantscan.model import graph_inputs, read_model_file
from quantscan.specs import InputSpec
from scripts import load_script

REPO = Path(__file__).resolve().parents[1]
LM = REPO / "tests" / "fixtures" / "lm" / "char_gpt_step.onnx"
STATE = {f"present.{n}": f"past.{n}" for n in range(4)}


def exporter() -> ModuleType:
    """benchmarks/zoo_export_lm.py (the vocabulary, the corpus split and the step writer)."""
    return load_script(REPO / "benchmarks" / "zoo_export_lm.py")


def naive_perplexity(logits: np.ndarray, tokens: list[int]) -> float:
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return math.exp(-np.mean([math.log(probs[i, t]) for i, t in enumerate(tokens)]))


def test_agreement_and_perplexity_ratio_follow_their_formulas() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(12, 96))
    test = ref + rng.normal(scale=0.4, size=ref.shape)
    tokens = rng.integers(0, 96, 12).tolist()
    acc = tm.LmAccumulator()
    acc.update(ref, test, tokens)
    got = acc.results()
    agree = sum(int(np.argmax(ref[i]) == np.argmax(test[i])) for i in range(12)) / 12
    assert got["next_token_agreement"] == pytest.approx(agree)
    assert got["perplexity"] == pytest.approx(naive_perplexity(test, tokens), rel=1e-12)
    assert got["fp32_perplexity"] == pytest.approx(naive_perplexity(ref, tokens), rel=1e-12)
    assert got["perplexity_ratio"] == pytest.approx(naive_perplexity(test, tokens) / naive_perplexity(ref, tokens))


def test_shards_merge_exactly_and_unknown_tokens_are_left_out() -> None:
    rng = np.random.default_rng(1)
    ref, test = rng.normal(size=(10, 20)), rng.normal(size=(10, 20))
    labels: list[int | None] = [3, None, 7, 1, None, 0, 19, 5, None, 2]
    whole, a, b = tm.LmAccumulator(), tm.LmAccumulator(), tm.LmAccumulator()
    whole.update(ref, test, labels)
    a.update(ref[:4], test[:4], labels[:4])
    b.update(ref[4:], test[4:], labels[4:])
    a.merge(b)
    assert a.results() == pytest.approx(whole.results())
    known = [i for i, lab in enumerate(labels) if lab is not None]
    want = naive_perplexity(test[known], [labels[i] for i in known])  # type: ignore[misc]
    assert whole.results()["perplexity"] == pytest.approx(want)
    unlabelled = tm.LmAccumulator()
    unlabelled.update(ref, test, None)
    assert set(unlabelled.results()) == {"next_token_agreement"}  # no truth: no perplexity claimed


def test_large_logits_do_not_overflow() -> None:
    logits = np.array([[1000.0, 998.0, 990.0]])
    want = -math.log(math.exp(-2.0) / (1.0 + math.exp(-2.0) + math.exp(-10.0)))
    assert tm.true_token_nll(logits, np.array([1]))[0] == pytest.approx(want)


def test_a_tensor_folder_reads_its_true_next_tokens_from_labels_json(tmp_path: Path) -> None:
    for k in range(3):
        np.savez(tmp_path / f"{k:03d}.npz", x=np.full((1, 2), k, np.float32))
    labels = {"classes": ["a", "b", "c"], "files": {"000.npz": 2, "002.npz": 0}}
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    cset = load_calibration(tmp_path, [InputSpec("x", np.dtype(np.float32), (1, 2))])
    assert cset.labels == [2, None, 0]
    assert cset.label_names == ["a", "b", "c"]


def fp32_stream(tokens: np.ndarray, count: int) -> tuple[np.ndarray, list[int]]:
    """The committed model's FP32 logits for steps 0..count-1 of `tokens`, the cache carried by hand."""
    session = ort.InferenceSession(str(LM), providers=["CPUExecutionProvider"])
    feeds = {f"past.{n}": np.zeros((2, 4, 64, 24), np.float32) for n in range(4)}
    rows = []
    for t in range(count):
        logits, *present = session.run(None, {"input_ids": tokens[None, t : t + 1], "position": np.array([t]), **feeds})
        feeds = {f"past.{n}": p for n, p in enumerate(present)}
        rows.append(logits[0])
    return np.stack(rows), [int(x) for x in tokens[1 : count + 1]]


def test_the_trained_lm_beats_unigram_by_far_on_held_out_text() -> None:
    """The fixture is a real language model: on text it never saw, its perplexity per character is far
    below the unigram model's of the training text (the bar of the brief: 'clearly far better')."""
    ex = exporter()
    train, held = ex.corpus()
    tokens = ex.encode(held)[:600]
    logits, truth = fp32_stream(tokens, 599)
    counts = np.bincount(ex.encode(train), minlength=96) + 1.0
    unigram = math.exp(-np.mean(np.log(counts[truth] / counts.sum())))
    assert naive_perplexity(logits.astype(np.float64), truth) < unigram / 3


def test_scan_carries_the_kv_cache_and_measures_the_lm_task(tmp_path: Path) -> None:
    """A scan on a stretch cut from the middle of held-out text: each step gets the cache the FP32 model
    left (the first from its file, the rest carried by --state), and the FP32 perplexity it reports is
    onnxruntime's on those true next characters."""
    ex = exporter()
    _, held = ex.corpus()
    tokens = ex.encode(held)
    calib = tmp_path / "calib"
    ex.write_steps(str(LM), tokens, calib, 80, 12)
    result = scan(LM, calib, threads=1, task="lm", state=STATE)
    figures = {row.metric: row.value for row in result.task.itertuples()}
    logits, truth = fp32_stream(tokens, 92)
    assert figures["fp32_perplexity"] == pytest.approx(naive_perplexity(logits[80:92].astype(np.float64), truth[80:92]),
                                                       rel=1e-4)
    assert 0.5 <= figures["next_token_agreement"] <= 1.0
    assert figures["perplexity_ratio"] == pytest.approx(figures["perplexity"] / figures["fp32_perplexity"])
    assert [s.name for s in graph_inputs(read_model_file(LM))][:2] == ["input_ids", "position"]


def test_bisect_can_target_next_token_agreement() -> None:
    from quantscan.bisect.targets import TASK_OF, gain_key, parse_target

    target = parse_target("next_token=0.98")
    assert (target.key, target.value) == ("next_token_agreement", 0.98)
    assert TASK_OF[target.key] == "lm" and gain_key(target) == "cosine"  # sites ordered by cosine gain
