"""``prepare``: a PyTorch module -> the same network whose forward pass is the DSA's.

The module is traced with ``torch.fx``; batch norms are folded into the convolutions
before them (as PTQ folds them), and each convolution / linear layer with its fused
ReLU or Clip, each residual add and each global average pool becomes a layer of
:mod:`.layers`. Anything else stays FP32 and is named in the report with the reason.
Calibration runs the FP32 network with PTQ's observers, so a prepared module starts
where ``dsa_tvm.quantize`` would put the model.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from ..quant.observers import METHODS
from ..quant.qparams import WEIGHT_BITS
from . import graph as G
from .attention import FixedGrid, MatMulLayer, SoftmaxInputGrid, SoftmaxLayer
from .errors import QatError
from .grouped import check_group
from .grouped import fits as group_fits
from .layernorm import LayerNormLayer, layer_norm_params
from .layers import (
    WEIGHT_CLIPS,
    AddLayer,
    Grid,
    MeanLayer,
    SameGrid,
    WeightedLayer,
    _Integer,
    grids,
    set_mode,
)
from .outliers import split_all as _split_outliers
from .precision import set_bits
from .rmsnorm import FloatRMSNorm, RMSNormLayer, is_rms_norm_module, rms_norm_params
from .smooth import Smooth, check_alpha, migrate
from .wide import widen_stream


@dataclass
class QatReport:
    """What ``prepare`` made of each node."""

    layers: list[tuple[str, str]] = field(default_factory=list)     # (layer, kind)
    fp32: list[tuple[str, str, str]] = field(default_factory=list)  # (node, op, why)
    folded: list[tuple[str, str]] = field(default_factory=list)     # (node, into)
    removed: list[tuple[str, str]] = field(default_factory=list)    # (node, why)
    side_paths: dict[str, list[int]] = field(default_factory=dict)  # layer -> FP32 channels
    side_inputs: dict[str, list[int]] = field(default_factory=dict)  # layer -> FP32 features
    wide: list[str] = field(default_factory=list)                  # grids on int16
    narrow: list[tuple[str, str]] = field(default_factory=list)    # (grid, why it stays int8)

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for _, k in self.layers:
            kinds[k] = kinds.get(k, 0) + 1
        lines = [f"integer layers: {len(self.layers)} (" +
                 ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())) + ")"]
        if self.folded:
            lines.append(f"folded into their convolution / linear layer: {len(self.folded)} "
                         f"(batch norms, activations, zero padding)")
        if self.wide:
            lines.append(f"int16 grids (the norm stream): {len(self.wide)}")
        lines += [f"  int8, not int16: {n}: {why}" for n, why in self.narrow]
        lines += [f"  removed: {n}: {why}" for n, why in self.removed]
        lines += [f"  FP32: {n} ({op}): {why}" for n, op, why in self.fp32]
        lines += [f"  FP32 side path: {n}: output channels {rows} (outliers, as PTQ splits "
                  f"them)" for n, rows in self.side_paths.items()]
        lines += [f"  FP32 side path: {n}: input features {cols} (outliers of its FP32 "
                  f"input, as PTQ splits them)" for n, cols in self.side_inputs.items()]
        return "\n".join(lines)


class _Tracer(fx.Tracer):
    """fx's tracer, with RMSNorm modules kept as one node (:mod:`.rmsnorm` checks what
    they compute, rather than matching six decomposed ops)."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return is_rms_norm_module(m) or super().is_leaf_module(m, qualname)


def _trace(module: nn.Module) -> fx.GraphModule:
    try:
        return fx.GraphModule(module, _Tracer().trace(module), type(module).__name__)
    except Exception as e:  # noqa: BLE001 - fx raises many kinds; all mean "not traceable"
        raise QatError(f"torch.fx cannot trace {type(module).__name__}: {str(e).splitlines()[0]}; "
                       f"move data-dependent control flow out of forward(), or wrap the "
                       f"untraceable part with torch.fx.wrap") from None


