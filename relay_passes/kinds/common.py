"""Constraints every kind shares, and the one type they all are.

A constraint's ``test`` returns None when the match satisfies it, else the reason
(with the offending numbers). Limits are never restated by hand: they come from
the config (scratchpad depths) and the ISA field widths.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.isa.formats import DRAM_SIZE_BITS, PAD_BITS
from dsa_tvm.layers.ir import Layer, QTensor
from dsa_tvm.lowering.region import layers_supported, lowering_supports

from .match import Match, qtensor

MAX_PAD = (1 << PAD_BITS) - 1
MAX_DMA = (1 << DRAM_SIZE_BITS) - 1

Test = Callable[[Match, HardwareConfig], "str | None"]
#: a kind's conversion of a match to the integer layer IR: (match, name, inputs, output) -> layer
#: match, layer name, inputs, output -> the layer (or layers, in order: a transposed conv)
ToLayer = Callable[[Match, str, list[QTensor], QTensor], "Layer | tuple[Layer, ...]"]
#: the real factors a kind's REQUANT must represent (float64, one per channel or one)
Factors = Callable[[Match], np.ndarray]


@dataclass(frozen=True)
class Constraint:
    """One named DSA constraint; ``doc`` says it for the operator table (``{cfg}`` fields allowed)."""

    name: str
    doc: str
    test: Test


def _activation_types(wide_output: bool, wide_inputs: bool) -> Test:
    """Inputs int8 (or int16 where the kind reads them: ACC16 loads); the output int8, or
    int16 where the kind's output stage writes one (REQUANT's wide mode, an ACC16 store)
    with no fused activation to fold into its clip."""
    ins = ("int8", "int16") if wide_inputs else ("int8",)

    def test(m: Match, cfg: HardwareConfig) -> str | None:
        for i, op in enumerate(m.inputs):
            if op.qp.dtype not in ins:
                return f"input {i} is {op.qp.dtype}, the DSA's activations are {cfg.input_dtype}"
        if m.out.dtype == "int16" and wide_output:
            if m.act is not None:
                return (f"a fused {m.act[0]} on an int16 output (REQUANT's wide mode clamps "
                        f"to int16 only)")
            return None
        if m.out.dtype != "int8":
            wide = " or int16" if wide_output else ""
            return f"output is quantized to {m.out.dtype}, the DSA stores {cfg.input_dtype}{wide}"
        return None

    return test


def _per_tensor(m: Match, cfg: HardwareConfig) -> str | None:
    for i, op in enumerate(m.inputs):
        if not op.qp.per_tensor:
            return f"input {i} has {op.qp.scale.size} scales (activations need one scale/zero point)"
    if not m.out.per_tensor:
        return f"output has {m.out.scale.size} scales (activations need one scale/zero point)"
    return None


def _positive_scales(m: Match, cfg: HardwareConfig) -> str | None:
    for qp, what in [(o.qp, f"input {i}") for i, o in enumerate(m.inputs)] + [(m.out, "output")]:
        if not np.all(qp.scale > 0):
            return f"{what} scale {qp.scale.tolist()} is not positive"
    return None


def _requant_range(factors: Factors, limit: float) -> Test:
    def test(m: Match, cfg: HardwareConfig) -> str | None:
        f = factors(m)
        if not np.all(f > 0):
            return f"rescale factor {f.min():g} is not positive"
        if f.max() >= limit:
            return f"rescale factor {f.max():g} (input/output scales) is >= {limit:g}"
        return None

    return test


def _activation(m: Match, cfg: HardwareConfig) -> str | None:
    if m.act is None:
        return None
    _, lo, hi = m.act
    if not lo <= hi or math.isnan(lo) or math.isnan(hi):
        return f"clip bounds [{lo}, {hi}] are empty"
    return None


def layouts(data: str, kernel: str) -> Test:
    """The constraint that a conv-like op's data / kernel / output layouts are these."""
    def test(m: Match, cfg: HardwareConfig) -> str | None:
        a = m.op.attrs
        lay = (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout))
        if lay != (data, kernel, data):
            return f"layouts must be {data}/{kernel}/{data}, got {'/'.join(lay)}"
        return None

    return test


def viewed(view: Callable[[Match], Match], test: Test) -> Test:
    """``test`` applied to the match as ``view`` sees it (a conv1d or a transposed conv
    checked as the conv2d it becomes)."""
    def wrapped(m: Match, cfg: HardwareConfig) -> str | None:
        return test(view(m), cfg)

    return wrapped


def common_constraints(factors: Factors, limit: float = 2.0 ** 31,
                       wide_output: bool = False, wide_inputs: bool = False) -> list[Constraint]:
    """The constraints every kind starts with; ``factors`` are the kind's rescale factors,
    ``limit`` the bound REQUANT (or the kind's integer arithmetic) puts on them;
    ``wide_output`` / ``wide_inputs``: the kind may write / read int16 tensors."""
    out = "int8 or int16 (no fused activation)" if wide_output else "int8"
    ins = "int8 or int16" if wide_inputs else "int8 (`{cfg.input_dtype}`)"
    return [
        Constraint("dtypes", f"activations {ins} in, {out} out",
                   _activation_types(wide_output, wide_inputs)),
        Constraint("per_tensor_activations", "one scale and zero point per activation tensor",
                   _per_tensor),
        Constraint("positive_scales", "positive scales", _positive_scales),
        Constraint("requant_range", "input/output rescale factor representable by REQUANT "
                   "(< 2^31; residual add < 2^21)", _requant_range(factors, limit)),
        Constraint("activation", "fused ReLU/Clip with a non-empty range (folded into the "
                   "REQUANT clip)", _activation),
    ]


def codegen_constraint(to_layer: ToLayer) -> Constraint:
    """The last constraint of every kind: ask the codegen itself
    (``dsa_tvm.lowering.region.lowering_supports``) about the layer the match becomes,
    so a layer it cannot lower stays on the CPU alone instead of failing the
    compilation of its whole region."""
    def test(m: Match, cfg: HardwareConfig) -> str | None:
        ins = [qtensor(f"in{i}", op.source_shape or op.shape, op.qp)
               for i, op in enumerate(m.inputs)]
        out = qtensor("out", m.out_shape, m.out)
        made = to_layer(m, "layer", ins, out)
        if not isinstance(made, tuple):
            return lowering_supports(made, cfg)
        return layers_supported(made, ins, made[-1].output, cfg)

    return Constraint("codegen", "the DSA codegen lowers the layer and a schedule fits the "
                      "scratchpads (`dsa_tvm.lowering.region.lowering_supports`)", test)

