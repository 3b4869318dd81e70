"""The layers of a prepared module: each computes what the DSA computes.

Every layer runs in one of four modes (set by :func:`dsa_tvm.qat.prepare.set_mode`):

- ``float``: the FP32 model (batch norms already folded);
- ``observe``: FP32, while each output grid's observer records its values (the PTQ
  calibration, same observers and the same scale formulas);
- ``quant``: the forward values are the DSA's integers, dequantized: int8 x int8 products
  exact, then the output stage of :mod:`dsa_tvm.isa.semantics`; the gradients are
  fake quantization's, straight through the rounding (:mod:`.fake_quant`);
- ``export``: the same values, written as QDQ ONNX by the TorchScript exporter.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from relay_passes.kinds.add import ADD_MULT_BITS, WIDE_ADD_MULT_BITS, add_multipliers
from relay_passes.kinds.dense_planes import joined_bias, plane_lo_shift
from relay_passes.kinds.scales import quantized_bound

from ..isa import semantics as sem
from ..layers.qtensor import WIDE_CLIP
from ..quant.bias_correction import conv_shift, dense_shift
from ..quant.insert import quant_dequant as dequantized_weights
from ..quant.observers import ChannelMeanObserver, make_observer
from ..quant.qparams import (
    MIN_SCALE,
    activation_qparams,
    bias_qparams,
    bias_weight_scale_floor,
    clip_ratios,
    quantize_bias,
    quantize_weight,
    weight_qmax,
    weight_qparams,
)
from . import exact, grouped
from .errors import NonFiniteError, QatError
from .fake_quant import activation, codes, fake_quant, straight_through
from .onnx_ops import dequantized_constant, quant_dequant

MODES = ("float", "observe", "quant", "export")
#: where weight scales start (WeightedLayer.clip_weights)
WEIGHT_CLIPS = ("max", "mse")


class Grid(nn.Module):
    """One activation's int8 grid: an observer during calibration, then a scale (learnable
    when ``learn_scale``) and a zero point. As a graph node it quantizes its input (the
    model's inputs, and float values entering an integer layer). ``bits`` 16: a symmetric
    int16 grid (:meth:`widen`; a transformer's norm stream, ``prepare(..., wide_norms=
    True)``)."""

    def __init__(self, method: str = "minmax", symmetric: bool = False) -> None:
        super().__init__()
        self.mode = "float"
        self.method = method
        self.symmetric = symmetric
        self.bits = 8
        self.observer = make_observer(method)
        # scale = base * (1 + gain): the calibrated scale exactly while gain is 0, and an
        # optimizer step moves it by a share of itself, whatever its magnitude (Adam's steps
        # are about the learning rate: on the scale itself they would cross zero)
        self.register_buffer("base", torch.tensor(1.0))
        self.gain = nn.Parameter(torch.tensor(0.0), requires_grad=False)
        self.zero_point = 0
        self.calibrated = False
        # qat.outliers: 0 at the input features an FP32 side path carries (PTQ's input
        # split), 1 elsewhere; the grid then holds the other features only
        self.register_buffer("mask", None)

    @property
    def scale(self) -> torch.Tensor:
        return self.base * (1 + self.gain)

    @property
    def wide(self) -> bool:
        return self.bits == 16

    @property
    def qrange(self) -> tuple[int, int]:
        """The codes' range: int8's, or int16's on a wide grid."""
        return WIDE_CLIP if self.wide else (sem.INT8_MIN, sem.INT8_MAX)

    def widen(self) -> None:
        """Make this an int16 grid, symmetric as PTQ's wide tensors (zero point 0: a
        dense's byte planes need it). Before calibration: the scale is ``max|x| / 32767``."""
        self.bits, self.symmetric = 16, True

    @property
    def s(self) -> float:
        """The scale as a Python float (the float32 value the export writes)."""
        v = float(self.scale.detach())
        if not (math.isfinite(v) and v > 0):
            raise NonFiniteError(f"an activation scale became {v} (learning rate too high for "
                                 f"the scales? lower scale_lr)")
        return v

    def observe(self, x: torch.Tensor) -> None:
        v = x.detach().numpy()
        if not np.isfinite(v).all():
            raise QatError("a calibration batch produced NaN or infinite activations; check "
                             "the calibration inputs (finite, preprocessed like training data)")
        self.observer.update(v)

    def reset(self) -> None:
        """Forget what the observer saw, so calibrating again (after pruning) measures the
        network as it is now, not the union with what it was."""
        self.observer = make_observer(self.method)
        self.calibrated = False

    def calibrate(self) -> None:
        """Scale and zero point from the observed range (``quant.qparams``, as PTQ)."""
        qp = activation_qparams(*self.observer.range(), symmetric=self.symmetric,
                                bits=self.bits)
        self.base = torch.tensor(qp.scale, dtype=torch.float32)
        self.gain.data.zero_()
        self.zero_point = qp.zero_point
        self.calibrated = True

    def quantize(self, y: torch.Tensor) -> torch.Tensor:
        """``y`` on this grid, fake-quantized (quant mode) or as a Q/DQ pair (export)."""
        if self.mode == "export":
            return quant_dequant(y, self.s, self.zero_point, self.bits)
        return fake_quant(y, self.scale, self.zero_point, *self.qrange)

    def dequantize(self, q: np.ndarray) -> torch.Tensor:
        """Float values of int8 (int16) codes ``q`` (DequantizeLinear: ``(q - zp) * scale``)."""
        c = torch.from_numpy(np.asarray(q, np.int64) - self.zero_point).to(torch.float32)
        return c * self.scale.detach()

    def centred(self, x: torch.Tensor) -> np.ndarray:
        """The centred codes ``q - zp`` of values on this grid."""
        return codes(x, self.scale).numpy().astype(np.int64)

    def bounds(self, act: tuple[float, float] | None) -> tuple[int, int]:
        """A fused activation's clamp as int8 codes on this grid (the compiler's rule; a wide
        grid takes none: REQUANT's wide mode clamps to int16 only)."""
        if act is None:
            return self.qrange
        if self.wide:
            raise QatError("an int16 grid cannot hold a fused activation's clamp (the DSA's "
                           "wide REQUANT clamps to int16 only)")
        s = self.s
        return (quantized_bound(act[0], s, self.zero_point),
                quantized_bound(act[1], s, self.zero_point))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mask is not None:
            x = x * self.mask
        if self.mode == "observe":
            self.observe(x)
        if self.mode in ("float", "observe"):
            return x
        return self.quantize(x)


