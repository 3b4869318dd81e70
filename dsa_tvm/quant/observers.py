"""Observers: turn the values a tensor takes during calibration into a clipping range.

Each observer is an independent unit (``update`` with batches, ``range`` at the end) so
it can be tested against numpy on known distributions. Histogram observers keep a
fixed number of bins over a symmetric range [-R, R] that doubles when a batch falls
outside it; doubling merges neighbouring bins pairwise, which is exact, so one pass
over the calibration data suffices and memory stays constant.
"""

from __future__ import annotations

import math

import numpy as np

METHODS = ("minmax", "percentile", "entropy", "mse")


class Observer:
    """Collects statistics of one tensor; ``range()`` gives the (lo, hi) to quantize to."""

    def __init__(self) -> None:
        self.lo = math.inf
        self.hi = -math.inf

    def update(self, x: np.ndarray) -> None:
        if x.size == 0:
            return
        self.lo = min(self.lo, float(np.min(x)))
        self.hi = max(self.hi, float(np.max(x)))

    @property
    def seen(self) -> bool:
        return self.lo <= self.hi

    def range(self) -> tuple[float, float]:
        if not self.seen:
            raise ValueError("the observer saw no data (was the tensor computed during calibration?)")
        return self.lo, self.hi


class MinMaxObserver(Observer):
    """The full observed range: no clipping (what onnxruntime's MinMax does)."""


class HistogramObserver(Observer):
    """A histogram over [-R, R] with ``bins`` bins (R doubles as needed); subclasses pick
    the clipping range from it."""

    def __init__(self, bins: int = 4096) -> None:
        super().__init__()
        if bins % 2:
            raise ValueError("bins must be even (range doubling merges bins pairwise)")
        self.bins = bins
        self.radius = 0.0
        self.counts = np.zeros(bins, np.float64)

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float32).ravel()
        if x.size == 0:
            return
        x = x[np.isfinite(x)]
        super().update(x)
        peak = max(abs(self.lo), abs(self.hi))
        if peak == 0:
            peak = 1e-8
        if self.radius == 0.0:
            self.radius = peak
        while peak > self.radius:
            self._double()
        counts, _ = np.histogram(x, bins=self.bins, range=(-self.radius, self.radius))
        self.counts += counts

    def _double(self) -> None:
        """Range [-R, R] -> [-2R, 2R]: old bins pair up into the middle half."""
        merged = self.counts.reshape(-1, 2).sum(1)
        q = self.bins // 4
        new = np.zeros(self.bins, np.float64)
        new[q:q + merged.size] = merged
        self.counts = new
        self.radius *= 2

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(-self.radius, self.radius, self.bins + 1)

    @property
    def centers(self) -> np.ndarray:
        e = self.edges
        return (e[:-1] + e[1:]) / 2

    def _clamp(self, lo: float, hi: float) -> tuple[float, float]:
        """Never widen beyond what was seen; keep 0 representable."""
        return max(lo, self.lo), min(hi, self.hi)


class PercentileObserver(HistogramObserver):
    """Clip ``(100 - percentile) / 2`` percent of the mass off each tail (both tails of a
    signed tensor, the upper tail of a non-negative one)."""

    def __init__(self, percentile: float = 99.999, bins: int = 4096) -> None:
        super().__init__(bins)
        if not 50 < percentile <= 100:
            raise ValueError(f"percentile must be in (50, 100], got {percentile}")
        self.percentile = percentile

    def range(self) -> tuple[float, float]:
        super().range()
        total = self.counts.sum()
        cdf = np.cumsum(self.counts) / total
        tail = (100.0 - self.percentile) / 100.0
        edges = self.edges
        if self.lo >= 0:  # one-sided: only the upper tail
            hi = edges[1 + int(np.searchsorted(cdf, 1.0 - tail))] if tail > 0 else self.hi
            return self._clamp(self.lo, float(hi))
        lo = edges[int(np.searchsorted(cdf, tail / 2, side="right"))] if tail > 0 else self.lo
        hi = edges[1 + min(self.bins - 1, int(np.searchsorted(cdf, 1.0 - tail / 2)))] \
            if tail > 0 else self.hi
        return self._clamp(float(lo), float(hi))


def quant_error(centers: np.ndarray, counts: np.ndarray, lo: float, hi: float, levels: int = 255
                ) -> float:
    """Expected squared error of quantizing a histogram to ``levels`` steps over [lo, hi]."""
    step = (hi - lo) / levels
    if step <= 0:
        return float(np.sum(counts * centers ** 2))
    q = np.clip(np.round((centers - lo) / step), 0, levels) * step + lo
    return float(np.sum(counts * (centers - q) ** 2))


class MSEObserver(HistogramObserver):
    """The clipping range that minimizes the expected squared quantization error, searched
    over ``steps`` shrink factors of the observed range."""

    def __init__(self, steps: int = 100, bins: int = 4096) -> None:
        super().__init__(bins)
        self.steps = steps

    def range(self) -> tuple[float, float]:
        lo0, hi0 = super().range()
        lo0, hi0 = min(lo0, 0.0), max(hi0, 0.0)
        best, best_err = (lo0, hi0), math.inf
        centers, counts = self.centers, self.counts
        for alpha in np.linspace(1.0, 0.05, self.steps):
            lo, hi = lo0 * alpha, hi0 * alpha
            err = quant_error(centers, counts, lo, hi)
            if err < best_err:
                best, best_err = (lo, hi), err
        return self._clamp(*best)


