"""The model input as a site of its own (sites.input_sites): a speaker-encoder stand-in, power mel frames of
speech through a Transpose and an LSTM, as issue 26's encoder was (88% of its input values in uint8 code 0).

The input gets a layers.csv row (`op_type` "input"), its cause (crowded codes) and the input's fixes, and a
measured `gain_if_float`; bisect can keep it float. Oracles, written out here: the power mel spectrum
(Hann-windowed FFT, HTK mel filterbank), the textbook uint8 fake quantization over the min/max range, and
onnx's ReferenceEvaluator running the saved QDQ model with and without the input's QuantizeLinear/
DequantizeLinear pairs (the input's and the Transpose output's, which carries the same values).
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from tests.conftest import asset_calib, asset_model

import quantscan
from quantscan.columns import Col
from quantscan.graph.mixed import FloatSiteBranches, diff_branch
from quantscan.scanning.gain import mixed_builder
from quantscan.scanning.prepare import prepare_scan

SR = 16000
N_FFT, HOP, MELS, FRAMES, HIDDEN = 400, 160, 40, 48, 24


def _mel_filterbank(sr: int = SR, n_fft: int = N_FFT, n_mels: int = MELS) -> np.ndarray:
    """HTK mel filterbank [n_mels, n_fft // 2 + 1]: triangles between mel-spaced edges."""
    mel = np.linspace(0.0, 2595.0 * np.log10(1.0 + (sr / 2) / 700.0), n_mels + 2)
    hz = 700.0 * (10.0 ** (mel / 2595.0) - 1.0)
    bins = np.fft.rfftfreq(n_fft, 1.0 / sr)
    lo, mid, hi = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    return np.maximum(0.0, np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)))


def power_mel(signal: np.ndarray) -> np.ndarray:
    """[frames, MELS] power mel spectrum (|FFT|² of Hann-windowed frames through the filterbank), no log:
    the heavy-tailed input a speaker encoder trained on power frames eats."""
    window = np.hanning(N_FFT)
    starts = range(0, len(signal) - N_FFT + 1, HOP)
    spec = np.abs(np.fft.rfft(np.stack([signal[s:s + N_FFT] * window for s in starts]), axis=1)) ** 2
    return (spec @ _mel_filterbank().T).astype(np.float32)


