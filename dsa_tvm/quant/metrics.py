"""Accuracy metrics of an int8 tensor against its FP32 reference (numpy, float64)."""

from __future__ import annotations

import math

import numpy as np


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays, flattened. Two all-zero arrays agree (1.0); an
    all-zero array against a non-zero one does not (0.0): a model that outputs only
    zeros where the reference does not is not "similar"."""
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    return float(a @ b / (na * nb + 1e-30))


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB: 10 log10(|ref|^2 / |ref - got|^2)."""
    ref, got = np.ravel(ref).astype(np.float64), np.ravel(got).astype(np.float64)
    noise = float(np.sum((ref - got) ** 2))
    signal = float(np.sum(ref ** 2))
    if noise == 0:
        return math.inf
    return 10 * math.log10(max(signal, 1e-300) / noise)


def topk_agreement(ref: np.ndarray, got: np.ndarray, k: int) -> float:
    """Fraction of rows whose FP32 top-1 class is among the int8 top-k (k=1: same argmax).

    Quantized logits tie often; ties go to the lower class index, as in ``np.argmax``
    (a stable sort), so k=1 never counts a tie as agreement by luck of the sort."""
    ref, got = np.atleast_2d(ref), np.atleast_2d(got)
    ref, got = ref.reshape(ref.shape[0], -1), got.reshape(got.shape[0], -1)
    top1 = ref.argmax(1)
    topk = np.argsort(-got, axis=1, kind="stable")[:, :k]
    return float(np.mean([t in row for t, row in zip(top1, topk)]))
