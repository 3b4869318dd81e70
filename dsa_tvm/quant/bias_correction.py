"""Bias correction: cancel the mean output shift that rounding the weights causes.

Rounding each weight to int8 moves every output channel's mean by
E[(W - W_q) x] = (W - W_q) . E[x] (linear in the per-channel input mean, zero padding
aside). Depthwise layers with few weights per channel suffer most; folding the predicted
shift into the bias removes it for free (cf. Nagel et al., "Data-Free Quantization").
"""

from __future__ import annotations

import numpy as np


def conv_shift(dw: np.ndarray, x_mean: np.ndarray, groups: int) -> np.ndarray:
    """Per-output-channel mean shift of a conv with weight error ``dw`` [O, I/g, kh, kw]
    for input channel means ``x_mean`` [C_in]."""
    o, ig = dw.shape[:2]
    per = dw.reshape(o, ig, -1).sum(-1).astype(np.float64)            # [O, I/g]
    xm = np.asarray(x_mean, np.float64).reshape(groups, ig)           # [g, I/g]
    return (per.reshape(groups, o // groups, ig) * xm[:, None, :]).sum(-1).reshape(o)


def dense_shift(dw: np.ndarray, x_mean: np.ndarray, transposed: bool) -> np.ndarray:
    """Mean shift of a dense layer: weight error [N, K] if ``transposed`` else [K, N]."""
    dw = dw.astype(np.float64)
    xm = np.asarray(x_mean, np.float64)
    return dw @ xm if transposed else xm @ dw