class SameGrid(nn.Module):
    """After an op that keeps its input's grid (flatten, reshape, zero padding, max pool,
    or a ReLU/clamp of its own, ``act``): in ONNX the grid is restated (Q/DQ with the same
    scale), so the DSA's kind for the op runs with a rescale of exactly 1 (or is a move)
    and the integer layer reading the values sees a quantized input."""

    def __init__(self, grid: Grid, act: tuple[float, float] | None = None) -> None:
        super().__init__()
        object.__setattr__(self, "grid", grid)  # owned by its producer
        self.act = act
        self.mode = "float"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = activation(x, self.act)
        if self.mode == "export":
            return self.grid.quantize(y)
        if self.mode != "quant" or self.act is None:
            return y
        g = self.grid
        lo, hi = g.bounds(self.act)  # the REQUANT clip, in codes
        q = np.clip(g.centred(x) + g.zero_point, lo, hi)
        return straight_through(g.quantize(y), g.dequantize(q))


def _pair(v: int | tuple[int, ...] | list[int]) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


class _Integer(nn.Module):
    """A layer whose output is int8 on its own grid ``out``, reading ``inputs``' grids."""

    def __init__(self, inputs: list[Grid], act: tuple[float, float] | None, method: str,
                 symmetric: bool) -> None:
        super().__init__()
        object.__setattr__(self, "inputs", inputs)  # owned by their producers
        self.name = ""  # the source module's path, set by prepare
        self.act = act
        self.out = Grid(method, symmetric)
        self.mode = "float"

    def finish(self, y: torch.Tensor) -> torch.Tensor:
        """Float modes: the activation, observed when calibrating."""
        y = activation(y, self.act)
        if self.mode == "observe":
            self.out.observe(y)
        return y

    def settle(self, y: torch.Tensor, exact_codes: Callable[[], np.ndarray]) -> torch.Tensor:
        """The layer's output from its float result ``y`` in every mode: float modes ``y``
        (activated, observed); export ``y`` on the output grid (its Q/DQ); quant the output
        codes ``exact_codes()`` (called only then) dequantized, with the fake-quantized
        ``y``'s gradient."""
        if self.mode in ("float", "observe"):
            return self.finish(y)
        approx = self.out.quantize(activation(y, self.act))
        if self.mode == "export":
            return approx
        return straight_through(approx, self.out.dequantize(exact_codes()))


