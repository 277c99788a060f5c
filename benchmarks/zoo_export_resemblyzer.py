"""Export Resemblyzer's speaker encoder to ONNX from the `pretrained.pt` its wheel ships.

Why: the zoo had no speaker-embedding model, and PyPI ships Resemblyzer 0.1.4's trained GE2E d-vector
encoder (resemblyzer/pretrained.pt) but no ONNX. The module is written out here as the wheel's
voice_encoder.py defines it (LSTM 40 -> 256, 3 layers, batch first; Linear 256 -> 256; ReLU; L2 norm of
the last layer's final hidden state), loaded from the checkpoint's `model_state` (its two GE2E
similarity scalars are training-only) and exported with torch's TorchScript exporter, opset 17:
`mels` [1, 160, 40] (a 1.6 s partial of 40-band power mel frames) -> `embedding` [1, 256].

It runs in its own venv (torch==2.13.0 CPU, numpy, onnx), never in quantscan's:
    /work/venvs/zoo-torch/bin/python -P benchmarks/zoo_export_resemblyzer.py pretrained.pt out.onnx
benchmarks/zoo.py calls it so when it fetches the `resemblyzer_voice_encoder` entry (its `derive` field).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

MELS, HIDDEN, LAYERS, EMBEDDING, FRAMES = 40, 256, 3, 256, 160
"""resemblyzer/hparams.py: mel_n_channels, model_hidden_size, model_num_layers, model_embedding_size,
partials_n_frames."""


class VoiceEncoder(nn.Module):
    """Resemblyzer's VoiceEncoder without its loading and audio helpers."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(MELS, HIDDEN, LAYERS, batch_first=True)
        self.linear = nn.Linear(HIDDEN, EMBEDDING)
        self.relu = nn.ReLU()

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)
        raw = self.relu(self.linear(hidden[-1]))
        return raw / torch.norm(raw, dim=1, keepdim=True)


def main(checkpoint: str, out: str) -> None:
    model = VoiceEncoder()
    state = torch.load(checkpoint, map_location="cpu")["model_state"]
    extra = model.load_state_dict(state, strict=False)
    if extra.missing_keys or set(extra.unexpected_keys) - {"similarity_weight", "similarity_bias"}:
        raise SystemExit(f"checkpoint does not fit the module: {extra}")
    model.eval()
    torch.onnx.export(model, (torch.zeros(1, FRAMES, MELS),), out, input_names=["mels"],
                      output_names=["embedding"], opset_version=17, dynamo=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
