"""Noise-aware training for analog crossbars: a prepared module's weighted layers read
their products as a CIM part's crossbars do, so fine-tuning learns to live with them.

On a CIM part (a hardware description with ``[cim] crossbars > 0``, e.g. ``cim-pcm``) the
simulator runs every constant-weight GEMM on crossbars (``sim/cim_mapping.py``): weight
codes programmed into conductance pairs with programming noise, drifted and read with
read noise (``cim/devices.py``), inputs through DACs, each crossbar's column sums through
an ADC, partial sums recombined digitally (``cim/crossbar.py``). A model trained on the
exact integers has never seen any of it.

:func:`enable_analog` makes every convolution (groups 1) and linear layer compute its
products with the simulator's own functions: the layer's weight codes are programmed and
read by ``program_cells`` / ``read_digits`` (a new chip every forward pass while
training, seeded), its centred input codes are laid out as the compiled GEMM reads them
(the reduction tap-major over channels padded to the array's block; a few-channel stem
folded, as ``lowering/fold_input`` does) and read by ``analog_matmul`` (DAC slices, an
ADC step and clip per crossbar of the reduction, per-read noise, drift compensation).
The DSA's output stage follows, as without noise. Depthwise convolutions run on the
digital vector unit and stay exact.

The noise is in the forward values only. The gradient is the noise-free layer's
straight-through one, taken at the noisy activations, and reaches the clean weights (as
in aihwkit's hardware-aware training); :func:`~dsa_tvm.qat.export` writes the clean
weights. With the analog reads off (the default, or after :func:`disable_analog`) the
layers compute the DSA's exact integers again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx

from ..cim.crossbar import (
    Geometry,
    Periphery,
    analog_matmul,
    drift_gain,
    program_cells,
    read_digits,
)
from ..cim.devices import DeviceModel
from ..hw.config import ConfigError, load_config
from .errors import QatError
from .layers import Grid, WeightedLayer

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

#: calibrated mitigations: the deployed part sets them from data its own crossbars show;
#: a training chip changes every forward pass, so there is nothing to calibrate against
CALIBRATED = ("adc_calibration", "bias_correction")


@dataclass
class AnalogReport:
    """Which layers read crossbars and which stay on the digital part (and why)."""

    hw: str
    seed: int
    noise_scale: float
    analog: list[str] = field(default_factory=list)
    digital: list[tuple[str, str]] = field(default_factory=list)   # (layer, why)

    def summary(self) -> str:
        lines = [f"analog reads on '{self.hw}' (seed {self.seed}, noise x{self.noise_scale:g}): "
                 f"{len(self.analog)} layers on crossbars, {len(self.digital)} digital"]
        for why in dict.fromkeys(w for _, w in self.digital):
            names = [n for n, w in self.digital if w == why]
            lines.append(f"  digital, {why}: {', '.join(names)}")
        return "\n".join(lines)


class Chips:
    """The noise source every analog layer of one module shares: a chip (every device's
    programming noise, drift exponent and read noise) per forward pass when
    ``resample``, else one chip for every pass, as a deployed part reads the same
    crossbars every run."""

    def __init__(self, cfg: "HardwareConfig", seed: int, resample: bool) -> None:
        self.cfg = cfg
        self.geom = Geometry.from_config(cfg)
        self.model = DeviceModel.from_config(cfg)
        self.seed = seed
        self.resample = resample
        self.passes = 0   # forward passes of the module so far

    def rng(self, layer: int, stream: int) -> np.random.Generator:
        """The generator of one layer's draws (stream 0: devices, 1: per-read noise)."""
        chip = max(self.passes - 1, 0) if self.resample else 0   # the first pass: chip 0
        return np.random.default_rng([self.seed, chip, layer, stream])

    def count(self, _module: Any, _args: Any) -> None:
        """Forward pre-hook of the module: the next pass reads the next chip."""
        self.passes += 1