def speech_like(seconds: float = 3.0, seed: int = 0) -> np.ndarray:
    """A voiced-speech stand-in: a glottal pulse train (pitch gliding 110-160 Hz) through three formant
    resonances, syllables separated by near-silence, a little noise; peak 1."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    pitch = 135.0 + 25.0 * np.sin(2 * np.pi * 0.7 * t)
    pulses = (np.diff(np.floor(np.cumsum(pitch) / SR), prepend=0.0) > 0).astype(np.float64)
    voiced = np.zeros_like(t)
    for formant, bandwidth in ((700.0, 90.0), (1200.0, 110.0), (2600.0, 160.0)):
        decay = np.exp(-np.pi * bandwidth * np.arange(400) / SR) * np.sin(2 * np.pi * formant * np.arange(400) / SR)
        voiced += np.convolve(pulses, decay)[: t.size]
    envelope = np.clip(np.sin(2 * np.pi * 2.2 * t), 0.0, None) ** 2
    x = voiced * envelope + 0.002 * rng.normal(size=t.size)
    return x / np.abs(x).max()


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as f:
        assert f.getsampwidth() == 2 and f.getframerate() == SR
        pcm = np.frombuffer(f.readframes(f.getnframes()), np.int16)
    return pcm.astype(np.float64) / 32768.0


def encoder(scale: float, seed: int = 0) -> onnx.ModelProto:
    """mel [N, FRAMES, MELS] -> Transpose [T, N, F] -> LSTM -> last hidden state -> projection emb [N, 16].
    `scale` sets the input weights so typical frames give pre-activations of order 1 (a trained encoder's
    first layer is fitted to its input's scale)."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.normal(size=(1, 4 * HIDDEN, MELS)) * scale).astype(np.float32), "W"),
        numpy_helper.from_array((rng.normal(size=(1, 4 * HIDDEN, HIDDEN)) * 0.3).astype(np.float32), "R"),
        numpy_helper.from_array(rng.normal(size=(HIDDEN, 16)).astype(np.float32), "proj"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
    ]
    nodes = [
        helper.make_node("Transpose", ["mel"], ["frames"], name="to_time_major", perm=[1, 0, 2]),
        helper.make_node("LSTM", ["frames", "W", "R"], ["", "h_last"], name="lstm", hidden_size=HIDDEN),
        helper.make_node("Squeeze", ["h_last", "axis0"], ["h"], name="squeeze"),
        helper.make_node("MatMul", ["h", "proj"], ["emb"], name="projection"),
    ]
    graph = helper.make_graph(nodes, "speaker_encoder", [helper.make_tensor_value_info("mel", TensorProto.FLOAT,
                              ["N", FRAMES, MELS])], [helper.make_tensor_value_info("emb", TensorProto.FLOAT,
                              ["N", 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model, full_check=True)
    return model


def write_case(tmp_path: Path, signals: list[np.ndarray]) -> tuple[Path, Path, list[np.ndarray]]:
    """The encoder and one .npz per FRAMES-frame window of the signals' power mel."""
    windows = []
    for signal in signals:
        mel = power_mel(signal)
        windows += [mel[s:s + FRAMES][None] for s in range(0, len(mel) - FRAMES + 1, FRAMES // 2)]
    typical = float(np.median(np.concatenate(windows)[np.concatenate(windows) > 0]))
    path = tmp_path / "encoder.onnx"
    onnx.save(encoder(scale=0.5 / typical), path)
    calib = tmp_path / "mel"
    calib.mkdir()
    for i, w in enumerate(windows):
        np.savez(calib / f"{i:03d}.npz", mel=w)
    return path, calib, windows


def uint8_fake_quant(x: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """(codes, dequantized) of the textbook asymmetric uint8 quantizer over [min(lo, 0), max(hi, 0)]."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = np.float32((hi - lo) / 255.0)
    zp = int(np.clip(np.rint(-lo / scale), 0, 255))
    q = np.clip(np.rint(x / scale) + zp, 0, 255)
    return q, ((q - zp) * scale).astype(np.float32)


def without_input_quantization(qdq: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """The QDQ model with the QuantizeLinear/DequantizeLinear pairs on `name` and on every tensor that
    carries its values unchanged (a Transpose of it) removed: the input kept float, every kernel int8."""
    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    nodes = list(model.graph.node)
    carried = {name}
    changed = True
    while changed:
        changed = False
        for q in [n for n in nodes if n.op_type == "QuantizeLinear" and n.input[0] in carried]:
            dq = next(n for n in nodes if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0])
            for n in nodes:
                n.input[:] = [q.input[0] if i == dq.output[0] else i for i in n.input]
            for o in model.graph.output:
                assert o.name != dq.output[0]
            nodes = [n for n in nodes if n is not q and n is not dq]
            changed = True
        for n in nodes:
            if n.op_type == "Transpose" and n.input[0] in carried and n.output[0] not in carried:
                carried.add(n.output[0])
                changed = True
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def pooled_cosine(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    return float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))


def _outputs(model: onnx.ModelProto | str, windows: list[np.ndarray]) -> np.ndarray:
    ref = ReferenceEvaluator(model)
    return np.concatenate([np.asarray(ref.run(None, {"mel": w})[0]) for w in windows])


@pytest.fixture(scope="module")
def scanned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[np.ndarray], quantscan.ScanResult]:
    tmp = tmp_path_factory.mktemp("input_site")
    path, calib, windows = write_case(tmp, [speech_like(seed=0), speech_like(seed=1)])
    result = quantscan.scan(path, calib, gain_samples=0, save_qdq=tmp / "encoder.qdq.onnx", quiet=True)
    return path, calib, windows, result


def test_the_input_is_a_site_with_its_own_figures(scanned: tuple) -> None:  # type: ignore[type-arg]
    _, _, windows, result = scanned
    layers = result.layers
    row = layers[layers[Col.OP_TYPE] == "input"].iloc[0]
    assert (row[Col.NODE], row[Col.OUTPUT], row[Col.KERNEL]) == ("mel", "mel", "input")
    x = np.concatenate(windows).astype(np.float64)
    _, y = uint8_fake_quant(x, float(x.min()), float(x.max()))
    sqnr = 10 * np.log10((x * x).sum() / ((x - y) ** 2).sum())
    assert row[Col.ISOLATED_SQNR_DB] == pytest.approx(sqnr, abs=1e-3)
    assert row[Col.CUMULATIVE_SQNR_DB] == pytest.approx(sqnr, abs=1e-3)  # nothing before it
    assert row[Col.ISOLATED_COSINE] == pytest.approx(pooled_cosine(x, y), abs=1e-6)
    # the LSTM reads the Transpose of the input: that pass-through is not a site and the LSTM is one
    assert set(layers[Col.OP_TYPE]) == {"input", "LSTM", "MatMul"}


def test_power_mel_crowds_the_input_codes_and_the_fix_says_so(scanned: tuple) -> None:  # type: ignore[type-arg]
    _, _, windows, result = scanned
    x = np.concatenate(windows)
    codes, _ = uint8_fake_quant(x, float(x.min()), float(x.max()))
    assert float(np.mean(codes == 0)) > 0.5  # the stand-in is faithful: most values in code 0
    row = result.layers[result.layers[Col.OP_TYPE] == "input"].iloc[0]
    assert row[Col.DIAGNOSIS_CAUSE] == "crowded-codes"
    fix = str(row[Col.DIAGNOSIS_FIX])
    assert "preprocessing" in fix and "int16" in fix and "float" in fix


def int16_fake_quant(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The textbook symmetric int16 quantizer over ±max(|lo|, |hi|) (65535 steps), dequantized."""
    absmax = max(abs(min(lo, 0.0)), abs(max(hi, 0.0)))
    scale = np.float32(2.0 * absmax / 65535.0)
    return (np.clip(np.rint(x / scale), -32768, 32767) * scale).astype(np.float32)


def _reference_gains(path: Path, windows: list[np.ndarray]) -> tuple[float, float, float]:
    """(all-int8 cosine, input kept float, input fed int16) by the reference: the saved QDQ model, and the
    same without the input's pairs fed the input as is or int16-fake-quantized in numpy."""
    # raised to opset 21: onnx.reference has DequantizeLinear from 19 on
    qdq = onnx.version_converter.convert_version(onnx.load(path.parent / "encoder.qdq.onnx"), 21)
    fp32 = _outputs(str(path), windows)
    float_input = without_input_quantization(qdq, "mel")
    lo, hi = min(float(w.min()) for w in windows), max(float(w.max()) for w in windows)
    wide = [int16_fake_quant(w, lo, hi) for w in windows]
    return (pooled_cosine(fp32, _outputs(qdq, windows)), pooled_cosine(fp32, _outputs(float_input, windows)),
            pooled_cosine(fp32, _outputs(float_input, wide)))


def test_gain_if_float_of_the_input_matches_the_reference_without_its_qdq(scanned: tuple) -> None:  # type: ignore[type-arg]
    path, _, windows, result = scanned
    all_int8, input_float, _ = _reference_gains(path, windows)
    row = result.layers[result.layers[Col.NODE] == "mel"].iloc[0]
    assert all_int8 == pytest.approx(result.headline.cosine, abs=2e-4)
    assert row[Col.GAIN_IF_FLOAT] == pytest.approx(input_float - all_int8, abs=5e-4)
    assert row[Col.GAIN_IF_FLOAT] > 0.01 and row[Col.RANK] == 1
    # the projection's error is inherited, and the inherited-error rule names the input, not the LSTM
    projection = result.layers[result.layers[Col.NODE] == "projection"].iloc[0]
    assert projection[Col.DIAGNOSIS_CAUSE] == "inherited-error" and "upstream `mel`" in projection[Col.DIAGNOSIS]


def test_bisect_keeps_the_input_float_or_feeds_it_int16(scanned: tuple, tmp_path: Path) -> None:  # type: ignore[type-arg]
    """Bisect's gain of the input at each fallback is the reference's, and a target halfway to it is met by
    planning the input alone at that precision (plan.json: node and output `mel`). One sample set and one
    rounding (`holdout="none"`, `realisations=1`): the reference measures every window, as the gains then do."""
    path, calib, windows, _ = scanned
    all_int8, input_float, input_int16 = _reference_gains(path, windows)
    for fallback, reached in (("float", input_float), ("int16", input_int16)):
        target = all_int8 + 0.5 * (reached - all_int8)
        found = quantscan.run_bisect(path, calib, target_cosine=target, fallback=fallback, quiet=True,
                                     out=tmp_path / fallback, holdout="none", realisations=1)
        gain = found.gains.set_index(Col.NODE).loc["mel", Col.GAIN_IF_FLOAT]
        assert gain == pytest.approx(reached - all_int8, abs=5e-4)
        assert found.reached
        planned = {s.node: s for s in found.plan.sites}
        assert planned["mel"].precision.value == fallback and planned["mel"].output == "mel"


def test_the_input_branch_read_off_the_all_int8_model_is_the_diff(scanned: tuple) -> None:  # type: ignore[type-arg]
    """The gain graph's branch for "input float" (FloatSiteBranches: the input's and the Transpose output's
    QDQ pairs dropped, everything downstream) equals `diff_branch` of the whole variant model."""
    path, calib, _, _ = scanned
    ctx = prepare_scan(path, calib, threads=1)
    builder = mixed_builder(ctx)
    assert builder.sites[0].is_input and builder.sites[0].shares == ["frames"]
    base = builder.model(builder.precisions([]))
    fast = FloatSiteBranches(builder, base).branch(0)
    diffed = diff_branch(base, builder.model(builder.precisions(["mel"])))
    assert sorted(n.SerializeToString() for n in fast.nodes) == sorted(n.SerializeToString() for n in diffed.nodes)
    assert fast.produced == diffed.produced and fast.alias == diffed.alias
    assert {n.op_type for n in fast.nodes} >= {"Transpose", "LSTM", "MatMul"}


@pytest.mark.real
def test_power_mel_of_real_speech(assets: Path, tmp_path: Path) -> None:
    """The same encoder on power mel frames of the CMU ARCTIC clips the silero asset carries: real speech
    crowds the input codes too, and the input, not the LSTM, is the site to repair."""
    wavs = sorted(asset_calib(assets, "silero_vad_openvino_16k").glob("*.wav"))
    path, calib, windows = write_case(tmp_path, [read_wav(w) for w in wavs])
    result = quantscan.scan(path, calib, gain_samples=0, quiet=True)
    row = result.layers.iloc[0]
    assert row[Col.NODE] == "mel" and row[Col.DIAGNOSIS_CAUSE] == "crowded-codes"
    x = np.concatenate(windows)
    codes, y = uint8_fake_quant(x, float(x.min()), float(x.max()))
    assert float(np.mean(codes == 0)) > 0.8
    assert row[Col.ISOLATED_SQNR_DB] == pytest.approx(
        10 * np.log10((x.astype(np.float64) ** 2).sum() / ((x - y).astype(np.float64) ** 2).sum()), abs=1e-3)


@pytest.mark.real
def test_silero_audio_input_is_a_site_and_its_state_is_not(assets: Path) -> None:
    """silero-vad: the audio window `input` is a site (its isolated figures the textbook uint8 quantizer's
    on the asset's windows), the recurrent `state` fed by --const is not."""
    name = "silero_vad_openvino_16k"
    calib = asset_calib(assets, name)
    result = quantscan.scan(asset_model(assets, name), calib, const={"state": 0.0}, limit=16, gain_samples=4,
                            quiet=True)
    inputs = result.layers[result.layers[Col.OP_TYPE] == "input"]
    assert list(inputs[Col.NODE]) == ["input"]
    x = np.load(calib / "input.npy")[:16].astype(np.float64)
    _, y = uint8_fake_quant(x, float(x.min()), float(x.max()))
    row = inputs.iloc[0]
    assert row[Col.ISOLATED_SQNR_DB] == pytest.approx(10 * np.log10((x * x).sum() / ((x - y) ** 2).sum()), abs=1e-3)
    assert np.isfinite(row[Col.GAIN_IF_FLOAT])