def side_path(layer: "WeightedLayer", x: torch.Tensor) -> torch.Tensor:
    """The FP32 side path of a linear layer's outlier output channels: ``x @ W[O].T``
    scattered into the output's channels (a one-hot matmul: plain MatMuls in ONNX, which
    stay on the host). Its bias stays in the integer layer."""
    rows = layer.side_rows
    w = layer.pruned_weight()[rows]
    if layer.mode == "export":
        w = w.detach().clone()
    onehot = torch.zeros(len(rows), layer.weight.shape[0])
    onehot[torch.arange(len(rows)), rows] = 1.0
    return torch.matmul(torch.matmul(x, w.t()), onehot)


def input_side_path(layer: "WeightedLayer", raw: torch.Tensor) -> torch.Tensor:
    """The FP32 side path of a linear layer's outlier input features: ``raw[..., I] @
    W[:, I].T`` from the unquantized input (a Gather and a MatMul in ONNX, on the host),
    where the integer layer reads the input with those features zeroed."""
    cols = layer.side_cols
    w = layer.pruned_weight()[:, cols]
    if layer.mode == "export":
        w = w.detach().clone()
    return torch.matmul(torch.index_select(raw, -1, cols), w.t())


class WeightedLayer(_Integer):
    """Conv2d (groups 1 or depthwise) or a linear layer with int8/int4 per-output-channel
    weights, an int32 bias and a fused ReLU/Clip (``relay_passes.kinds.conv2d``/``dense``)."""

    def __init__(self, kind: str, weight: torch.Tensor, bias: torch.Tensor | None,
                 x: Grid, act: tuple[float, float] | None, bits: int, method: str,
                 symmetric: bool, conv: dict | None = None,
                 pad: tuple[int, int, int, int] | None = None) -> None:
        super().__init__([x], act, method, symmetric)
        self.kind = kind  # "conv2d" | "linear"
        self.weight = nn.Parameter(weight.detach().clone().float())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone().float())
        self.bits = bits
        # weight scales = max|w| / qmax * (1 + weight_gain) per output channel: exactly
        # PTQ's while the gain is 0; learned (LSQ) with prepare(learn_weight_scales=True),
        # where a negative gain clips the largest weights for a finer grid (4 bits)
        self.weight_gain = nn.Parameter(torch.zeros(weight.shape[0]), requires_grad=False)
        self.conv = dict(conv or {})
        self.input_means: ChannelMeanObserver | None = None  # for bias correction
        self.register_buffer("bias_shift", None)  # the correction, quant and export modes only
        # N:M sparsity (qat.sparsity.prune): True where a weight may be nonzero. Applied in
        # every mode, so a pruned weight computes as zero, gets no gradient and exports as
        # code 0 whatever an optimizer does to the parameter behind it
        self.register_buffer("mask", None)
        # qat.adaround: True where a weight's code is floor(w / s) + 1, False where it is
        # floor(w / s) (a learned rounding); None: nearest, as PTQ rounds
        self.register_buffer("round_up", None)
        # qat.outliers: output channels computed in FP32 on the host beside the integer
        # layer (PTQ's outlier split); the integer layer's weights are zero there
        self.register_buffer("side_rows", None)
        # and input features computed that way (PTQ's input split): the input grid zeroes
        # them (Grid.mask), a per-channel layer's weights are zero there too
        self.register_buffer("side_cols", None)
        # qat.analog: reads the products as a CIM part's crossbars would (noise, ADC);
        # None: the DSA's exact integer products
        self.analog = None
        # > 0: a linear layer's weights on a ``bits``-bit grid per that many input rows, a
        # scale and an offset per group (the DSA's grouped dense, :mod:`.grouped`)
        self.group = 0
        self.pad = None  # (left, right, top, bottom) zero padding the convolution cannot state
        if pad is not None:
            left, right, top, bottom = pad
            ph, pw = _pair(self.conv.get("padding", 0))
            if left == right and top == bottom:
                self.conv["padding"] = (ph + top, pw + left)
            else:
                self.pad = pad

    def set_mask(self, mask: torch.Tensor) -> None:
        """Hold the weights where ``mask`` is False at zero (N:M pruning), the parameter
        zeroed there too (so the state dict holds what the layer computes)."""
        self.mask = mask
        self.round_up = None   # a learned rounding (qat.adaround) was for the dense weights
        with torch.no_grad():
            self.weight.mul_(mask)

    def pruned_weight(self) -> torch.Tensor:
        """The parameter with pruned entries zeroed (multiplying by the mask also zeroes
        their gradient)."""
        return self.weight if self.mask is None else self.weight * self.mask

    def masked_weight(self) -> torch.Tensor:
        """The weight the integer layer computes with: pruned entries and the output
        channels of an FP32 side path (:mod:`.outliers`) zeroed; its input features too,
        unless the weights are per group (their input is zero there, so only the grid sees
        them: a zero would widen a one-signed group's grid)."""
        w = self.pruned_weight()
        if self.side_rows is not None:
            w = w.index_fill(0, self.side_rows, 0.0)
        if self.side_cols is not None and not self.group:
            w = w.index_fill(1, self.side_cols, 0.0)
        return w

    @property
    def channel_axis(self) -> int:
        return 1 if self.kind == "conv2d" else -1

    def _op(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.kind == "conv2d":
            if self.pad is not None:  # zeros: the zero point once centred, 0.0 in float
                x = F.pad(x, self.pad)
            return F.conv2d(x, w, b, **self.conv)
        return F.linear(x, w, b)

    def quant_params(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """(weight scales, weight codes, bias scales, bias codes) for the current weights
        and input scale, as PTQ makes them: max|w| / qmax per output channel (times the
        learned ``1 + weight_gain``), raised where the int32 bias would not fit beside the
        worst-case sum."""
        w = self.masked_weight().detach().numpy()
        if not np.isfinite(w).all() or (self.bias is not None
                                        and not torch.isfinite(self.bias).all()):
            raise NonFiniteError(f"layer {self.name}: weights became NaN or infinite (learning "
                                 f"rate too high? lower lr)")
        s_x = self.inputs[0].s
        s_w = self.unfloored_weight_scales(w)
        qb = self.quant_bias()
        b = None if qb is None else qb.detach().numpy()
        if b is not None:
            s_w = np.maximum(s_w, bias_weight_scale_floor(b, s_x, w[0].size))
        wq = self.weight_codes(w, s_w)
        if b is None:
            return s_w, wq, None, None
        s_b = bias_qparams(s_x, s_w, w.shape[0])
        return s_w, wq, s_b, quantize_bias(b, s_b)

    def weight_codes(self, w: np.ndarray, s_w: np.ndarray) -> np.ndarray:
        """The int8-held codes of ``w`` on the scales ``s_w``: nearest, or the learned
        rounding (``round_up``), clipped to [-qmax, qmax]."""
        if self.round_up is None:
            return quantize_weight(w, s_w, 0, self.bits)
        shape = (-1,) + (1,) * (w.ndim - 1)
        q = np.floor(w.astype(np.float64) / s_w.astype(np.float64).reshape(shape))
        q += self.round_up.numpy()
        qmax = weight_qmax(self.bits)
        return np.clip(q, -qmax, qmax).astype(np.int8)

    def unfloored_weight_scales(self, w: np.ndarray) -> np.ndarray:
        """max|w| / qmax per output channel times ``1 + weight_gain`` (float32)."""
        gain = self.weight_gain.detach().numpy().astype(np.float64)
        if not np.isfinite(gain).all() or (gain <= -1).any():
            raise NonFiniteError(f"layer {self.name}: a learned weight scale became zero, "
                                 f"negative or non-finite (scale_lr too high? lower it)")
        s = weight_qparams(w, 0, self.bits).astype(np.float64) * (1 + gain)
        return np.maximum(s, MIN_SCALE).astype(np.float32)

    def clip_weights(self, how: str) -> None:
        """Start the weight scales at ``how``: "max" (PTQ's max|w| / qmax) or "mse" (at 4
        bits, the clipping ratio with the least squared rounding error per output channel,
        :func:`quant.qparams.clip_ratios`; an 8-bit layer keeps max|w|: its rounding error
        is small already, and its largest weights matter)."""
        if how not in WEIGHT_CLIPS:
            raise QatError(f"weight_clip={how!r}: choose one of {WEIGHT_CLIPS}")
        self.round_up = None   # a learned rounding belongs to the old grid
        if how == "max" or self.bits == 8:
            self.weight_gain.data.zero_()
            return
        r = clip_ratios(self.masked_weight().detach().numpy(), 0, self.bits)
        self.weight_gain.data.copy_(torch.from_numpy(r - 1.0))

    def weight_scale_tensor(self, s_w: np.ndarray) -> torch.Tensor:
        """``s_w`` as a tensor; with learned weight scales, carrying LSQ's gradient to
        ``weight_gain`` (the value stays exactly ``s_w``, bias floor included)."""
        t = torch.from_numpy(s_w)
        if not self.weight_gain.requires_grad:
            return t
        base = torch.from_numpy(weight_qparams(self.masked_weight().detach().numpy(), 0,
                                               self.bits))
        return straight_through(base * (1 + self.weight_gain), t)

    def correct_bias(self) -> None:
        """PTQ's bias correction (``quant.bias_correction``): fold the mean output shift that
        rounding the weights causes, predicted from the calibration inputs' channel means,
        into the bias (a layer without one gets one)."""
        if self.input_means is None or self.input_means.count == 0:
            return
        w = self.masked_weight().detach().numpy().astype(np.float64)
        if self.group:   # the grid's own rounding, whatever its offsets
            dw = w - grouped.weight_values(self).reshape(w.shape).astype(np.float64)
        else:
            s_w, wq, _, _ = self.quant_params()
            dw = w - dequantized_weights(wq, s_w, 0)
        mean = self.input_means.mean()
        shift = (conv_shift(dw, mean, int(self.conv.get("groups", 1))) if self.kind == "conv2d"
                 else dense_shift(dw, mean, True))
        if self.bias is None:  # trainable, zero in the FP32 network
            self.bias = nn.Parameter(torch.zeros(w.shape[0]))
        self.bias_shift = torch.from_numpy(shift.astype(np.float32))

    def rederive_bias_correction(self) -> None:
        """Derive the bias correction again, as the first calibration would for the weights
        and width the layer has now (pruned, or set to other bits). Layers without one
        (``bias_correction=False``, never calibrated) keep none."""
        if self.bias_shift is not None and self.input_means is not None:
            self.bias_shift = None
            self.correct_bias()

    def quant_bias(self) -> torch.Tensor | None:
        """The bias the integer layer adds: the trained one plus the correction."""
        if self.bias is None or self.bias_shift is None:
            return self.bias
        return self.bias + self.bias_shift

    def forward(self, x: torch.Tensor, raw: torch.Tensor | None = None) -> torch.Tensor:
        """``raw``: the input before its grid, for an input side path (``side_cols``)."""
        y = self.integer_forward(x)
        if self.side_rows is not None:
            y = y + side_path(self, x)
        if self.side_cols is not None:
            y = y + input_side_path(self, raw)
        return y

    def integer_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer without its FP32 side path: what the DSA computes."""
        if self.mode == "observe":
            if self.input_means is None:
                self.input_means = ChannelMeanObserver(1 if self.kind == "conv2d" else -1)
            self.input_means.update(x.detach().numpy())
        if self.mode in ("float", "observe"):
            return self.finish(self._op(x, self.masked_weight(), self.bias))
        if self.group:
            return grouped.forward(self, x)
        s_w, wq, s_b, bq = self.quant_params()
        sw_t = torch.from_numpy(s_w)
        wq_t = torch.from_numpy(wq)
        if self.mode == "export":
            b = None if bq is None else dequantized_constant(torch.from_numpy(bq),
                                                             torch.from_numpy(s_b))
            if self.kind == "linear" and x.dim() > 2:  # MatMul with a constant (K, N) B, as
                # the compiler's dense kinds read it (F.linear writes a runtime Transpose)
                w_kn = dequantized_constant(wq_t.t().contiguous(), sw_t, axis=1)
                y = torch.matmul(x, w_kn) if b is None else torch.matmul(x, w_kn) + b
                return self.out.quantize(activation(y, self.act))
            w = dequantized_constant(wq_t, sw_t)
            return self.out.quantize(activation(self._op(x, w, b), self.act))
        qmax = weight_qmax(self.bits)
        shape = (-1,) + (1,) * (self.weight.dim() - 1)
        w_fq = fake_quant(self.masked_weight(), self.weight_scale_tensor(s_w).reshape(shape), 0,
                          -qmax, qmax)
        b_fq = None
        if bq is not None:
            b_deq = torch.from_numpy(bq.astype(np.float64) * s_b.astype(np.float64)).float()
            b_fq = straight_through(self.quant_bias(), b_deq)
        approx = self.out.quantize(activation(self._op(x, w_fq, b_fq), self.act))
        return straight_through(approx, self._exact(x, wq_t, s_w, bq))

    def _exact(self, x: torch.Tensor, wq: torch.Tensor, s_w: np.ndarray,
               bq: np.ndarray | None) -> torch.Tensor:
        g_in, g_out = self.inputs[0], self.out
        xc = codes(x, g_in.scale)  # integer-valued float32
        factors = g_in.s * s_w.astype(np.float64) / g_out.s
        product = (lambda a, w: self._op(a, w, None), xc, wq.to(torch.float32),
                   int(wq[0].numel()), weight_qmax(self.bits))
        if g_in.wide:   # int16 rows: two byte planes joined in the accumulator
            shift = plane_lo_shift(wq.numpy(), np.zeros(1) if bq is None else bq)
            if self.kind != "linear" or self.analog is not None or shift is None:
                raise QatError(f"layer {self.name}: an int16 input is read only by a digital "
                               f"linear layer whose byte planes' sums fit int32")
            acc = exact.plane_product(*product, shift)
            factors = factors * (1 << shift)
            bq = None if bq is None else joined_bias(bq, shift)
        elif self.analog is not None:
            acc = self.analog(self, xc, wq)
        else:
            acc = exact.int_product(*product)
        axis = acc.ndim - 1 if self.channel_axis < 0 else self.channel_axis
        q = exact.output_stage(acc, 0 if bq is None else bq, factors, g_out.zero_point,
                               g_out.bounds(self.act), axis)
        return g_out.dequantize(q)


class AddLayer(_Integer):
    """A residual add of two int8 activations (+ ReLU/Clip), ``relay_passes.kinds.add``."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.settle(a + b, lambda: self._codes(a, b))

    def _codes(self, a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
        ga, gb = self.inputs
        s_y = self.out.s
        am, bm, n = add_multipliers(ga.s / s_y, gb.s / s_y,
                                    bits=tuple(WIDE_ADD_MULT_BITS if g.wide else ADD_MULT_BITS
                                               for g in (ga, gb)))
        return exact.add_codes(ga.centred(a), gb.centred(b), am, bm, n, self.out.zero_point,
                               self.out.bounds(self.act))


class MeanLayer(_Integer):
    """Global average pooling over H, W of NCHW (``relay_passes.kinds.global_avg_pool``):
    the int32 sum of centred codes, requantized by ``s_in / (s_out * H * W)``."""

    def __init__(self, x: Grid, keepdim: bool, method: str, symmetric: bool) -> None:
        super().__init__([x], None, method, symmetric)
        self.keepdim = keepdim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.settle(x.mean(dim=(2, 3), keepdim=self.keepdim), lambda: self._codes(x))

    def _codes(self, x: torch.Tensor) -> np.ndarray:
        g_in, g_out = self.inputs[0], self.out
        h, w = x.shape[2:]
        acc = g_in.centred(x).sum(axis=(2, 3), keepdims=self.keepdim)
        factor = np.array([g_in.s / (g_out.s * h * w)])
        return exact.output_stage(acc, 0, factor, g_out.zero_point, (-128, 127), 1)


def set_mode(module: nn.Module, mode: str) -> None:
    """Switch every QAT layer of ``module`` to ``mode`` (one of :data:`layers.MODES`)."""
    if mode not in MODES:
        raise QatError(f"mode {mode!r} is not one of {MODES}")
    for m in module.modules():
        if isinstance(m, (Grid, SameGrid, _Integer)):
            m.mode = mode


def grids(module: nn.Module) -> list[Grid]:
    return [m for m in module.modules() if isinstance(m, Grid)]