@dataclass(frozen=True)
class Layout:
    """Where a layer's reduction terms sit on crossbar rows: the compiled GEMM's order,
    taps outer and input channels inner, each tap's channels padded to the array's block
    (``layers.layouts.pack_conv_weights``); a folded stem (``lowering/fold_input``) packs
    tap x channels densely and pads the whole reduction once."""

    taps: int        # kernel positions (1 for a linear layer)
    channels: int    # input channels (features)
    per_tap: int     # rows one tap takes
    rows: int        # the GEMM's reduction, padded to the block

    @classmethod
    def of(cls, layer: WeightedLayer, block: int, folded: bool) -> "Layout":
        c = int(layer.weight.shape[1])
        taps = int(np.prod(layer.weight.shape[2:])) if layer.kind == "conv2d" else 1
        if folded:
            return cls(taps, c, c, _ceil_to(taps * c, block))
        return cls(taps, c, _ceil_to(c, block), taps * _ceil_to(c, block))

    def matrix(self, terms: np.ndarray) -> np.ndarray:
        """(rows, N) of per-weight values (N, C, *kernel): the crossbar's rows in order."""
        n = terms.shape[0]
        t = terms.reshape(n, self.channels, self.taps).transpose(2, 1, 0)   # (taps, C, N)
        t = _pad_axis(t, 1, self.per_tap)
        return _pad_axis(t.reshape(self.taps * self.per_tap, n), 0, self.rows)


