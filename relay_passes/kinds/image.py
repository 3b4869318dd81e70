"""Constraints of the kinds that slide a window over an NCHW image (conv2d, the 2-D pools)."""

from __future__ import annotations

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa.formats import DRAM_SIZE_BITS, PAD_BITS, addr_bits

from .common import MAX_DMA, MAX_PAD
from .match import Match


def pads(m: Match, cfg: HardwareConfig) -> str | None:
    p = [int(v) for v in m.op.attrs.padding]
    if max(p) > MAX_PAD:
        return f"padding {p} exceeds the {PAD_BITS}-bit LOAD pad fields (max {MAX_PAD})"
    return None


def strides(m: Match, cfg: HardwareConfig) -> str | None:
    limit = (1 << addr_bits(cfg.inp_depth)) - 1
    st = [int(s) for s in m.op.attrs.strides]
    if min(st) < 1 or max(st) > limit:
        return f"strides {st} outside 1..{limit} (GEMM input-stride field, {addr_bits(cfg.inp_depth)} bits)"
    return None


def image_dma(m: Match, cfg: HardwareConfig) -> str | None:
    _, c, h, w = m.inputs[0].shape
    _, oc, oh, ow = m.out_shape
    pitch_in = w * ceil_div(c, cfg.block_in)
    pitch_out = ow * ceil_div(oc, cfg.block_out)
    if max(pitch_in, pitch_out, h, oh) > MAX_DMA:
        return (f"image row pitch {max(pitch_in, pitch_out)} elements or height {max(h, oh)} "
                f"exceeds the {DRAM_SIZE_BITS}-bit DMA size/stride fields (max {MAX_DMA})")
    return None
