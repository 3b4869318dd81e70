"""What one analog crossbar read computes: weights as conductance pairs, inputs through
DACs, column sums through ADCs, partial sums recombined digitally.

A weight code w (int8) is stored as |w| split into ``cells_per_weight`` digits of
``bits_per_cell`` bits, digit c in its own column of a differential pair (G+ holds the
digit of a positive weight, G- of a negative one, the other cell is left at 0). Digit c is
programmed to ``g_max x d / D_c``, D_c the largest value digit c takes for |w| <= 128, so
every column uses the whole conductance range. An input code x goes in as ``ceil(8 /
dac_bits)`` reads of ``dac_bits``-bit magnitude slices (its sign sets the polarity;
with ``input_encoding = "zero_point"`` the DACs drive the code minus its layer's zero
point, and the zero point's share is added back digitally). One
read of one crossbar sums up to ``crossbar_rows`` products per column; the ADC turns each
sum into a code (``adc_bits``, full scale ``adc_range`` x the largest sum the rows in use
can make, a power-of-two step of at least 1), and the digital periphery shifts and adds the codes of
every slice, digit and crossbar of the reduction.

With noiseless devices and an ADC whose step is 1 the result is the integer product
exactly (the column sums are integers; float64 holds them exactly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .devices import DeviceModel

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

#: largest magnitude of an int8 code (-128)
CODE_MAX = 128
#: a calibrated ADC's full scale: the larger of CALIBRATION_HEADROOM x the largest sum
#: calibration showed in the column and CALIBRATION_SIGMAS x its RMS. A few calibration
#: inputs miss the tails (a late layer's column sees 49 pixels an image), and a clipped tail
#: costs more than a bit of resolution. EfficientNet-Lite0, 8 calibration photos, 24 crops,
#: top-1 agreement with FP32 (digital int8: 0.917) / cosine at 16 and 8 ADC bits: 2x max
#: alone 0.583 / 0.994 and 0.667 / 0.984; 4x max 0.875 / 0.997 and 0.625 / 0.940; 2x max or
#: 8 x RMS 0.875 / 0.997 and 0.667 / 0.974; 2x max or 12 x RMS 0.917 / 0.997 and 0.625 / 0.948
CALIBRATION_HEADROOM = 2.0
CALIBRATION_SIGMAS = 8.0


def digit_max(bits: int, shift: int, top: int = CODE_MAX) -> int:
    """Largest value the ``bits``-bit digit at ``shift`` takes over magnitudes 0..top."""
    return min((1 << bits) - 1, top >> shift) if shift < 8 else 0


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
    repeats: int         # reads averaged per read (reads_per_mvm)
    input_max: int       # largest input magnitude the DACs drive (255: x - zero point)

    @classmethod
    def from_config(cls, cfg: "HardwareConfig") -> "Geometry":
        return cls(cfg.crossbar_rows, cfg.crossbar_cols, cfg.bits_per_cell,
                   cfg.cells_per_weight, cfg.dac_bits, cfg.adc_bits, cfg.adc_range,
                   cfg.mvm_noise, cfg.reads_per_mvm,
                   255 if cfg.input_encoding == "zero_point" else CODE_MAX)

    @property
    def passes(self) -> int:
        """Reads per input vector: one per DAC slice of an int8 magnitude."""
        return math.ceil(8 / self.dac_bits)

    def weight_digit_max(self, c: int) -> int:
        return digit_max(self.bits, self.bits * c)

    def input_slice_max(self, p: int) -> int:
        return digit_max(self.dac_bits, self.dac_bits * p, self.input_max)

    def full_scale(self, p: int, c: int, rows: int | None = None) -> int:
        """Largest |column sum| of one read of ``rows`` rows (default: all): every row at its
        largest input slice and digit."""
        return (rows or self.rows) * self.input_slice_max(p) * self.weight_digit_max(c)

    def adc_lsb(self, p: int, c: int, rows: int | None = None) -> int:
        """ADC step of read slice p on digit column c of a crossbar with ``rows`` rows in use
        (the mapping sets each read's range for the rows it programmed): a power of two, at
        least 1, so that 2^(adc_bits - 1) steps reach past adc_range x the full scale."""
        top = max(1, math.floor(self.adc_range * self.full_scale(p, c, rows))).bit_length()
        return 1 << max(0, top - (self.adc_bits - 1))

    def exact(self) -> bool:
        """Whether the ADC reproduces every possible column sum (step 1, no clipping)."""
        return all(self.adc_lsb(p, c) == 1 and self.adc_range == 1.0
                   for p in range(self.passes) for c in range(self.cells))

    def crossbars_for(self, k: int, n: int) -> int:
        """Crossbars a k x n weight block touches on its own (cells_per_weight columns per
        weight): what one read of it drives."""
        return math.ceil(k / self.rows) * math.ceil(n * self.cells / self.cols)

    def pack(self, blocks: list[tuple[int, int]]) -> int:
        """Crossbars that hold weight blocks of (k rows, n weights): each block cut into
        rows x cols tiles, the whole tiles one crossbar each, the partial ones packed
        together (next-fit decreasing height into shelves: blocks that share a crossbar
        take disjoint rows and columns, so each is still read alone)."""
        whole, parts = 0, []
        for k, n in blocks:
            w = n * self.cells
            hs = [self.rows] * (k // self.rows) + ([k % self.rows] if k % self.rows else [])
            ws = [self.cols] * (w // self.cols) + ([w % self.cols] if w % self.cols else [])
            for h in hs:
                for c in ws:
                    if h == self.rows and c == self.cols:
                        whole += 1
                    else:
                        parts.append((h, c))
        parts.sort(reverse=True)
        bars, used_h, shelf_w = 0, self.rows, self.cols
        for h, c in parts:
            if shelf_w + c > self.cols:                      # a new shelf
                if used_h + h > self.rows:                   # ... in a new crossbar
                    bars, used_h = bars + 1, 0
                used_h, shelf_w = used_h + h, 0
            shelf_w += c
        return whole + bars


def weight_digits(codes: np.ndarray, geom: Geometry) -> np.ndarray:
    """(cells, *codes.shape) magnitude digits of int8 weight codes."""
    mag = np.abs(codes.astype(np.int16))
    mask = (1 << geom.bits) - 1
    return np.stack([(mag >> (geom.bits * c)) & mask for c in range(geom.cells)])


@dataclass
class ProgrammedCells:
    """The conductance pairs of programmed weight codes: G+ and G- right after programming
    and each device's drift exponent, (2, cells, *codes.shape) each, with the digit
    scale (cells, 1, ...) that maps g_max back to the largest digit."""

    g_prog: np.ndarray
    nu: np.ndarray
    dmax: np.ndarray
    exact: np.ndarray | None = None    # the signed digits, when the devices are noiseless


def program_cells(codes: np.ndarray, geom: Geometry, model: DeviceModel,
                  rng: np.random.Generator | None) -> ProgrammedCells:
    """Program int8 weight codes into conductance pairs (both cells of every pair take
    the programming noise and drift, as aihwkit's pair converter does)."""
    digits = weight_digits(codes, geom)
    dmax = np.array([geom.weight_digit_max(c) for c in range(geom.cells)], np.float64)
    dmax = dmax.reshape((-1,) + (1,) * codes.ndim)
    if model.noiseless:
        sign = np.where(codes < 0, -1, 1).astype(np.int16)
        return ProgrammedCells(np.empty(0), np.empty(0), dmax, (digits * sign).astype(np.float32))
    g_target = digits / dmax * model.g_max
    pos = codes >= 0
    pair = np.stack([np.where(pos, g_target, 0.0), np.where(pos, 0.0, g_target)])
    return ProgrammedCells(model.program(pair, rng), model.drift_exponents(pair, rng), dmax)


def read_digits(cells: ProgrammedCells, model: DeviceModel, t_inference: float,
                rng: np.random.Generator | None) -> np.ndarray:
    """(cells, ...) float32 digits as a read ``t_inference`` seconds after programming sees
    them: (G+ - G-) / g_max x D_c, drifted and with read noise."""
    if cells.exact is not None:
        return cells.exact
    g = model.at_time(cells.g_prog, cells.nu, t_inference, rng)
    return ((g[0] - g[1]) / model.g_max * cells.dmax).astype(np.float32)


def effective_weights(codes: np.ndarray, geom: Geometry, model: DeviceModel,
                      t_inference: float, rng: np.random.Generator | None) -> np.ndarray:
    """(cells, *codes.shape) float32 weight digits as the crossbar reads them at
    ``t_inference``: programmed (with noise), drifted, read."""
    return read_digits(program_cells(codes, geom, model, rng), model, t_inference, rng)


def drift_gain(now: np.ndarray, ref: np.ndarray, geom: Geometry) -> np.ndarray:
    """(nb, crossbars) drift-compensation gains of a (cells, nb, K, N) weight block: each
    crossbar's all-ones read right after programming (``ref``) over the same read now
    (aihwkit's GlobalDriftCompensation, one gain per crossbar of the reduction)."""
    scale = np.array([1 << (geom.bits * c) for c in range(geom.cells)],
                     np.float64).reshape(-1, 1, 1, 1)
    gains = []
    for k0 in range(0, now.shape[2], geom.rows):
        r0 = np.abs((ref[:, :, k0:k0 + geom.rows] * scale).sum(axis=(0, 2))).sum(axis=-1)
        rt = np.abs((now[:, :, k0:k0 + geom.rows] * scale).sum(axis=(0, 2))).sum(axis=-1)
        gains.append(np.where(rt > 0, r0 / np.where(rt > 0, rt, 1.0), 1.0))
    return np.stack(gains, axis=-1)


@dataclass
class Periphery:
    """The digital periphery's calibration of one GEMM's crossbars (every field optional):
    the ADC step per column of every (input slice, digit, crossbar) read, (nb, N) each;
    the drift-compensation gain per crossbar of the reduction, (nb, crossbars); the
    output offset per column to subtract, (nb, N)."""

    lsb: dict[tuple[int, int, int], np.ndarray] | None = None
    gain: np.ndarray | None = None
    offset: np.ndarray | None = None


@dataclass
class Recorder:
    """What calibration data showed one GEMM's periphery: the largest |column sum| of every
    (input slice, digit, crossbar) read, and the summed error per output column of the
    crossbars' sums (before any ADC: what the devices add) against the exact product."""

    col_max: dict[tuple[int, int, int], np.ndarray] = field(default_factory=dict)
    col_sq: dict[tuple[int, int, int], np.ndarray] = field(default_factory=dict)
    col_n: dict[tuple[int, int, int], int] = field(default_factory=dict)
    err_sum: np.ndarray | None = None
    count: int = 0

    def observe(self, key: tuple[int, int, int], y: np.ndarray) -> None:
        m = np.abs(y).max(axis=(0, 2))                       # (nb, N)
        sq = np.square(y).sum(axis=(0, 2))
        old = self.col_max.get(key)
        self.col_max[key] = m if old is None else np.maximum(old, m)
        self.col_sq[key] = sq if old is None else self.col_sq[key] + sq
        self.col_n[key] = self.col_n.get(key, 0) + y.shape[0] * y.shape[2]

    def error(self, got: np.ndarray, exact: np.ndarray) -> None:
        e = (got - exact).sum(axis=(0, 2))
        self.err_sum = e if self.err_sum is None else self.err_sum + e
        self.count += got.shape[0] * got.shape[2]

    def periphery(self, geom: Geometry, gain: np.ndarray | None, ranges: bool,
                  bias: bool) -> Periphery:
        """The calibrated periphery: per-column ADC steps (full scale: the larger of
        CALIBRATION_HEADROOM x the largest sum seen and CALIBRATION_SIGMAS x the column's
        RMS, rounded up to a power of two) and/or the mean error as an offset."""
        lsb = None
        if ranges and self.col_max:
            lsb = {}
            for key, m in self.col_max.items():
                rms = np.sqrt(self.col_sq[key] / self.col_n[key])
                top = np.maximum(CALIBRATION_HEADROOM * np.maximum(m, 1.0),
                                 CALIBRATION_SIGMAS * rms)
                e = np.ceil(np.log2(top + 1.0)) - (geom.adc_bits - 1)
                lsb[key] = np.ldexp(1.0, e.astype(np.int64))
        offset = self.err_sum / self.count if bias and self.count else None
        return Periphery(lsb, gain, offset)


def analog_matmul(x: np.ndarray, w: np.ndarray, geom: Geometry,
                  rng: np.random.Generator | None, periphery: Periphery | None = None,
                  recorder: Recorder | None = None, exact_w: np.ndarray | None = None,
                  zero_point: int = 0, colsum: np.ndarray | None = None) -> np.ndarray:
    """Integer result (int64, ``x.shape[:-1] + (N,)``) of ``x @ W`` read on crossbars.

    ``x``: int8 inputs (batch, nb, nm, K); ``w``: digits (cells, nb, K, N) from
    :func:`read_digits`. The reduction is cut into crossbars of ``rows`` rows; every
    (input slice, digit, crossbar) read is converted by the ADC (``reads_per_mvm`` times
    with fresh ``mvm_noise`` when ``rng`` is given, the codes averaged), scaled by the
    periphery's drift gain, shifted and added; the periphery's offset is subtracted.
    A ``recorder`` sees every read and, given the exact integer weights ``exact_w``
    (nb, K, N), the devices' error (the sums before the ADC against the exact product).
    With ``zero_point`` the DACs drive ``x - zero_point`` and ``zero_point x colsum`` (the
    exact weights' column sums, (nb, N)) is added back digitally."""
    xi = x.astype(np.int16) - zero_point
    sign = np.where(xi < 0, -1.0, 1.0)
    mag = np.abs(xi)
    k = x.shape[-1]
    per = periphery or Periphery()
    total = np.zeros(x.shape[:-1] + (w.shape[-1],), dtype=np.float64)
    smask = (1 << geom.dac_bits) - 1
    top = (1 << (geom.adc_bits - 1)) - 1
    noisy = rng is not None and geom.mvm_noise > 0
    repeats = geom.repeats if noisy else 1   # averaging identical reads changes nothing
    ideal = np.zeros_like(total) if recorder is not None else None
    for p in range(geom.passes):
        xs = sign * ((mag >> (geom.dac_bits * p)) & smask)
        for c in range(geom.cells):
            scale = float(1 << (geom.dac_bits * p + geom.bits * c))
            for s, k0 in enumerate(range(0, k, geom.rows)):
                noise = geom.mvm_noise * geom.adc_range * geom.full_scale(
                    p, c, min(geom.rows, k - k0))
                y = np.matmul(xs[..., k0:k0 + geom.rows],
                              w[c, :, k0:k0 + geom.rows, :].astype(np.float64))
                if recorder is not None:
                    recorder.observe((p, c, s), y)
                    ideal += y * (scale if per.gain is None else
                                  scale * per.gain[None, :, None, s:s + 1])
                lsb = (per.lsb[(p, c, s)][None, :, None, :] if per.lsb is not None
                       else float(geom.adc_lsb(p, c, min(geom.rows, k - k0))))
                code = np.zeros_like(y)
                for _ in range(repeats):
                    yr = y + noise * rng.standard_normal(y.shape) if noisy else y
                    code += np.clip(np.rint(yr / lsb), -top - 1, top)
                out = code * (lsb * scale / repeats)
                if per.gain is not None:
                    out *= per.gain[None, :, None, s:s + 1]
                total += out
    if zero_point:
        back = zero_point * colsum[None, :, None, :]
        total += back
        if ideal is not None:
            ideal += back
    if per.offset is not None:
        total -= per.offset[None, :, None, :]
    if recorder is not None and exact_w is not None:   # the devices' error, before any ADC
        recorder.error(ideal, np.matmul(x.astype(np.float64), exact_w))
    return np.rint(total).astype(np.int64)
