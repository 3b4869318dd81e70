"""QDQ quantization with onnxruntime's static quantizer, calibration inputs, and ORT runs.

onnxruntime is imported lazily (it is only needed here, not by the builders).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..intmath import ceil_div
from ..quant.metrics import cosine  # noqa: F401 - one cosine, re-exported by dsa_tvm.models
from .graph import input_kind

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)

Feed = dict[str, np.ndarray]


def _input_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    inits = {i.name for i in model.graph.initializer}
    shapes = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = tuple(d.dim_value if d.dim_value > 0 else 1 for d in dims)
    return shapes


def image_like(shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """A photo-like NCHW float32 batch: smooth colour blobs + a gradient + fine noise in
    [0, 1], then ImageNet mean/std normalization (so values are roughly in [-2, 2.6])."""
    n, c, h, w = shape
    lh, lw = max(1, h // 8), max(1, w // 8)
    low = rng.uniform(0, 1, (n, c, lh, lw)).astype(np.float32)
    img = np.repeat(np.repeat(low, ceil_div(h, lh), axis=2), ceil_div(w, lw), axis=3)[:, :, :h, :w]
    for axis in (2, 3):  # box blur of the blocky upsample, twice
        for _ in range(2):
            img = (np.roll(img, 1, axis) + img + np.roll(img, -1, axis)) / 3
    ramp = np.linspace(-0.15, 0.15, w, dtype=np.float32)[None, None, None, :] * rng.choice([-1, 1])
    img = np.clip(img + ramp + rng.normal(0, 0.04, img.shape), 0, 1)
    if c == 3:
        img = (img - IMAGENET_MEAN[None, :, None, None]) / IMAGENET_STD[None, :, None, None]
    else:
        img = (img - 0.45) / 0.225
    return img.astype(np.float32)


def token_embedding_like(shape: Sequence[int], rng: np.random.Generator, vocab: int = 1000) -> np.ndarray:
    """(batch, seq, hidden) BERT-embedding-like rows: a seeded embedding table gathered at
    random token ids, plus sinusoidal positions, layer-normalized per token."""
    b, s, hdim = shape
    table = rng.normal(0, 1, (vocab, hdim)).astype(np.float32)
    ids = rng.integers(0, vocab, (b, s))
    ids[:, 0] = 1  # a fixed [CLS]-like first token
    pos = np.arange(s)[:, None] / np.power(10000.0, (np.arange(hdim) // 2 * 2) / hdim)[None, :]
    pe = np.where(np.arange(hdim) % 2 == 0, np.sin(pos), np.cos(pos)).astype(np.float32)
    e = table[ids] + 0.5 * pe[None]
    e = (e - e.mean(-1, keepdims=True)) / np.sqrt(e.var(-1, keepdims=True) + 1e-12)
    return e.astype(np.float32)


def calibration_data(model: onnx.ModelProto, n: int = 8, seed: int = 0) -> list[Feed]:
    """``n`` deterministic input feeds for ``model``: image-like for CNNs, token-embedding-like
    for the transformer (from the builder's metadata, else guessed from the input rank)."""
    rng = np.random.default_rng(seed)
    shapes = _input_shapes(model)
    kind = input_kind(model)
    feeds: list[Feed] = []
    for _ in range(n):
        feed = {}
        for name, shape in shapes.items():
            k = kind or ("image" if len(shape) == 4 else "tokens" if len(shape) == 3 else "normal")
            if k == "image":
                feed[name] = image_like(shape, rng)
            elif k == "tokens":
                feed[name] = token_embedding_like(shape, rng)
            else:
                feed[name] = rng.normal(0, 1, shape).astype(np.float32)
        feeds.append(feed)
    return feeds


def run_onnxruntime(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray],
                    optimize: bool = True) -> list[np.ndarray]:
    """Run ``model`` once on onnxruntime's CPU provider; outputs in graph order.

    With ``optimize`` (the default, what users get) ORT fuses QDQ groups into integer
    kernels; ``optimize=False`` runs the QDQ graph op by op in float, which is the QDQ
    reference: TVM's llvm build of a QDQ model matches it to within one step. Integer
    kernels are exact on every CPU (see :mod:`dsa_tvm.ort_session`).
    """
    from ..ort_session import session

    return session(model, optimize).run(None, dict(inputs))


def _reader(feeds: Sequence[Feed]):
    """An onnxruntime CalibrationDataReader over a list of feeds."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(list(feeds))

        def get_next(self) -> Feed | None:
            return next(self._it, None)

    return Reader()


def qdq_quantize(model: onnx.ModelProto, calibration: Sequence[Feed], per_channel: bool = True,
                 calibrate_method: str = "MinMax", reduce_range: bool = False,
                 extra_options: dict | None = None) -> onnx.ModelProto:
    """Static int8 QDQ quantization with ``onnxruntime.quantization.quantize_static``:
    QDQ format, int8 activations (asymmetric) and weights (symmetric), per-channel weights,
    calibrated on ``calibration``. Works through a temporary directory.

    Relu and Clip(0, 6) are folded into the output quantization ranges (no node is left).
    ``reduce_range`` (7-bit weights) only matters for onnxruntime's own fused int8 kernels,
    which saturate with full-range int8 weights on AVX2 machines without VNNI.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # it warns about pre-processing on every call
    try:
        with tempfile.TemporaryDirectory(prefix="dsa_tvm_qdq_") as tmp:
            src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "qdq.onnx"
            onnx.save(model, src)
            quantize_static(str(src), str(dst), _reader(calibration), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                            per_channel=per_channel, reduce_range=reduce_range,
                            calibrate_method=getattr(CalibrationMethod, calibrate_method),
                            extra_options=extra_options)
            q = onnx.load(str(dst))
    finally:
        root.setLevel(level)
    # keep the builder's metadata (input kind) on the quantized model
    existing = {p.key for p in q.metadata_props}
    for p in model.metadata_props:
        if p.key not in existing:
            q.metadata_props.add(key=p.key, value=p.value)
    return q


def output_quant_steps(qmodel: onnx.ModelProto) -> dict[str, float | None]:
    """For each graph output of a QDQ model, the scale of the DequantizeLinear that
    produces it (one quantization step), or None if it is not a dequantized tensor."""
    inits = {i.name: numpy_helper.to_array(i) for i in qmodel.graph.initializer}
    producer = {o: n for n in qmodel.graph.node for o in n.output}
    steps: dict[str, float | None] = {}
    for out in qmodel.graph.output:
        node = producer.get(out.name)
        step = None
        if node is not None and node.op_type == "DequantizeLinear" and node.input[1] in inits:
            scale = inits[node.input[1]]
            step = float(scale) if scale.size == 1 else None
        steps[out.name] = step
    return steps


