"""`--state OUT=IN`: recurrent and streaming models get their state fed back from one sample to the next.

Why: silero-vad takes a window of audio and its LSTM `state`, and returns the next `stateN`. Calibrated
with `state` fixed at zeros, every window looks like the first of an utterance: the LSTM's activations
never reach the ranges they have in use, and the scales are wrong. As the model runs, the state carries.

What is fed (a choice, said in the docs and run.json): samples are taken in file order; the first
sample's IN is its data (or `--const IN=V`, zeros when neither is given), and every later sample's IN is
the FP32 model's OUT on the sample before. Every analysis (calibration, the FP32 reference, each
quantized variant) sees the same, FP32-carried state: the error measured per window is the quantized
model's error on that window, not a drift the quantized state accumulates over a whole file. There is no
reset between utterances (a streaming deployment does not reset either; silero's asset starts each
utterance with 64 zero samples of context, so the carried state sees the silence it would see live).

The FP32 states are computed once, on the first pass, and kept (one state per sample: for silero
2x1x128 floats, 1 KiB each); the model runs through a `step` callable, so this module needs no
onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from itertools import islice
from pathlib import Path

import numpy as np

from quantscan.calib.calibset import CalibSet, Sample
from quantscan.calib.npyfile import npz_headers
from quantscan.errors import UsageError
from quantscan.specs import InputSpec

StateStep = Callable[[Sample], Mapping[str, np.ndarray]]
"""Runs the FP32 model on one sample and returns (at least) the state outputs."""


def parse_state(values: Sequence[str]) -> dict[str, str]:
    """`OUT=IN` (repeatable) -> {OUT: IN}; UsageError saying what was expected."""
    pairs: dict[str, str] = {}
    for raw in values:
        out, sep, inp = raw.partition("=")
        if not sep or not out.strip() or not inp.strip():
            raise UsageError(f"--state: expected OUT=IN (an output fed back as an input), found {raw!r}")
        pairs[out.strip()] = inp.strip()
    return pairs


def check_state(pairs: Mapping[str, str], inputs: Sequence[InputSpec], outputs: Sequence[str]) -> None:
    """Every OUT is a graph output and every IN a graph input, each IN fed by one OUT."""
    names = [s.name for s in inputs]
    for out, inp in pairs.items():
        if out not in outputs:
            raise UsageError(
                f"--state {out}={inp}: expected an output of the model ({', '.join(outputs)}), found {out!r}"
            )
        if inp not in names:
            raise UsageError(
                f"--state {out}={inp}: expected an input of the model ({', '.join(names)}), found {inp!r}"
            )
    if len(set(pairs.values())) != len(pairs):
        raise UsageError(f"--state: expected each input fed by one output, found {dict(pairs)}")


def state_consts(pairs: Mapping[str, str], consts: Mapping[str, float], data: object = None) -> dict[str, float]:
    """The consts with a zero start value for every state input the user gave none (the first sample's
    state; later ones are carried), so the calibration folder needs no file for the state. A state the
    tensor folder `data` holds is left to the data: its first sample then starts from the state stored
    with it (a decoder LM's KV cache cut from the middle of a text), not from zeros."""
    stored = state_in_data(data, pairs)
    return {**{inp: 0.0 for inp in pairs.values() if inp not in stored}, **consts}


def state_in_data(data: object, pairs: Mapping[str, str]) -> set[str]:
    """The state inputs a tensor folder's files hold (keys of its first .npz, or .npy files named after
    the input); none for anything that is not such a folder."""
    if not isinstance(data, str | Path) or not Path(data).is_dir():
        return set()
    files = sorted((p for p in Path(data).iterdir() if p.is_file()), key=lambda p: p.name)
    first_npz = next((p for p in files if p.suffix.lower() == ".npz"), None)
    held = set(npz_headers(first_npz)) if first_npz is not None else set()
    held |= {p.stem for p in files if p.suffix.lower() == ".npy"}
    return {inp for inp in pairs.values() if inp in held}


def with_state(calib: CalibSet, pairs: Mapping[str, str], step: StateStep) -> CalibSet:
    """The same samples in file order, each state input replaced by the FP32 state the sample before
    left (see the module docstring); samples of a stateful set come one at a time (no batching)."""
    consts = {k: v for k, v in calib._consts.items() if k not in pairs.values()}
    start = {inp: calib._consts[inp] for inp in pairs.values() if inp in calib._consts}
    carried: list[dict[str, np.ndarray]] = []
    """carried[k]: the state inputs sample k is fed (filled on the first pass, reused after)."""

    def read(n: int, start: int) -> Iterator[tuple[Sample, Path]]:
        return islice(walk(n), start, None)  # each state is carried from sample 0: no cheaper skip

    def walk(n: int) -> Iterator[tuple[Sample, Path]]:
        previous: Sample = {}
        for k, (sample, path) in enumerate(calib._read(n, 0)):
            if k >= len(carried):
                if k == 0:
                    carried.append({inp: start[inp] if inp in start else sample[inp] for inp in pairs.values()})
                else:
                    outs = step(previous)
                    carried.append({inp: np.asarray(outs[out]).copy() for out, inp in pairs.items()})
            for inp, value in carried[k].items():
                sample[inp] = value.copy()
            previous = {**{c: v.copy() for c, v in consts.items()}, **sample}
            yield sample, path

    stateful = replace(calib, _consts=consts, _read=read)
    stateful.warnings = list(calib.warnings)
    return stateful
