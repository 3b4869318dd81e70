"""The integer softmax / LayerNorm / RMSNorm semantics, as the layer IR sees them.

They are defined once, in :mod:`dsa_tvm.isa.intnorm` (the ``NORM`` instruction's
semantics, which the simulator runs); this module re-exports them for the layer side
(the integer reference, the front end's parameter folding)."""

from ..isa.intnorm import (  # noqa: F401
    BETA_BITS,
    BETA_STEPS,
    EXP_FRAC,
    EXP_ZERO_SPAN,
    MAX_ROW,
    NormParams,
    SoftmaxParams,
    int_exp,
    int_norm,
    int_reciprocal,
    int_rsqrt,
    int_softmax,
    norm_params,
    softmax_params,
)

__all__ = ["BETA_BITS", "BETA_STEPS", "EXP_FRAC", "EXP_ZERO_SPAN", "NormParams", "SoftmaxParams",
           "int_exp", "int_norm",
           "int_reciprocal", "int_rsqrt", "int_softmax", "norm_params", "softmax_params", "MAX_ROW"]