def _as_args(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    args = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if not args or not all(isinstance(a, torch.Tensor) for a in args):
        raise QatError("example_inputs must be a tensor or a tuple of tensors, one per forward() "
                       "argument, e.g. torch.randn(1, 3, 224, 224)")
    return tuple(args)


def _fold_bn(w: torch.Tensor, b: torch.Tensor | None, bn: nn.BatchNorm2d
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Conv weights and bias with an inference-mode batch norm folded in (float64)."""
    mean, var = bn.running_mean.double(), bn.running_var.double()
    gamma = torch.ones_like(mean) if bn.weight is None else bn.weight.detach().double()
    beta = torch.zeros_like(mean) if bn.bias is None else bn.bias.detach().double()  # affine=False
    inv = gamma / torch.sqrt(var + bn.eps)
    w2 = w.detach().double() * inv.reshape(-1, 1, 1, 1)
    b0 = torch.zeros_like(mean) if b is None else b.detach().double()
    b2 = (b0 - mean) * inv + beta
    return w2.float(), b2.float()


class _Rewriter:
    """Builds the prepared graph node by node (old graph order is topological)."""

    def __init__(self, gm: fx.GraphModule, bits: int, method: str, symmetric: bool,
                 smooth: float | None = None, quantize_norms: frozenset[str] = frozenset()) -> None:
        self.gm, self.bits, self.method, self.symmetric = gm, bits, method, symmetric
        self.smooth = smooth
        self.quantize_norms = quantize_norms
        self.smoothed: dict[fx.Node, tuple[Smooth, fx.Node]] = {}  # FP32 node -> its grid
        self.modules = dict(gm.named_modules())
        self.graph = fx.Graph()
        self.env: dict[fx.Node, fx.Node] = {}
        self.grid: dict[fx.Node, Grid] = {}        # new node -> the grid its values lie on
        self.quantized: dict[fx.Node, fx.Node] = {}  # float new node -> its Grid node
        self.skip: set[fx.Node] = set()
        self.report = QatReport()
        self.names: set[str] = set()
        self.pads: dict[fx.Node, tuple[int, int, int, int]] = {}  # conv -> padding it absorbs
        for n in gm.graph.nodes:
            src = n.args[0] if n.args else None
            if isinstance(src, fx.Node) and len(src.users) == 1 and \
                    isinstance(G.conv_params(n, self.modules, self.attr), tuple):
                pad = G.zero_pad(src, self.modules)
                if pad is not None:
                    self.pads[n] = pad
                    self.skip.add(src)

    def attr(self, n: Any) -> Any:
        if isinstance(n, fx.Node) and n.op == "get_attr":
            obj: Any = self.gm
            for part in str(n.target).split("."):
                obj = getattr(obj, part)
            return obj
        return n

    def add(self, base: str, mod: nn.Module, args: tuple) -> fx.Node:
        name = "qat_" + base.replace(".", "_")
        i = 0
        while hasattr(self.gm, name):
            i += 1
            name = f"qat_{base}_{i}"
        self.gm.add_submodule(name, mod)
        self.modules[name] = mod
        return self.graph.call_module(name, args)

    def on_grid(self, old: fx.Node, kind: type[Grid] = Grid) -> tuple[fx.Node, Grid]:
        """The new node of ``old`` on an int8 grid (a quantizing ``kind`` of Grid added once
        if its producer is FP32)."""
        new = self.env[old]
        if new in self.grid:
            return new, self.grid[new]
        if new not in self.quantized:
            g = kind(self.method, self.symmetric)
            q = self.add(f"{old.name}_quant", g, (new,))
            self.grid[q] = g
            self.quantized[new] = q
        q = self.quantized[new]
        return q, self.grid[q]

    def on_smoothed_grid(self, old: fx.Node) -> tuple[fx.Node, Grid, Smooth]:
        """``old`` (an FP32 value a linear layer reads) divided by SmoothQuant's scales,
        then on an int8 grid; one per value, shared by every linear layer reading it."""
        new = self.env[old]
        if new not in self.smoothed:
            sm = Smooth(int(old.meta["tensor_meta"].shape[-1]))
            scaled = self.add(f"{old.name}_smooth", sm, (new,))
            g = Grid(self.method, self.symmetric)
            q = self.add(f"{old.name}_quant", g, (scaled,))
            self.grid[q] = g
            self.smoothed[new] = (sm, q)
        sm, q = self.smoothed[new]
        return q, self.grid[q], sm

    def copy(self, n: fx.Node) -> fx.Node:
        return self.graph.node_copy(n, lambda a: self.env[a])

    def integer(self, n: fx.Node, chain: list[fx.Node], layer: _Integer, args: tuple,
                kind: str) -> None:
        name = G.source_name(n)
        if name in self.names:
            name = n.name
        self.names.add(name)
        layer.name = name
        new = self.add(name, layer, args)
        for c in chain:
            self.env[c] = new
        self.skip.update(chain[1:])
        self.grid[new] = layer.out
        self.report.layers.append((name, kind))

    def weighted(self, n: fx.Node) -> bool:
        conv = G.conv_params(n, self.modules, self.attr)
        lin = None if conv is not None else G.linear_params(n, self.modules, self.attr)
        found = conv if conv is not None else lin
        if found is None:
            return False
        if isinstance(found, str):
            self.fp32(n, found)
            return True
        chain = [n]
        if conv is not None:
            w, b, kw = found
            (u,) = n.users if len(n.users) == 1 else (None,)
            bn = G.module(u, self.modules) if u is not None else None
            if isinstance(bn, nn.BatchNorm2d) and bn.track_running_stats and \
                    bn.running_mean is not None:
                w, b = _fold_bn(w, b, bn)
                chain.append(u)
                self.report.folded.append((u.name, n.name))
        else:
            w, b = found
            kw = None
        fused = G.fusable_activation(chain[-1], self.modules)
        act = None
        if fused is not None:
            chain.append(fused[0])
            act = fused[1]
            self.report.folded.append((fused[0].name, n.name))
        src = n.args[0]
        pad = self.pads.get(n)
        if pad is not None:
            src = src.args[0]
            self.report.folded.append((n.args[0].name, n.name))
        kind = "conv2d" if conv is not None else "linear"
        sm = None
        if self.smooth is not None and kind == "linear" and self.env[src] not in self.grid:
            x, gx, sm = self.on_smoothed_grid(src)
        else:
            x, gx = self.on_grid(src)
        layer = WeightedLayer(kind, w, b, gx, act, self.bits, self.method, self.symmetric, kw,
                              pad)
        if sm is not None:
            sm.consumers.append(layer)
        self.integer(n, chain, layer, (x,), kind)
        return True

    def attention(self, n: fx.Node) -> bool:
        """Attention's integer ops (``quantize_norms``): a product of two activations, a
        last-axis softmax, a LayerNorm module. False when ``n`` is none of them."""
        if G.is_activation_matmul(n, self.modules):
            (a, ga), (b, gb) = self.on_grid(n.args[0]), self.on_grid(n.args[1])
            layer: _Integer = MatMulLayer(ga, gb, self.method, self.symmetric)
            self.integer(n, [n], layer, (a, b), "batch_matmul")
            return True
        if "softmax" in self.quantize_norms and G.is_last_axis_softmax(n, self.modules):
            x, gx = self.on_grid(n.args[0], SoftmaxInputGrid)
            self.integer(n, [n], SoftmaxLayer(gx, self.method, self.symmetric), (x,), "softmax")
            return True
        found = layer_norm_params(n, self.modules, self.attr) \
            if "layer_norm" in self.quantize_norms else None
        if found is not None:
            if isinstance(found, str):
                self.fp32(n, found)
                return True
            width = int(n.args[0].meta["tensor_meta"].shape[-1])
            x, gx = self.on_grid(n.args[0])
            layer = LayerNormLayer(gx, *found, width, self.method, self.symmetric)
            self.integer(n, [n], layer, (x,), "layer_norm")
            return True
        return False

    def rms_norm(self, n: fx.Node) -> bool:
        """An RMSNorm node: integer (``quantize_norms`` with "rms_norm"), or FP32 in ops the
        exporter writes. False when ``n`` is none."""
        found = rms_norm_params(n, self.modules)
        if found is None:
            return False
        if isinstance(found, str) or "rms_norm" not in self.quantize_norms:
            m = G.module(n, self.modules)
            if isinstance(m, nn.RMSNorm):   # aten::rms_norm has no ONNX export at opset 17
                self.env[n] = self.add(n.name, FloatRMSNorm(m), (self.env[n.args[0]],))
            else:
                self.env[n] = self.copy(n)
            why = found if isinstance(found, str) else \
                "quantize_norms without 'rms_norm': the norm runs in FP32 on the host"
            self.report.fp32.append((n.name, G.describe(n, self.modules), why))
            return True
        width = int(n.args[0].meta["tensor_meta"].shape[-1])
        x, gx = self.on_grid(n.args[0])
        self.integer(n, [n], RMSNormLayer(gx, *found, width, self.method, self.symmetric), (x,),
                     "rms_norm")
        return True

    def fp32(self, n: fx.Node, why: str) -> None:
        self.env[n] = self.copy(n)
        self.report.fp32.append((n.name, G.describe(n, self.modules), why))

    def visit(self, n: fx.Node) -> None:
        if n in self.skip:
            return
        if n.op in ("placeholder", "get_attr", "output") or not G.is_tensor(n) or \
                G.is_shape_arithmetic(n, self.modules):
            self.env[n] = self.copy(n)
            return
        if self.weighted(n):
            return
        if self.quantize_norms and self.attention(n):
            return
        if self.rms_norm(n):
            return
        if G.is_add(n, self.modules) and all(isinstance(a, fx.Node) and self.env[a] in self.grid
                               for a in n.args[:2]):
            # an integer add joins two integer layers (a CNN's residual); an add with an FP32
            # operand (a transformer's residual from a LayerNorm, an attention mask onto the
            # scores) stays FP32, as PTQ keeps it, rather than forcing a grid on it
            fused = G.fusable_activation(n, self.modules)
            (a, ga), (b, gb) = self.on_grid(n.args[0]), self.on_grid(n.args[1])
            layer = AddLayer([ga, gb], fused and fused[1], self.method, self.symmetric)
            chain = [n] + ([fused[0]] if fused else [])
            self.integer(n, chain, layer, (a, b), "add")
            return
        keepdim = G.spatial_mean(n, self.modules)
        if keepdim is not None:
            x, gx = self.on_grid(n.args[0])
            self.integer(n, [n], MeanLayer(gx, keepdim, self.method, self.symmetric), (x,),
                         "global_avg_pool")
            return
        if G.is_dropout(n, self.modules):
            self.env[n] = self.env[n.args[0]]
            self.report.removed.append((n.name, "dropout: fine-tuning runs without it, as "
                                                "the DSA runs"))
            return
        src = n.args[0] if n.args else None
        on_grid = isinstance(src, fx.Node) and self.env[src] in self.grid
        act = G.activation(n, self.modules)
        if on_grid and act is not None and act[0] <= 0.0 <= act[1]:  # a clamp in codes
            g = self.grid[self.env[src]]
            self.env[n] = self.add(n.name, SameGrid(g, act), (self.env[src],))
            self.grid[self.env[n]] = g
            self.report.layers.append((n.name, "clip"))
            return
        if on_grid and (G.is_movement(n, self.modules) or G.is_max_pool(n, self.modules)
                        or (self.quantize_norms and G.is_transpose(n, self.modules))):
            g = self.grid[self.env[src]]
            moved = self.copy(n)
            self.env[n] = self.add(f"{n.name}_grid", SameGrid(g), (moved,))
            self.grid[self.env[n]] = g
            if G.is_max_pool(n, self.modules):
                self.report.layers.append((n.name, "max_pool"))
            return
        if G.is_movement(n, self.modules):
            self.env[n] = self.copy(n)
            return
        why = ("batch norm not after a convolution" if isinstance(G.module(n, self.modules),
                                                                   nn.BatchNorm2d)
               else "no integer layer mirrors it in dsa_tvm.qat; it runs in FP32")
        self.fp32(n, why)


def calibrate(module: fx.GraphModule, batches: Iterable[Sequence[torch.Tensor]],
              bias_correction: bool = True) -> int:
    """Observe every grid over ``batches`` (FP32 forward), then set scales and (as PTQ)
    correct the biases for the weights' rounding; returns the number of batches.

    Calibrating again starts afresh (observers, input means and bias corrections reset;
    learned scales back to the calibrated ones): pruning recalibrates this way, and the
    result is what preparing the pruned network would give. Each weighted layer keeps
    its input channel means, so its bias correction can be re-derived when its weights
    change without new data (:func:`.sparsity.prune`)."""
    batches = list(batches)
    alpha = getattr(module, "qat_smooth", None)
    if alpha is not None:   # SmoothQuant's scales first, measured in FP32, set once
        set_mode(module, "float")
        migrate(module, batches, alpha)
    if getattr(module, "qat_outliers", False):  # PTQ's outlier split, chosen once
        set_mode(module, "float")
        inputs, outputs = _split_outliers(module, batches)   # one FP32 pass for both
        module.qat_report.side_inputs.update(inputs)
        module.qat_report.side_paths.update(outputs)
    for g in grids(module):
        g.reset()
    for m in module.modules():
        if isinstance(m, WeightedLayer):
            m.input_means, m.bias_shift = None, None
    set_mode(module, "observe")
    count = 0
    with torch.no_grad():
        for args in batches:
            module(*args)
            count += 1
    if not count:
        raise QatError("calibration data is empty; pass at least one batch")
    for g in grids(module):
        g.calibrate()
    set_mode(module, "quant")
    for m in module.modules():
        if isinstance(m, WeightedLayer):
            m.clip_weights(getattr(module, "qat_weight_clip", "max"))
            if bias_correction:
                m.correct_bias()
    return count


#: the row ops ``prepare(..., quantize_norms=...)`` can make integer
NORM_KINDS = ("softmax", "layer_norm", "rms_norm")


def norm_kinds(choice: bool | Iterable[str]) -> frozenset[str]:
    """``quantize_norms`` as a set of kinds (True: every one; False: none)."""
    if choice is None or isinstance(choice, bool):
        return frozenset(NORM_KINDS if choice else ())
    if isinstance(choice, str):
        choice = [choice]
    try:
        kinds = frozenset(choice)
    except TypeError:
        raise QatError(f"quantize_norms={choice!r}: pass True, False or some of "
                       f"{NORM_KINDS}") from None
    unknown = sorted(kinds - set(NORM_KINDS))
    if unknown:
        raise QatError(f"quantize_norms: unknown kind(s) {unknown}; pass True, False or some "
                       f"of {NORM_KINDS}")
    return kinds


def _module(module: Any) -> tuple[nn.Module, bool]:
    """(the FP32 module, whether onnx2torch built it): an ``onnx.ModelProto`` or a path
    is converted (:mod:`.from_onnx`)."""
    from .from_onnx import convert, is_converted

    if isinstance(module, nn.Module):
        return module, is_converted(module)
    if isinstance(module, (str, Path)) or type(module).__name__ == "ModelProto":
        return convert(module), True
    raise QatError(f"prepare takes a torch.nn.Module, an onnx.ModelProto or an .onnx path, "
                   f"got {type(module).__name__}")


def prepare(module: nn.Module | Any, example_inputs: Any, calibration_data: Iterable[Any] | None = None,
            bits: int = 8, method: str = "minmax", learn_scales: bool = False,
            learn_weight_scales: bool = False, weight_clip: str = "max",
            symmetric_activations: bool = False,
            layer_bits: dict[str, int] | None = None,
            bias_correction: bool = True, smooth: float | None = None,
            split_outliers: bool = False, weight_group: int = 0,
            quantize_norms: bool | Iterable[str] = False,
            wide_norms: bool = False) -> fx.GraphModule:
    """``module`` rewritten so its forward pass is the DSA's integer computation, with
    straight-through gradients for fine-tuning.

    ``module``: a torch module, or an ONNX model (``onnx.ModelProto`` or an ``.onnx``
    path) converted with onnx2torch (:mod:`.from_onnx`; convert it yourself with
    ``from_onnx.convert`` to keep the FP32 teacher);
    ``example_inputs``: one forward's arguments (the export's input shapes);
    ``calibration_data``: batches (each a tensor or tuple of tensors) for PTQ's observers,
    default the example; ``bits``: weight width (8, or 4 for W4A8), ``layer_bits`` per
    layer by source module path (:mod:`.precision` picks them); ``learn_scales``: train
    activation scales (LSQ); ``learn_weight_scales``: train each output channel's weight
    scale too (LSQ; it starts at PTQ's max|w| / qmax and may learn to clip: worth it at 4
    bits); ``weight_clip``: where 4-bit weight scales start, "max" (PTQ's max|w| / qmax)
    or "mse" (each channel's clipping with the least rounding error; calibrating again,
    e.g. after pruning, searches again); ``bias_correction``: as PTQ's. The result carries
    ``.qat_report`` (what became which layer, what stays FP32 and why) and is in ``quant``
    mode. ``smooth``: SmoothQuant's alpha for linear layers that read an FP32 value (a
    transformer's LayerNorm outputs; :mod:`.smooth`), None to leave them as they are;
    ``split_outliers``: PTQ's outlier split, a linear layer's outlier output channels and
    its FP32 input's outlier features in FP32 side paths on the host (:mod:`.outliers`;
    for transformers); ``weight_group``
    (16, 32, 64 or 128): the weights of linear layers and pointwise (1x1, stride 1, no
    padding) convs on a ``bits``-bit grid per that many input rows (channels) with an
    offset, the DSA's grouped dense (:mod:`.grouped`; 0: per channel);
    ``quantize_norms``: as PTQ's, for a DSA with ``[norm]`` units: last-axis softmax,
    LayerNorm and RMSNorm integer (:mod:`.attention`, :mod:`.layernorm`, :mod:`.rmsnorm`),
    and with them the products of two activations (PTQ always makes those int8; QAT only
    with this option); True for all, or the kinds to make integer, e.g. ``{"softmax"}``
    (LayerNorm's int8
    output loses the outlier split on post-norm BERTs, see docs/qat.md); ``wide_norms``
    (with a norm in ``quantize_norms``): the norm stream on int16 grids as PTQ's
    ``wide_norms`` puts it, every integer norm's input and output and the residual
    add's inputs before it (:mod:`.wide`; the export is then at opset 21).
    """
    if bits not in WEIGHT_BITS:
        raise QatError(f"bits={bits!r}: weights are int8 or int4; pass 8 or 4")
    check_group(weight_group)
    if method not in METHODS:
        raise QatError(f"calibration method {method!r} is not one of {METHODS}")
    if weight_clip not in WEIGHT_CLIPS:
        raise QatError(f"weight_clip={weight_clip!r}: choose one of {WEIGHT_CLIPS}")
    kinds = norm_kinds(quantize_norms)
    if wide_norms and not kinds & {"layer_norm", "rms_norm"}:
        raise QatError("wide_norms widens the integer norms' streams: pass quantize_norms="
                       "True (or a set with 'layer_norm' or 'rms_norm') with it (CLI: "
                       "--quantize-norms --wide-norms)")
    module, converted = _module(module)
    args = _as_args(example_inputs)
    # a copy: FP32 ops keep their parameters, which training must not move in the caller's
    # module (it is the teacher)
    module = copy.deepcopy(module).eval()
    # onnx2torch's graph is taken as built: tracing it again would enter its modules
    gm = module if converted else _trace(module)
    ShapeProp(gm).propagate(*args)
    check_alpha(smooth)
    rw = _Rewriter(gm, bits, method, symmetric_activations, smooth, kinds)
    for n in gm.graph.nodes:
        rw.visit(n)
    out = fx.GraphModule(gm, rw.graph, class_name=f"Qat{type(module).__name__}")
    out.graph.eliminate_dead_code()
    out.recompile()
    out.qat_report = rw.report
    out.qat_example = args
    out.qat_bits = bits
    out.qat_bias_correction = bias_correction  # a later calibration (after pruning) repeats it
    out.qat_weight_clip = weight_clip
    out.qat_smooth = smooth
    out.qat_outliers = split_outliers
    out.qat_symmetric = symmetric_activations
    batches = [args] if calibration_data is None else [_as_args(b) for b in calibration_data]
    out.qat_weight_group = weight_group
    for m in out.modules():
        if isinstance(m, WeightedLayer) and weight_group and group_fits(m, weight_group):
            m.group = weight_group
    if wide_norms:
        rw.report.wide, rw.report.narrow = widen_stream(out)
        if not rw.report.wide and not rw.report.narrow:
            rw.report.narrow.append(("the norm stream", "no integer norm in the model, so "
                                     "wide_norms widens nothing"))
    if layer_bits:
        set_bits(out, layer_bits)
    try:
        calibrate(out, batches, bias_correction)
    except RuntimeError as e:
        if not converted:
            raise
        # an exporter bakes the example's batch into constants (a Reshape to [1, ...])
        shapes = sorted({tuple(b[0].shape) for b in batches})
        raise QatError(f"the ONNX model does not run on calibration batches of shape "
                       f"{shapes} ({str(e).splitlines()[0]}); it was likely exported at a "
                       f"fixed batch: export it with a dynamic batch, or pass batches of "
                       f"its input shape") from None
    for g in grids(out):
        g.gain.requires_grad_(learn_scales and not isinstance(g, FixedGrid))
    for m in out.modules():
        if isinstance(m, WeightedLayer):
            m.weight_gain.requires_grad_(learn_weight_scales)
    return out
