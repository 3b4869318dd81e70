"""What a kind module declares (:class:`Kind`), and the DPL pieces its patterns are built from.

Weights and biases are ``dequantize(int8/int32 constant)`` inside the patterns
(FoldConstant must not run first: it would turn them into float constants and
lose the integers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from .common import Constraint, ToLayer
from .match import Match, Reader, Root

#: codegen of layers whose operands the host packs: regions of their own
HOST_PACKED = "dsa_hostpacked"
#: every codegen name a DSA region function carries
CODEGENS = ("dsa", HOST_PACKED)

#: the activations a conv, dense or add fuses (None: none), in pattern order
ACTS: tuple[str | None, ...] = ("relu", "clip", None)


def dq(data: DFPattern | None = None) -> DFPattern:
    """``dequantize(data, scale, zero_point)`` with constant qparams (data: any, if None)."""
    return is_op("relax.dequantize")(data if data is not None else wildcard(), is_const(), is_const())


def q(body: DFPattern) -> DFPattern:
    """``quantize(body, scale, zero_point)`` with constant qparams: every pattern's root."""
    return is_op("relax.quantize")(body, is_const(), is_const())


def act(body: DFPattern, name: str | None) -> DFPattern:
    """``body`` under the fused activation ``name`` (one of ACTS)."""
    if name == "relu":
        return is_op("relax.nn.relu")(body)
    if name == "clip":
        return is_op("relax.clip")(body, wildcard(), wildcard())
    return body


def moved() -> DFPattern:
    """An int8 tensor, possibly through a reshape/permute_dims chain of up to two moves
    (attention's head split and merge): the pattern takes the moves in, the region makes
    them a :class:`~dsa_tvm.layers.ir.Permute` (``Reader.operand(..., moves=True)``)."""
    x = wildcard()

    def rs(e: DFPattern) -> DFPattern:
        return is_op("relax.reshape")(e, wildcard())

    def pm(e: DFPattern) -> DFPattern:
        return is_op("relax.permute_dims")(e)

    return pm(rs(x)) | rs(pm(x)) | pm(x) | rs(x) | x


def unary(op: str) -> DFPattern:
    """``quantize(op(dequantize(x)))``: a one-input layer."""
    return q(is_op(op)(dq()))


def conv_variants(op_name: str) -> Callable[[], list[tuple[str, DFPattern]]]:
    """The variants of a conv-like kind: ``quantize(act(op(dq(x), dq(W)) [+ dq(bias)]))``,
    with and without the bias, under each of :data:`ACTS`."""
    def pattern(bias: bool, act_name: str | None) -> DFPattern:
        conv = is_op(op_name)(dq(), dq(is_const()))
        if bias:
            b = dq(is_const())
            conv = is_op("relax.add")(conv, b | is_op("relax.reshape")(b, wildcard()))
        return q(act(conv, act_name))

    return lambda: [(variant_name(bias, a), pattern(bias, a)) for bias in (True, False)
                    for a in ACTS]


def variant_name(bias: bool, act_name: str | None) -> str:
    """The variant's name in the table: ``bias+relu``, ``clip``, ``plain``, ..."""
    return "+".join(["bias"] * bias + [act_name] * (act_name is not None)) or "plain"


@dataclass(frozen=True)
class PatternSpec:
    """One entry of the pattern table: composite name, DPL pattern, layer kind."""

    name: str
    pattern: DFPattern
    kind: str
    variant: str
    priority: int


@dataclass(frozen=True)
class Kind:
    """Everything the front end knows about one layer kind, declared by its module.

    ``priority`` places the kind's patterns in the table (higher first, see
    ``kinds.__init__``); ``variants`` builds them, larger first; ``read`` turns the
    match rooted at a quantize back into a :class:`Match`; ``constraints`` are checked
    in order (the registry appends the codegen one); ``to_layer`` converts a match to
    the integer layer IR; ``onnx`` names the ONNX operators it covers (operator table);
    ``anchor`` is the op the kind is named after (``Match.op``; None: the quantize).
    """

    name: str
    priority: int
    variants: Callable[[], list[tuple[str, DFPattern]]]
    read: Callable[[Reader, Root], Match]
    constraints: list[Constraint]
    to_layer: ToLayer
    onnx: str
    anchor: str | None
    codegen: str = "dsa"

    @property
    def composite(self) -> str:
        return f"{self.codegen}.{self.name}"

    def specs(self) -> list[PatternSpec]:
        return [PatternSpec(self.composite, p, self.name, v, self.priority)
                for v, p in self.variants()]
