"""The bundled demo: a per-channel requantized int8 matmul, run and checked on the simulator."""

from __future__ import annotations

import numpy as np

from .hw.config import HardwareConfig
from .isa.program import Program
from .isa.semantics import quantize_multiplier
from .programs.matmul import _ceil, matmul_program, pack_weights, pad_cols, reference_matmul

DEMO_SHAPE = (256, 512, 384)  # M, N, K: a 256-token, 384->512 projection


def demo_inputs(cfg: HardwareConfig, m: int, n: int, k: int,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random int8 activations and weights, and REQUANT parameters that map the
    accumulators back to the int8 range (per output channel)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    nb = _ceil(n, cfg.block_out)
    qp = np.zeros((nb, 2, cfg.block_out), dtype=np.int32)
    for j in range(n):
        mult, shift = quantize_multiplier(float(rng.uniform(0.5, 2.0)) / (16 * np.sqrt(k) * 64))
        qp[j // cfg.block_out, :, j % cfg.block_out] = (mult, shift)
    return pad_cols(x, cfg.block_in), w, qp


def demo_program(cfg: HardwareConfig, seed: int = 0) -> tuple[Program, dict, np.ndarray]:
    """(program with constant weights, its inputs, the numpy reference output)."""
    m, n, k = DEMO_SHAPE
    x, w, qp = demo_inputs(cfg, m, n, k, seed)
    prog = matmul_program(cfg, m, n, k, w=w, qparams=qp, name="demo_matmul_256x512x384")
    return prog, {"x": x}, reference_matmul(x, w, qp, cfg)


__all__ = ["demo_program", "demo_inputs", "pack_weights", "DEMO_SHAPE"]