def _ceil_to(v: int, block: int) -> int:
    return -(-v // block) * block


def _pad_axis(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    """``a`` zero-padded at the end of ``axis`` to ``size``."""
    if a.shape[axis] == size:
        return a
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, size - a.shape[axis])
    return np.pad(a, pad)


class CrossbarRead:
    """One layer's products read on crossbars: the callable :class:`WeightedLayer` runs in
    place of its exact integer product (``layer.analog``)."""

    def __init__(self, chips: Chips, index: int, layout: Layout) -> None:
        self.chips = chips
        self.index = index
        self.layout = layout

    def __call__(self, layer: WeightedLayer, xc: torch.Tensor, wq: torch.Tensor) -> np.ndarray:
        """int64 accumulators of centred input codes ``xc`` times weight codes ``wq``, in
        the layout the exact product has (NCHW or (..., N))."""
        chips, geom = self.chips, self.chips.geom
        codes = wq.numpy()
        now, ref = self.digits(codes)
        w = np.stack([self.layout.matrix(d) for d in now])[:, None]        # (cells, 1, K, N)
        gain = None
        if ref is not None:
            w_ref = np.stack([self.layout.matrix(d) for d in ref])[:, None]
            gain = drift_gain(w, w_ref, geom)
        zp = layer.inputs[0].zero_point if chips.cfg.input_encoding == "signed" else 0
        x, out_shape = self.inputs(layer, xc, zp)
        rng = chips.rng(self.index, 1) if geom.mvm_noise > 0 else None
        acc = analog_matmul(x, w, geom, rng, Periphery(gain=gain))[:, 0]     # (B, M, N)
        if zp:   # raw codes drove the DACs: the zero point's share comes off digitally
            acc = acc - zp * self.layout.matrix(codes.astype(np.int64)).sum(axis=0)
        if layer.kind == "conv2d":
            return np.ascontiguousarray(acc.transpose(0, 2, 1)).reshape(out_shape)
        return acc.reshape(out_shape)

    def digits(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(cells, *codes.shape) weight digits as the crossbars read them at
        ``t_inference_s``, and right after programming when drift is compensated: the
        simulator's draws in the simulator's order (``sim/cim_arrays``)."""
        chips = self.chips
        rng = chips.rng(self.index, 0)
        cells = program_cells(codes, chips.geom, chips.model, rng)
        now = read_digits(cells, chips.model, chips.cfg.t_inference_s, rng)
        ref = (read_digits(cells, chips.model, 0.0, rng) if chips.cfg.drift_compensation
               else None)
        return now, ref

    def inputs(self, layer: WeightedLayer, xc: torch.Tensor, zp: int
               ) -> tuple[np.ndarray, tuple[int, ...]]:
        """(B, 1, M, K) int16 DAC inputs (the centred codes, or the raw ones when the DACs
        drive them, ``zp``), one row per output pixel, and the output's shape."""
        u = xc + zp if zp else xc
        lay = self.layout
        if layer.kind == "linear":
            lead = tuple(u.shape[:-1])
            m = int(np.prod(lead, dtype=np.int64))
            x = F.pad(u.reshape(1, m, lay.channels), (0, lay.rows - lay.channels))
            return x.numpy().astype(np.int16)[:, None], lead + (layer.weight.shape[0],)
        if layer.pad is not None:   # what the DSA pads: the zero point (centred 0)
            u = F.pad(u, layer.pad, value=float(zp))
        ph, pw = _pair(layer.conv.get("padding", 0))
        u = F.pad(u, (pw, pw, ph, ph), value=float(zp))
        if lay.per_tap > lay.channels:
            u = F.pad(u, (0, 0, 0, 0, 0, lay.per_tap - lay.channels))
        kh, kw = layer.weight.shape[2:]
        cols = F.unfold(u, (kh, kw), dilation=layer.conv.get("dilation", 1),
                        stride=layer.conv.get("stride", 1))             # (B, C' * taps, L)
        b, _, pixels = cols.shape
        cols = cols.reshape(b, lay.per_tap, lay.taps, pixels).permute(0, 3, 2, 1)
        x = F.pad(cols.reshape(b, pixels, lay.taps * lay.per_tap),
                  (0, lay.rows - lay.taps * lay.per_tap))
        oh = _out_size(u.shape[2], kh, layer.conv, 0)
        ow = _out_size(u.shape[3], kw, layer.conv, 1)
        return x.numpy().astype(np.int16)[:, None], (b, layer.weight.shape[0], oh, ow)


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _out_size(size: int, kernel: int, conv: dict, axis: int) -> int:
    """Output length of an unpadded convolution along one spatial axis."""
    stride = _pair(conv.get("stride", 1))[axis]
    dilation = _pair(conv.get("dilation", 1))[axis]
    return (size - dilation * (kernel - 1) - 1) // stride + 1


def _reads_model_input(gm: fx.GraphModule, name: str) -> bool:
    """Whether layer ``name``'s input is the model's input grid, read by it alone: the
    case the compiler folds a few-channel convolution's window into its channels."""
    modules = dict(gm.named_modules())
    for n in gm.graph.nodes:
        if n.op == "call_module" and n.target == name and n.args:
            src = n.args[0]
            return (isinstance(src, fx.Node) and src.op == "call_module"
                    and isinstance(modules.get(src.target), Grid) and len(src.users) == 1
                    and all(isinstance(a, fx.Node) and a.op == "placeholder"
                            for a in src.args))
    return False


def _digital_reason(layer: WeightedLayer, skip: Callable[[str], bool]) -> str | None:
    """Why a weighted layer stays on the digital part, or None when it reads crossbars."""
    if skip(layer.name):
        return "named in skip"
    if layer.kind == "conv2d" and int(layer.conv.get("groups", 1)) != 1:
        return "depthwise: the vector unit"
    if layer.group:
        return f"weights per group of {layer.group} rows: the grouped dense (no crossbar form)"
    if layer.inputs[0].wide:
        return "an int16 input: the digital dense's byte planes (the DACs take int8)"
    return None


def cim_description(hw: "str | HardwareConfig", noise_scale: float) -> "HardwareConfig":
    """The description the reads model, its noise scaled; a part without crossbars or a
    setting training cannot model is refused with the fix."""
    try:
        cfg = load_config(hw)
    except ConfigError as e:
        raise QatError(f"analog training: {e}") from e
    if not cfg.is_cim:
        raise QatError(f"'{cfg.name}' has no crossbars (cim.crossbars = 0): a digital part "
                       f"computes the exact integers QAT already trains with; give a CIM "
                       f"description, e.g. 'cim-pcm' or a .toml with [cim] crossbars > 0")
    on = [f for f in CALIBRATED if cfg.values[f]]
    if on:
        raise QatError(f"'{cfg.name}' sets {', '.join('cim.' + f for f in on)}: calibrated on "
                       f"data the deployed crossbars show, which a training chip (new every "
                       f"pass) has not; train on the plain part, "
                       f"hw.replace({', '.join(f + '=False' for f in on)}), and switch them on "
                       f"to evaluate")
    if cfg.digital_layers:
        raise QatError(f"'{cfg.name}' keeps compiled layers digital (cim.digital_layers = "
                       f"{cfg.digital_layers!r}), names QAT cannot map; pass the PyTorch layer "
                       f"names as skip=[...] instead")
    if not (math.isfinite(noise_scale) and noise_scale >= 0):
        raise QatError(f"noise_scale={noise_scale!r}; give a finite factor >= 0 (1: the "
                       f"description's noise)")
    return cfg.replace(prog_noise_scale=cfg.prog_noise_scale * noise_scale,
                       read_noise_scale=cfg.read_noise_scale * noise_scale,
                       mvm_noise=cfg.mvm_noise * noise_scale)


def _skip_test(skip: "Sequence[str] | Callable[[str], bool]") -> Callable[[str], bool]:
    if callable(skip):
        return skip
    names = set(skip)
    return lambda name: name in names


def _check_prepared(module: Any) -> None:
    if not (isinstance(module, fx.GraphModule) and hasattr(module, "qat_report")):
        raise QatError("analog reads go into a module returned by dsa_tvm.qat.prepare; "
                       "prepare it first")


def enable_analog(prepared: fx.GraphModule, hw: "str | HardwareConfig" = "cim-pcm", *,
                  seed: int = 0, noise_scale: float = 1.0, resample: bool = True,
                  skip: "Sequence[str] | Callable[[str], bool]" = ()) -> AnalogReport:
    """Make ``prepared``'s weighted layers read their products on ``hw``'s crossbars.

    ``seed``: the same seed draws the same chips. ``resample``: a new chip (programming
    noise, drift exponents, read noise) every forward pass, so training sees the
    spread of chips rather than one; False: one chip for every pass, as a deployed
    part. ``noise_scale`` multiplies the programming, read and per-read noise (more
    noise while training than at deployment, as aihwkit's hardware-aware training does).
    ``skip``: PyTorch layer names (or a predicate) kept exact. Enabling again replaces
    the previous setting. Returns which layers read crossbars."""
    _check_prepared(prepared)
    cfg = cim_description(hw, noise_scale)
    test = _skip_test(skip)
    disable_analog(prepared)
    chips = Chips(cfg, int(seed), resample)
    report = AnalogReport(cfg.name, int(seed), noise_scale)
    index = 0
    for name, m in prepared.named_modules():
        if not isinstance(m, WeightedLayer):
            continue
        why = _digital_reason(m, test)
        if why is not None:
            report.digital.append((m.name, why))
            continue
        folded = (m.kind == "conv2d" and m.weight.shape[1] % cfg.block_in != 0
                  and m.weight[0, 0].numel() > 1 and _reads_model_input(prepared, name))
        m.analog = CrossbarRead(chips, index, Layout.of(m, cfg.block_in, folded))
        report.analog.append(m.name)
        index += 1
    prepared.qat_analog_hook = prepared.register_forward_pre_hook(chips.count)
    prepared.qat_analog = report
    return report


def disable_analog(prepared: fx.GraphModule) -> None:
    """Back to the DSA's exact integers in every layer (a no-op when none reads
    crossbars)."""
    _check_prepared(prepared)
    for m in prepared.modules():
        if isinstance(m, WeightedLayer):
            m.analog = None
    hook = getattr(prepared, "qat_analog_hook", None)
    if hook is not None:
        hook.remove()
    prepared.qat_analog_hook = None
    prepared.qat_analog = None


@contextmanager
def analog_noise(prepared: fx.GraphModule, hw: "str | HardwareConfig" = "cim-pcm",
                 **options: Any) -> Iterator[AnalogReport]:
    """``with analog_noise(p, "cim-pcm", seed=0):`` the analog reads of :func:`enable_analog`
    inside the block, the exact integers after it."""
    report = enable_analog(prepared, hw, **options)
    try:
        yield report
    finally:
        disable_analog(prepared)
