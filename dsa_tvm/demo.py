"""The bundled demo: an int8 matmul with a per-channel bias + requantize + ReLU output stage,
run and checked on the simulator."""

from __future__ import annotations

import numpy as np

from .hw.config import HardwareConfig
from .isa.program import Program
from .isa.semantics import quantize_multiplier
from .programs.matmul import (
    matmul_program,
    pack_qparams,
    pack_weights,
    pad_cols,
    reference_matmul,
)

DEMO_SHAPE = (256, 512, 384)  # M, N, K: a 256-token, 384->512 projection


def demo_inputs(cfg: HardwareConfig, m: int, n: int, k: int,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random int8 activations and weights, and the per-output-channel output stage
    (bias, REQUANT multiplier and shift; see ``pack_qparams``) that maps the
    accumulators back to the int8 range."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    ms = [quantize_multiplier(float(rng.uniform(0.5, 2.0)) / (16 * np.sqrt(k) * 64))
          for _ in range(n)]
    bias = rng.integers(-64 * 128 * 16, 64 * 128 * 16, n)
    qp = pack_qparams([mult for mult, _ in ms], [shift for _, shift in ms], cfg, bias=bias)
    return pad_cols(x, cfg.block_in), w, qp


#: the demo's output zero point and fused ReLU clamp
DEMO_ZERO_POINT = -10
DEMO_CLAMP = (DEMO_ZERO_POINT, 127)


def demo_program(cfg: HardwareConfig, seed: int = 0) -> tuple[Program, dict, np.ndarray]:
    """(program with constant weights, its inputs, the numpy reference output): bias,
    requantize, zero point and ReLU fused in one ALU REQUANT per tile."""
    m, n, k = DEMO_SHAPE
    x, w, qp = demo_inputs(cfg, m, n, k, seed)
    prog = matmul_program(cfg, m, n, k, w=w, qparams=qp, name="demo_matmul_256x512x384",
                          output_zp=DEMO_ZERO_POINT, clamp=DEMO_CLAMP)
    return prog, {"x": x}, reference_matmul(x, w, qp, cfg, DEMO_ZERO_POINT, DEMO_CLAMP)


__all__ = ["demo_program", "demo_inputs", "pack_weights", "DEMO_SHAPE"]
