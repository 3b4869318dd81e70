"""global_avg_pool: ``quantize(mean(dq(x), axis=[2, 3]))`` of an NCHW tensor.

REQUANT factor ``M = s_in / (s_out * H * W)``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm.relax.dpl import DFPattern

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.layers.ir import GlobalAvgPool, Layer, QTensor

from .common import Constraint, common_constraints
from .match import Match, Reader, Root
from .scales import requant
from .spec import Kind, unary


def _variants() -> list[tuple[str, DFPattern]]:
    return [("plain", unary("relax.mean"))]


def _read(r: Reader, root: Root) -> Match:
    op = r.need(root.body, "relax.mean")
    return root.match("global_avg_pool", op, [r.operand(op.args[0])])


def rescale_factors(m: Match) -> np.ndarray:
    s_in, s_out = float(m.inputs[0].qp.scale[0]), float(m.out.scale[0])
    h, w = m.inputs[0].shape[2:]
    return np.array([s_in / (s_out * h * w)])


def _axes(m: Match, cfg: HardwareConfig) -> str | None:
    axes = [int(v) for v in (m.op.attrs.axis or [])]
    shape = m.inputs[0].shape
    if len(shape) != 4 or sorted(a % 4 for a in axes) != [2, 3]:
        return f"mean over axes {axes} of a rank-{len(shape)} tensor (only H, W of NCHW)"
    if shape[2] * shape[3] * 255 >= 2 ** 31:
        return f"H*W = {shape[2] * shape[3]} values would overflow the int32 sum"
    return None


def _to_layer(m: Match, name: str, inputs: list[QTensor], output: QTensor) -> Layer:
    # without keepdims the (N, C) mean is the (N, C, 1, 1) pool's bytes: the pool's view
    img = dataclasses.replace(output, shape=(*output.shape[:2], 1, 1))
    return GlobalAvgPool(name, inputs[0], img, requant(rescale_factors(m), m))


KINDS = (Kind(
    "global_avg_pool", 500, _variants, _read,
    common_constraints(rescale_factors) + [
        Constraint("axes", "mean over H and W of an NCHW tensor, H*W*255 < 2^31", _axes),
    ],
    _to_layer, "GlobalAveragePool, ReduceMean over H, W",
    "relax.mean"),)
