"""Twelve well-known architectures written in PyTorch, exported to FP32 ONNX.

The coverage benchmark (``benchmarks/bench_zoo.py``) and its test take them from here:
one entry per model with its builder, the input it takes and the sizes it is built at
(``sizes``: the benchmark's, small enough for the whole zoo to run in minutes on two
cores; ``tiny``: the test's). Weights are seeded random (``seed``), so every export
of one entry at one size is the same model. torch is imported only when a model is
built.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ..quantize import image_like

Feed = dict[str, np.ndarray]
OPSET = 17


@dataclass(frozen=True)
class ZooEntry:
    """One architecture: how to build it and what it reads."""

    name: str
    family: str                  # "cnn" or "transformer" (the launch goals differ)
    builder: str                 # class name in cnns.py / transformers.py
    input: str                   # "image", "audio" or "tokens"
    sizes: dict[str, Any] = field(default_factory=dict)   # the benchmark's builder arguments
    tiny: dict[str, Any] = field(default_factory=dict)    # smaller, for tests
    image: int = 32              # image side (image input) / samples (audio) / tokens (seq)
    tiny_image: int = 32

    def kwargs(self, tiny: bool = False) -> dict[str, Any]:
        return dict(self.tiny if tiny else self.sizes)

    def side(self, tiny: bool = False) -> int:
        return self.tiny_image if tiny else self.image


#: the CNNs read 224x224 images, their ImageNet input (at 64x64 the last stages are 2x2
#: maps whose per-layer costs, not the network, decide the cycles: bench_zoo --image 64)
ZOO: dict[str, ZooEntry] = {e.name: e for e in [
    ZooEntry("resnet18", "cnn", "ResNet18", "image", {"width": 64}, {"width": 16}, 224, 32),
    ZooEntry("mobilenet_v2", "cnn", "MobileNetV2", "image", {"width_mult": 1.0},
             {"width_mult": 0.35}, 224, 32),
    ZooEntry("mobilenet_v3_small", "cnn", "MobileNetV3Small", "image", {}, {}, 224, 32),
    ZooEntry("efficientnet_b0", "cnn", "EfficientNetB0", "image", {}, {}, 224, 32),
    ZooEntry("vit_tiny", "transformer", "ViT", "image", {"depth": 12, "image": 32},
             {"depth": 1, "image": 16, "dim": 64, "heads": 2, "mlp": 128}, 32, 16),
    ZooEntry("bert", "transformer", "Bert", "tokens", {"depth": 4, "seq": 32},
             {"depth": 1, "seq": 8, "dim": 32, "heads": 2, "ffn": 64, "vocab": 64}, 32, 8),
    ZooEntry("gpt2", "transformer", "GPT2", "tokens", {"depth": 2, "seq": 32},
             {"depth": 1, "seq": 8, "dim": 32, "heads": 2, "vocab": 64}, 32, 8),
    ZooEntry("llama", "transformer", "Llama", "tokens", {"depth": 2, "seq": 32},
             {"depth": 1, "seq": 8, "dim": 32, "heads": 2, "ffn": 64, "vocab": 64}, 32, 8),
    ZooEntry("yolo", "cnn", "YoloStyle", "image", {"width": 16}, {"width": 8}, 224, 32),
    ZooEntry("unet", "cnn", "UNet", "image", {"width": 16}, {"width": 8}, 224, 16),
    ZooEntry("convnext", "cnn", "ConvNeXt", "image", {},
             {"dims": (16, 32), "depths": (1, 1)}, 224, 32),
    ZooEntry("audio_conv1d", "cnn", "AudioConv1d", "audio", {"width": 32}, {"width": 16},
             4000, 1600),
]}


def names() -> list[str]:
    return list(ZOO)


def _builder(entry: ZooEntry) -> Callable[..., Any]:
    from . import cnns, transformers

    return getattr(cnns, entry.builder, None) or getattr(transformers, entry.builder)


def input_shape(entry: ZooEntry, tiny: bool = False) -> tuple[int, ...]:
    s = entry.side(tiny)
    return {"image": (1, 3, s, s), "audio": (1, 1, s), "tokens": (1, s)}[entry.input]


def vocab(entry: ZooEntry, tiny: bool = False) -> int:
    return int(entry.kwargs(tiny).get("vocab", 1000))


def build(name: str, tiny: bool = False, seed: int = 0, overrides: dict[str, Any] | None = None):
    """The eval-mode ``nn.Module`` of zoo entry ``name`` with seeded random weights;
    ``overrides`` replace builder arguments that leave the input alone (depth, width)."""
    import torch

    from .cnns import randomize_norms

    entry = ZOO[name]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    return randomize_norms(_builder(entry)(**{**entry.kwargs(tiny), **(overrides or {})}), gen)


def export(name: str, tiny: bool = False, seed: int = 0,
           overrides: dict[str, Any] | None = None) -> onnx.ModelProto:
    """FP32 ONNX (opset 17, TorchScript exporter: ``dynamo=False``) of zoo entry ``name``;
    input ``input``, output ``output``."""
    import torch

    entry = ZOO[name]
    module = build(name, tiny, seed, overrides)
    shape = input_shape(entry, tiny)
    x = (torch.zeros(shape, dtype=torch.int64) if entry.input == "tokens"
         else torch.zeros(shape))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), buf, input_names=["input"], output_names=["output"],
                          opset_version=OPSET, do_constant_folding=True, dynamo=False)
    return onnx.load_from_string(buf.getvalue())


def feeds(name: str, n: int, seed: int, tiny: bool = False) -> list[Feed]:
    """``n`` seeded inputs: photo-like images, noisy tones for audio, random token ids."""
    entry = ZOO[name]
    shape = input_shape(entry, tiny)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        if entry.input == "image":
            x = image_like(shape, rng)
        elif entry.input == "audio":
            t = np.arange(shape[-1]) / 8000.0
            f = rng.uniform(100, 2000, 3)
            x = sum(np.sin(2 * np.pi * fi * t + rng.uniform(0, 6.3)) for fi in f) / 3
            x = (x + rng.normal(0, 0.05, t.shape)).reshape(shape).astype(np.float32)
        else:
            x = rng.integers(0, vocab(entry, tiny), shape).astype(np.int64)
        out.append({"input": x})
    return out