class EntropyObserver(HistogramObserver):
    """TensorRT-style KL calibration on the histogram of |x|: the threshold T whose
    quantization of the clipped distribution diverges least from it. ``levels`` is the
    number of steps that cover [0, T]: 128 for a signed tensor, 255 for a non-negative
    one (an asymmetric int8 grid spends all its steps there)."""

    def __init__(self, bins: int = 4096, levels: int | None = None) -> None:
        super().__init__(bins)
        self.fixed_levels = levels

    @property
    def levels(self) -> int:
        if self.fixed_levels is not None:
            return self.fixed_levels
        return 255 if self.lo >= 0 else 128

    def range(self) -> tuple[float, float]:
        super().range()
        half = self.bins // 2
        mag = self.counts[half:] + self.counts[:half][::-1]  # |x| histogram, bin width R/half
        width = self.radius / half
        nz = np.nonzero(mag)[0]
        last = int(nz[-1]) + 1 if nz.size else 1
        if last <= self.levels:
            return self.lo, self.hi
        best_t, best_kl = last, math.inf
        for i in range(self.levels, last + 1, max(1, (last - self.levels) // 256)):
            kl = kl_divergence_at(mag, i, self.levels)
            if kl < best_kl:
                best_t, best_kl = i, kl
        t = best_t * width
        return self._clamp(-t, t)


def kl_divergence_at(hist: np.ndarray, i: int, levels: int) -> float:
    """KL(P || Q) where P is hist[:i] with the tail folded into bin i-1 and Q is P
    quantized to ``levels`` groups (mass spread evenly over each group's non-empty bins)."""
    p = hist[:i].astype(np.float64).copy()
    p[i - 1] += hist[i:].sum()
    nonzero = hist[:i] > 0
    groups = np.minimum((np.arange(i) * levels) // i, levels - 1)
    gsum = np.bincount(groups, weights=hist[:i], minlength=levels)
    gcnt = np.bincount(groups, weights=nonzero.astype(np.float64), minlength=levels)
    q = np.where(nonzero, gsum[groups] / np.maximum(gcnt[groups], 1), 0.0)
    ps, qs = p.sum(), q.sum()
    if ps == 0 or qs == 0:
        return math.inf
    p, q = p / ps, q / qs
    m = p > 0
    qm = np.where(q[m] > 0, q[m], 1e-12)
    return float(np.sum(p[m] * np.log(p[m] / qm)))


#: a softmax input at or below this is an additive mask's value, not a score (real
#: attention scores lie within tens of units of zero; masks add -1e4, -1e9 or float32's
#: minimum)
MASKED = -1000.0


class SoftmaxInputObserver(Observer):
    """A softmax input's range for the [norm] unit, where an additive attention mask's
    values (at or below :data:`MASKED`) must not set the grid: they would stretch it so far
    that every real score rounds to one code. ``base`` (the method's observer) sees them
    moved up to a floor ``span`` below the smallest row maximum (the last axis is the row;
    ``span``: ``isa.intnorm.EXP_ZERO_SPAN``, from where the unit's exponential is exactly
    0), or to the smallest real score when that is lower. So the grid holds every real
    score, and a masked value, saturating at the grid's minimum, still contributes 0.
    Without mask values this is the method's observer unchanged."""

    def __init__(self, base: Observer, span: float) -> None:
        super().__init__()
        self.base, self.span = base, span

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float32)
        if x.size == 0:
            return
        masked = x <= MASKED
        if masked.any():
            row_max = x.max(axis=-1)
            live = row_max[row_max > MASKED]
            if live.size == 0:  # every row masked entirely: nothing real to hold
                return
            floor = float(live.min()) - self.span
            real = x[~masked]
            x = np.where(masked, np.float32(min(floor, float(real.min()))), x)
        self.base.update(x)

    @property
    def seen(self) -> bool:
        return self.base.seen

    def range(self) -> tuple[float, float]:
        if not self.seen:
            raise ValueError(f"a softmax input was masked entirely (every value <= {MASKED:g}) "
                             f"on every calibration batch: calibrate on inputs with at least "
                             f"one unmasked position")
        return self.base.range()


def make_observer(method: str, **options) -> Observer:
    """An observer for calibration ``method`` (one of :data:`METHODS`)."""
    if method == "minmax":
        return MinMaxObserver()
    if method == "percentile":
        return PercentileObserver(**options)
    if method == "mse":
        return MSEObserver(**options)
    if method == "entropy":
        return EntropyObserver(**options)
    raise ValueError(f"unknown calibration method '{method}' (choose from {', '.join(METHODS)})")


class ChannelMeanObserver:
    """Running mean and largest magnitude of a tensor per channel (``axis``): the mean is
    what bias correction needs to predict the output shift of rounded weights, the
    magnitude finds outlier channels."""

    def __init__(self, axis: int) -> None:
        self.axis = axis
        self.total: np.ndarray | None = None
        self.absmax: np.ndarray | None = None
        self.count = 0

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x)
        ax = self.axis % x.ndim
        others = tuple(i for i in range(x.ndim) if i != ax)
        s = x.sum(axis=others, dtype=np.float64)   # no float64 copy of the tensor itself
        m = np.maximum(x.max(axis=others), -x.min(axis=others)).astype(np.float64)
        self.total = s if self.total is None else self.total + s
        self.absmax = m if self.absmax is None else np.maximum(self.absmax, m)
        self.count += x.size // x.shape[ax]

    def mean(self) -> np.ndarray:
        if self.total is None or self.count == 0:
            raise ValueError("the channel-mean observer saw no data")
        return self.total / self.count
