"""What one analog crossbar read computes: weights as conductance pairs, inputs through
DACs, column sums through ADCs, partial sums recombined digitally.

A weight code w (int8) is stored as |w| split into ``cells_per_weight`` digits of
``bits_per_cell`` bits, digit c in its own column of a differential pair (G+ holds the
digit of a positive weight, G- of a negative one, the other cell is left at 0). Digit c is
programmed to ``g_max x d / D_c``, D_c the largest value digit c takes for |w| <= 128, so
every column uses the whole conductance range. An input code x goes in as ``ceil(8 /
dac_bits)`` reads of ``dac_bits``-bit magnitude slices (its sign sets the polarity). One
read of one crossbar sums ``crossbar_rows`` products per column; the ADC turns each sum
into a code (``adc_bits``, full scale ``adc_range`` x the largest possible sum, a
power-of-two step of at least 1), and the digital periphery shifts and adds the codes of
every slice, digit and crossbar of the reduction.

With noiseless devices and an ADC whose step is 1 the result is the integer product
exactly (the column sums are integers; float64 holds them exactly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .devices import DeviceModel

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

#: largest magnitude of an int8 code (-128)
CODE_MAX = 128


def digit_max(bits: int, shift: int) -> int:
    """Largest value the ``bits``-bit digit at ``shift`` takes over magnitudes 0..128."""
    return min((1 << bits) - 1, CODE_MAX >> shift) if shift < 8 else 0


@dataclass(frozen=True)
class Geometry:
    """The crossbar and converter sizes of a description, and what follows from them."""

    rows: int
    cols: int
    bits: int            # per cell
    cells: int           # per weight
    dac_bits: int
    adc_bits: int
    adc_range: float
    mvm_noise: float

    @classmethod
    def from_config(cls, cfg: "HardwareConfig") -> "Geometry":
        return cls(cfg.crossbar_rows, cfg.crossbar_cols, cfg.bits_per_cell,
                   cfg.cells_per_weight, cfg.dac_bits, cfg.adc_bits, cfg.adc_range,
                   cfg.mvm_noise)

    @property
    def passes(self) -> int:
        """Reads per input vector: one per DAC slice of an int8 magnitude."""
        return math.ceil(8 / self.dac_bits)

    def weight_digit_max(self, c: int) -> int:
        return digit_max(self.bits, self.bits * c)

    def input_slice_max(self, p: int) -> int:
        return digit_max(self.dac_bits, self.dac_bits * p)

    def full_scale(self, p: int, c: int) -> int:
        """Largest |column sum| of one read: every row at its largest input slice and digit."""
        return self.rows * self.input_slice_max(p) * self.weight_digit_max(c)

    def adc_lsb(self, p: int, c: int) -> int:
        """ADC step of read slice p on digit column c: a power of two, at least 1, so that
        2^(adc_bits - 1) steps reach past adc_range x the full scale."""
        top = max(1, math.floor(self.adc_range * self.full_scale(p, c))).bit_length()
        return 1 << max(0, top - (self.adc_bits - 1))

    def exact(self) -> bool:
        """Whether the ADC reproduces every possible column sum (step 1, no clipping)."""
        return all(self.adc_lsb(p, c) == 1 and self.adc_range == 1.0
                   for p in range(self.passes) for c in range(self.cells))

    def crossbars_for(self, k: int, n: int) -> int:
        """Crossbars a k x n weight block occupies (cells_per_weight columns per weight)."""
        return math.ceil(k / self.rows) * math.ceil(n * self.cells / self.cols)


def weight_digits(codes: np.ndarray, geom: Geometry) -> np.ndarray:
    """(cells, *codes.shape) magnitude digits of int8 weight codes."""
    mag = np.abs(codes.astype(np.int16))
    mask = (1 << geom.bits) - 1
    return np.stack([(mag >> (geom.bits * c)) & mask for c in range(geom.cells)])


def effective_weights(codes: np.ndarray, geom: Geometry, model: DeviceModel,
                      t_inference: float, rng: np.random.Generator) -> np.ndarray:
    """(cells, *codes.shape) float32 weight digits as the crossbar reads them: the digit
    targets programmed into G+ / G- (with noise), drifted and read at ``t_inference``,
    converted back to digit units ((G+ - G-) / g_max x D_c)."""
    digits = weight_digits(codes, geom)
    if model.noiseless:
        sign = np.where(codes < 0, -1, 1).astype(np.int16)
        return (digits * sign).astype(np.float32)
    dmax = np.array([geom.weight_digit_max(c) for c in range(geom.cells)], np.float64)
    dmax = dmax.reshape((-1,) + (1,) * codes.ndim)
    g_target = digits / dmax * model.g_max
    pos = codes >= 0
    g_plus = np.where(pos, g_target, 0.0)
    g_minus = np.where(pos, 0.0, g_target)
    read = []
    for g in (g_plus, g_minus):  # both cells of every pair are programmed and drift
        g_prog = model.program(g, rng)
        nu = model.drift_exponents(g, rng)
        read.append(model.at_time(g_prog, nu, t_inference, rng))
    return ((read[0] - read[1]) / model.g_max * dmax).astype(np.float32)


def analog_matmul(x: np.ndarray, w: np.ndarray, geom: Geometry,
                  rng: np.random.Generator | None) -> np.ndarray:
    """Integer result (int64, ``x.shape[:-1] + (N,)``) of ``x @ W`` read on crossbars.

    ``x``: int8 inputs (..., nb, nm, K); ``w``: effective digits (cells, nb, K, N) from
    :func:`effective_weights`. The reduction is cut into crossbars of ``rows`` rows; every
    (input slice, digit, crossbar) read is converted by the ADC, with ``mvm_noise`` added
    first when ``rng`` is given."""
    xi = x.astype(np.int16)
    sign = np.where(xi < 0, -1.0, 1.0)
    mag = np.abs(xi)
    k = x.shape[-1]
    total = np.zeros(x.shape[:-1] + (w.shape[-1],), dtype=np.float64)
    smask = (1 << geom.dac_bits) - 1
    for p in range(geom.passes):
        xs = sign * ((mag >> (geom.dac_bits * p)) & smask)
        for c in range(geom.cells):
            lsb = geom.adc_lsb(p, c)
            top = (1 << (geom.adc_bits - 1)) - 1
            noise = geom.mvm_noise * geom.adc_range * geom.full_scale(p, c)
            scale = float(1 << (geom.dac_bits * p + geom.bits * c))
            for k0 in range(0, k, geom.rows):
                y = np.matmul(xs[..., k0:k0 + geom.rows],
                              w[c, :, k0:k0 + geom.rows, :].astype(np.float64))
                if rng is not None and noise:
                    y += noise * rng.standard_normal(y.shape)
                code = np.clip(np.rint(y / lsb), -top - 1, top)
                total += code * (lsb * scale)
    return total.astype(np.int64)
