"""The DSA's integer arithmetic inside a PyTorch forward pass.

Products of int8 codes run as float32 convolutions / matmuls, which are exact while
every partial sum stays below 2**24; longer reductions split the weight codes into
two nibbles (``w = 16 * hi + lo``) or, past that, run in float64. The output stage
(bias, REQUANT, zero point, clamp) is :mod:`dsa_tvm.isa.semantics` itself, the code
the simulator runs, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..isa import semantics as sem
from ..layers.reference import join_planes_shifted, split_planes

#: float32 holds every integer below this exactly
F32_EXACT = 1 << 24
#: the largest |x - zero_point| of an int8 activation
MAX_CENTRED = 255


def int_product(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor,
                w: torch.Tensor, reduction: int, w_max: int) -> np.ndarray:
    """``op(x, w)`` (a convolution or matmul of centred activation codes ``x`` and weight
    codes ``w``, integer-valued float tensors) exactly: int32 when every sum fits float32
    (so it fits int32 too), else int64. ``reduction``: terms per output, ``w_max``: the
    largest |weight code|."""
    with torch.no_grad(), torch.backends.nnpack.flags(enabled=False):  # no Winograd
        if MAX_CENTRED * w_max * reduction < F32_EXACT:
            return op(x, w).numpy().astype(np.int32)
        if MAX_CENTRED * 15 * reduction < F32_EXACT:
            lo = torch.remainder(w, 16)
            hi = (w - lo) / 16
            return (op(x, hi).numpy().astype(np.int64) * 16
                    + op(x, lo).numpy().astype(np.int64))
        return op(x.double(), w.double()).numpy().astype(np.int64)


def plane_product(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor,
                  w: torch.Tensor, reduction: int, w_max: int, lo_shift: int) -> np.ndarray:
    """``op(x, w)`` for int16 codes ``x`` (zero point 0) as the DSA's dense computes it
    (``relay_passes.kinds.dense_planes``): ``x`` split into int8 byte planes (``x`` from
    32640 up counts as 32639), each plane's exact product, joined in the accumulator with
    the lo plane's sums shifted right by ``lo_shift`` (int32)."""
    hi, lo = split_planes(x.numpy().astype(np.int64))
    sums = [int_product(op, torch.from_numpy(p.astype(np.float32)), w, reduction, w_max)
            for p in (hi, lo)]
    return join_planes_shifted(np.stack(sums, axis=-2), lo_shift)[..., 0, :]


def output_stage(acc: np.ndarray, bias: np.ndarray | int, factors: np.ndarray, zero_point: int,
                 clip: tuple[int, int], axis: int) -> np.ndarray:
    """int8 codes of accumulators (int32 or int64): the simulator's
    :func:`~dsa_tvm.isa.semantics.output_stage` (bias added with int32 wrap-around,
    REQUANT, zero point, clamp to ``clip``) with one multiplier/shift per real factor along
    ``axis`` (or one for all)."""
    mult, shift = sem.quantize_multipliers(factors)
    shape = [1] * acc.ndim
    if mult.size > 1:
        shape[axis] = mult.size
    b = np.asarray(bias, np.int32)
    if b.ndim:
        b = b.reshape(shape)
    return sem.output_stage(acc, b, mult.astype(np.int64).reshape(shape),
                            shift.astype(np.int64).reshape(shape), zero_point, clip[0], clip[1])


def add_codes(a: np.ndarray, b: np.ndarray, a_mult: int, b_mult: int, shift: int,
              zero_point: int, clip: tuple[int, int]) -> np.ndarray:
    """The DSA's Add of centred codes: ``(a * a_mult + b * b_mult) >> shift`` rounded,
    plus the zero point, clamped (``layers.ir.Add``)."""
    acc = sem.wrap_int32(a.astype(np.int64) * a_mult + b.astype(np.int64) * b_mult)
    return sem.requantize(acc, 1, shift, zero_point, clip[0], clip[1])
