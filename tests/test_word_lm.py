"""The word + character-fallback tokenizer of benchmarks/zoo_export_lm.py (`train_lm.py --tokenizer
words`, the second decoder tried for issue 43's goal 3): what a model trained on it and the step files
written with it rely on.

Oracles: the text spelled back from the vocabulary's strings against the characters cleaned by a loop
written here, and word-piece counts made with a regular expression written here.
"""

from __future__ import annotations

import re
from collections import Counter

from test_lm_task import exporter


def cleaned(text: str) -> str:
    return "".join(" " if c == "\t" else c if c == "\n" or 32 <= ord(c) < 127 else "?" for c in text)


def test_word_tokens_spell_the_held_out_text_back() -> None:
    """Every character of held-out text survives (cleaned as the char model cleans it), the first 96
    tokens are the characters (nothing is out of vocabulary), and the tokens are words: fewer than
    the characters."""
    ex = exporter()
    train, held = ex.corpus()
    vocab = ex.word_vocab(train, 2048)
    ids = ex.encode_words(held, vocab)
    assert len(vocab) == 2048 == len(set(vocab))
    assert vocab[:96] == list(ex.VOCAB_TEXT)
    assert "".join(vocab[i] for i in ids) == cleaned(held)
    assert len(ids) < len(held) / 1.4  # indentation and punctuation stay one character a token


def test_the_vocabulary_holds_the_most_frequent_words_and_each_is_one_token() -> None:
    ex = exporter()
    train, _ = ex.corpus()
    vocab = ex.word_vocab(train, 500)
    counts = Counter(p for p in re.findall(r" ?[A-Za-z]+| ?[0-9]+", cleaned(train)) if len(p) > 1)
    want = sorted(counts, key=lambda w: (-counts[w], w))[: 500 - 96]
    assert vocab[96:] == want
    spaced = [w for w in want if w.startswith(" ")][:50]  # pieces that stay apart when joined
    assert ex.encode_words("".join(spaced), vocab).tolist() == [vocab.index(w) for w in spaced]
