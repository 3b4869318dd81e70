"""Integer layer descriptions: the contract between the graph passes and the DSA codegen.

The graph passes (``relay_passes``) turn each offloaded Relax region of a
quantized (QDQ) model into a :class:`Region` of these layers, with every real
scale already folded into integer parameters. The codegen turns a Region into
one DSA program; ``tir_schedules.kinds.run_region`` runs the same Region on the
CPU with the same integer semantics (``dsa_tvm.isa.semantics``), so the two
agree bit for bit.

Conventions
-----------
* Tensors are int8 with an affine quantization ``real = scale * (q - zero_point)``;
  a layer that says so may write an int16 output (``QTensor.dtype``: a wide tensor such
  as an LLM's residual stream, stored by ACC16 and clamped by REQUANT's wide mode).
  Shapes are the logical shapes of the Relax graph: NCHW for images, (M, K) or
  (B, M, K) for matrices.
* Weights are int8 and symmetric (zero point 0), per output channel; a
  :class:`GroupedDense`'s carry a scale and an offset per group of input rows instead.
* Every layer ends in a :class:`Requant`: ``y = clamp(rshift_round(acc * m[c], s[c]) + zp,
  lo, hi)`` with ``m``, ``s`` per output channel (length 1 = per tensor) and
  ``[lo, hi]`` within [-128, 127] (activations such as ReLU/ReLU6 are folded in).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

# the layers and types defined beside this module, re-exported: importers name this one
from .ir_grouped import GroupedDense  # noqa: F401
from .ir_units import LayerNorm, RMSNorm, Rope, Softmax, Table, WideTable  # noqa: F401
from .qtensor import WIDE_CLIP, QTensor, Requant  # noqa: F401


@dataclass(frozen=True)
class Conv2d:
    """acc[o] = bias[o] + sum over taps of (x - x.zero_point) * w[o]  (pads count as x.zero_point)."""

    name: str
    input: QTensor           # NCHW
    output: QTensor          # NCHW
    weight: np.ndarray       # int8 [O, I // groups, KH, KW]
    bias: np.ndarray         # int32 [O] (zeros when the model has none)
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]
    groups: int
    requant: Requant
    #: a transposed conv run over its zero-inserted input (:class:`Dilate`) counts only its
    #: own MACs (input pixels x C_out x taps), not the array's products with inserted zeros
    useful_macs: int | None = None

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.input.shape[1] == self.weight.shape[0]

    @property
    def array_macs(self) -> int:
        """The products the array performs (zeros of a zero-inserted input included)."""
        o, ipg, kh, kw = self.weight.shape
        n, _, oh, ow = self.output.shape
        return n * o * oh * ow * ipg * kh * kw

    @property
    def macs(self) -> int:
        return self.array_macs if self.useful_macs is None else self.useful_macs


@dataclass(frozen=True)
class Dense:
    """acc[m, n] = bias[n] + sum_k (x[m, k] - x.zero_point) * w[n, k]; leading dims are rows.

    ``planes``: the input holds int16 codes as two int8 byte planes (``x = 256 hi + lo``,
    zero point 0) stacked on the rows axis, the second-to-last: (..., 2M, K), rows
    ``0..M-1`` hi, ``M..2M-1`` lo; output (..., M, N). The two sums join in the
    accumulator as ``acc = (acc_hi << (8 - lo_shift)) + rshift_round(acc_lo, lo_shift)``
    (int32 wrap), the product on the grid of ``2**lo_shift`` input steps (0: exact),
    before the bias and requantize (``layers.reference.join_planes_shifted``)."""

    name: str
    input: QTensor           # (..., K); planes: (..., 2M, K)
    output: QTensor          # (..., N); planes: (..., M, N)
    weight: np.ndarray       # int8 [N, K]
    bias: np.ndarray         # int32 [N]
    requant: Requant
    planes: bool = False
    lo_shift: int = 0        # planes: the lo sums' right shift in the join (0..8)

    @property
    def macs(self) -> int:
        rows = int(np.prod(self.input.shape[:-1]))
        return rows * self.weight.shape[0] * self.weight.shape[1]


@dataclass(frozen=True)
class BatchMatmul:
    """acc[b, m, n] = sum_k (a[b, m, k] - a.zero_point) * (b[b, k, n] - b.zero_point).

    Both operands are activations (attention: Q @ K^T, P @ V). ``on_device``: ``b`` has
    zero point 0 and is made in the region by a :class:`Permute` with ``weight_tiles``
    (laid out as the array's weight tiles; with ``column_sums = -zp_a`` it also writes the
    correction for ``a``'s zero point), so nothing comes from the host; otherwise the host
    packs both operands at the region boundary."""

    name: str
    a: QTensor               # (B, M, K): leading dimensions of the graph flattened into B
    b: QTensor               # (B, K, N)
    output: QTensor          # (B, M, N)
    requant: Requant
    on_device: bool = False
    #: ``a`` is int16 codes as int8 byte planes, rows interleaved ((B, 2M, K): row 2m the
    #: high byte ``hi``, row 2m + 1 the rest ``lo``, ``a = 256 hi + lo``, zero point 0, as
    #: :class:`Softmax` with ``planes`` writes them): the planes' sums are joined exactly in
    #: int32, ``acc = 256 (hi @ b) + lo @ b``, before the one requantize
    planes: bool = False

    @property
    def macs(self) -> int:
        return int(np.prod(self.a.shape, dtype=np.int64)) * self.b.shape[-1]


@dataclass(frozen=True)
class Pool2d:
    """max: y = requant(max over the window of (x - zp_in)), pads never win;
    avg: y = requant(sum over the window of (x - zp_in)) with 1/count folded into the
    multiplier (count_include_pad, or no padding, so the count is constant)."""

    name: str
    kind: str                # "max" | "avg"
    input: QTensor           # NCHW
    output: QTensor          # NCHW
    kernel: tuple[int, int]
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    requant: Requant

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class GlobalAvgPool:
    """y[n, c] = requant(sum over H, W of (x - zp_in)), 1/(H*W) folded into the multiplier."""

    name: str
    input: QTensor           # NCHW
    output: QTensor          # (N, C, 1, 1) or (N, C)
    requant: Requant

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class Add:
    """acc = (a - a.zp) * a_mult + (b - b.zp) * b_mult (int32); y = requant(acc).

    The two rescale factors share the requant's shift: with ``requant.multiplier = [1]``
    and ``shift = [n]``, ``a_mult ~ a.scale / y.scale * 2**n``. ``b`` has a's shape, or
    broadcasts to it (numpy rules) with all its channels (a per-channel gate
    ``[N, C, 1, 1]``): the binary room (``tir_schedules.kinds.binary``) runs those."""

    name: str
    a: QTensor
    b: QTensor               # same shape as a, or broadcasting to it (same channels)
    output: QTensor
    a_mult: int
    b_mult: int
    requant: Requant

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class BiasAdd:
    """acc = (x - x.zp) * x_mult + bias[c] (int32); y = requant(acc): an Add whose second
    operand is a per-channel constant (a matmul bias the exporter left as its own Add).

    ``bias`` already holds ``(b - b.zp) * b_mult`` per channel (channels: axis 1 of NCHW,
    the last axis otherwise), at the requant's shift like :class:`Add`'s factors."""

    name: str
    input: QTensor
    output: QTensor
    x_mult: int
    bias: np.ndarray         # int32 [C]
    requant: Requant

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class AddConst:
    """acc = (x - x.zp) * x_mult + c * c_mult; y = requant(acc): an activation plus a
    constant tensor (attention's mask), ``c`` the int8 codes of the constant on a grid of
    its own (zero point 0) in the output's logical shape (broadcast over its leading
    axes by the front end)."""

    name: str
    input: QTensor
    output: QTensor
    x_mult: int
    c_mult: int
    const: np.ndarray        # int8, output.shape's element count, in its element order
    requant: Requant

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class Rescale:
    """y = requant(x - x.zp): a change of scale and/or a clip (standalone ReLU, QDQ chains)."""

    name: str
    input: QTensor
    output: QTensor
    requant: Requant

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class Concat:
    """y = the inputs side by side along ``axis`` (1: channels of NCHW); every input and the
    output share one scale and zero point, so it is a copy (no requant)."""

    name: str
    inputs: tuple[QTensor, ...]
    output: QTensor
    axis: int = 1

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class Resize:
    """Nearest-neighbour upsampling by integer factors: y[n, c, i, j] = x[n, c, i // sh, j // sw];
    input and output share one scale and zero point (a copy)."""

    name: str
    input: QTensor           # NCHW
    output: QTensor          # NCHW, (H * sh, W * sw)
    scale: tuple[int, int]

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class Slice:
    """A channel block of an NCHW image: y = x[:, begin:begin + C_out]; or, with ``axis``
    the second-to-last of a 2-, 3- or 5-D rows tensor, a run of its rows:
    y = x[..., begin:begin + L_out, :]. Input and output share one scale, zero point and
    dtype (a copy)."""

    name: str
    input: QTensor           # NCHW (or rows)
    output: QTensor          # NCHW, C_out channels (or L_out rows)
    begin: int               # first input channel (or row)
    axis: int = 1

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class BytePlanes:
    """int16 codes (zero point 0) as two int8 byte planes stacked on the rows axis (the
    second-to-last), a plane dense's input (``Dense.planes``): (..., M, K) -> (..., 2M, K);
    for each leading index rows ``0..M-1`` hold ``hi = clamp(rshift_round(x, 8), int8)``
    and rows ``M..2M-1`` ``lo = clamp(x - 256 hi, int8)``, so ``x = 256 hi + lo`` (an
    ``x`` from 32640 up counts as 32639). Output int8, zero point 0, the input's scale."""

    name: str
    input: QTensor           # int16 (..., M, K)
    output: QTensor          # int8 (..., 2M, K)

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class Dilate:
    """Zero insertion by integer factors, the first half of a transposed conv:
    y = x.zero_point everywhere but y[n, c, i * sh, j * sw] = x[n, c, i, j]; output
    (N, C, (H - 1) * sh + 1, (W - 1) * sw + 1), input and output on one grid (a copy)."""

    name: str
    input: QTensor           # NCHW
    output: QTensor          # NCHW
    factor: tuple[int, int]

    @property
    def macs(self) -> int:
        return 0


@dataclass(frozen=True)
class Interleave:
    """Phases woven into one image, the last half of a transposed conv whose kernel equals
    its stride: y[n, c, i * sh + a, j * sw + b] = inputs[a * sw + b][n, c, i, j]; every
    input (N, C, H, W), output (N, C, H * sh, W * sw), all on one grid (a copy)."""

    name: str
    inputs: tuple[QTensor, ...]
    output: QTensor
    factor: tuple[int, int]

    @property
    def macs(self) -> int:
        return 0


@dataclass
class Region:
    """A connected group of layers offloaded together, in topological order."""

    name: str
    inputs: list[QTensor]
    outputs: list[QTensor]
    layers: list[Layer] = field(default_factory=list)

    @property
    def macs(self) -> int:
        return sum(ly.macs for ly in self.layers)

    def readers(self) -> dict[str, int]:
        """How many layer inputs of the region read each tensor (by name)."""
        out: dict[str, int] = {}
        for ly in self.layers:
            for t in layer_inputs(ly):
                out[t.name] = out.get(t.name, 0) + 1
        return out


def reader_layers(layers: list[Layer]) -> dict[str, list[Layer]]:
    """The layers that read each tensor (by name), in ``layers``' order: what a rewrite
    that replaces a tensor must check (who else reads it) before it may."""
    out: dict[str, list[Layer]] = {}
    for ly in layers:
        for t in layer_inputs(ly):
            out.setdefault(t.name, []).append(ly)
    return out


def layer_inputs(layer: Layer) -> list[QTensor]:
    """The tensors a layer reads: its QTensor fields (and tuples of them) but ``output``,
    in field order."""
    out: list[QTensor] = []
    for f in fields(layer):
        v = getattr(layer, f.name)
        if f.name == "output":
            continue
        if isinstance(v, QTensor):
            out.append(v)
        elif isinstance(v, tuple) and v and all(isinstance(t, QTensor) for t in v):
            out.extend(v)
    return out


@dataclass(frozen=True)
class Mul:
    """acc = (a - a.zp) * (b - b.zp) (int32, |acc| <= 2**16); y = requant(acc) with the
    requant's factor ``a.scale * b.scale / y.scale``.

    Two activations (an SE channel gate, SiLU's ``x * sigmoid(x)``): ``b`` has a's shape,
    or broadcasts to it (numpy rules) with all its channels (``[N, C, 1, 1]`` against
    ``[N, C, H, W]``; ``[B, 1, C]`` against ``[B, T, C]``). The output has a's shape."""

    name: str
    a: QTensor
    b: QTensor
    output: QTensor
    requant: Requant

    @property
    def macs(self) -> int:
        return 0




@dataclass(frozen=True)
class Permute:
    """Data movement between layouts: ``y = transpose(reshape(x, view), perm)``, read in
    the element order of ``output.shape`` (a reshape alone: ``perm`` the identity). The
    input and output shapes are the views the region lays them out in (rows of the last
    axis, or NCHW images), so a reshape that keeps the element order may still move
    bytes; one scale and zero point (a copy). ``then``: more (view, perm) steps after the
    first (a graph's reshape -> permute_dims -> reshape chain). ``weight_tiles``: the
    output is the second operand of an on-device :class:`BatchMatmul` and is laid out in
    DRAM as its weight tiles (``tir_schedules.kinds.permute``); the values are the same."""

    name: str
    input: QTensor
    output: QTensor
    view: tuple[int, ...]
    perm: tuple[int, ...]
    then: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    weight_tiles: bool = False
    #: weight tiles only: also write ``column_sums * sum_k b[k, n]`` (int32) per batch and
    #: column, the matmul's correction for its first operand's zero point (``-zp_a``)
    column_sums: int = 0

    @property
    def macs(self) -> int:
        return 0

    def steps(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        return ((tuple(self.view), tuple(self.perm)),) + tuple(self.then)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The logical movement on an array of ``input.shape`` (any dtype)."""
        return moved(x, self.steps(), self.output.shape)


def moved(x: np.ndarray, steps, shape) -> np.ndarray:
    """``x`` through a movement's (view, perm) steps, as ``shape``: each step reshapes to
    its view and transposes by its perm (the region's movement, or the host's copy of it)."""
    for view, perm in steps:
        x = np.transpose(x.reshape(view), perm)
    return x.reshape(shape)


@dataclass(frozen=True)
class TilesAppend:
    """A KV cache's rows joined with the new rows, laid out as an on-device
    :class:`BatchMatmul`'s weight tiles (``y = the Permute steps of concat([cache, input],
    axis)``), written in place: the host lays ``cache`` out in the joined operand's tiles
    and the region writes only the tiles the new rows fill. What a rows :class:`Concat`
    and a ``weight_tiles`` :class:`Permute` compute, without copying the cache through
    DRAM (``lowering.cache_tiles``). ``joined``: the concat's output shape (``axis`` is
    its axis); every tensor shares one grid (a copy)."""

    name: str
    cache: QTensor           # a region input, as the concat's first input
    input: QTensor           # the new rows, as the concat's second input
    output: QTensor          # (B, K, N): the matmul's second operand
    joined: tuple[int, ...]
    axis: int
    steps: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    column_sums: int = 0     # as Permute's: ``column_sums * sum_k b`` per batch and column

    @property
    def macs(self) -> int:
        return 0

    def apply(self, cache: np.ndarray, new: np.ndarray) -> np.ndarray:
        """The logical result on the two arrays (any dtype)."""
        x = np.concatenate([cache.reshape(self.cache.shape), new.reshape(self.input.shape)],
                           self.axis)
        return moved(x, self.steps, self.output.shape)


#: every layer a Region may hold
Layer = (Conv2d | Dense | BatchMatmul | Pool2d | GlobalAvgPool | Add | BiasAdd | AddConst
         | Rescale | Concat | Resize | Slice | BytePlanes | Dilate | Interleave | Mul | Permute
         | TilesAppend | Softmax | LayerNorm | RMSNorm | Table | WideTable | Rope
         | GroupedDense)
