"""Conductance models of analog crossbar cells: programming noise, drift, read noise.

Conductances are in uS. Two models, chosen by ``cim.noise_model``:

* ``"pcm"``: the statistical phase-change-memory model IBM's aihwkit publishes
  (``aihwkit.inference.noise.pcm.PCMLikeNoiseModel``, fitted on a million PCM devices:
  Nandakumar et al., ICECS 2019), with the same coefficients and the same order of
  effects: programming noise (standard deviation a quadratic polynomial of the target
  conductance), then drift ``g (t / t0)^-nu`` with a drift exponent per device drawn from
  a conductance-dependent normal, then the 1/f read noise accumulated up to the read
  time. The ``*_scale`` fields of the description multiply each effect.
* ``"gaussian"``: programming noise of ``prog_noise_scale x g_max``, every device drifting
  with ``nu = drift_nu x drift_scale``, read noise of ``read_noise_scale x |g|``: the
  simple model noise sweeps use ("2% noise").

Every draw comes from the generator the caller passes, so the same seed gives the same
conductances. With every scale 0 a device holds exactly its target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

#: programming-noise polynomial c0 + c1 (g/g_max) + c2 (g/g_max)^2, in uS at g_max = 25 uS
PCM_PROG_COEFFS = (0.26348, 1.9650, -1.1731)
PCM_PROG_G_MAX_REF = 25.0
#: drift counts from the first read, t0 seconds after programming (the fit's reference)
PCM_T0_S = 20.0
#: duration of one read in the 1/f fit
PCM_T_READ_S = 250e-9
#: drift exponent: mean clip(a ln(g/g_max) + b, lo, hi), std clip(a ln(g/g_max) + b, lo, hi)
PCM_NU_MEAN = (-0.0155, 0.0244, 0.049, 0.1)
PCM_NU_STD = (-0.0125, -0.0059, 0.008, 0.045)
#: 1/f read noise: Q_s = min(a / max((g/g_max)^p, lo), hi), times sqrt(ln((t + t_read) / 2 t_read))
PCM_READ_Q = (0.0088, 0.65, 1e-3, 0.2)
#: conductances below this fraction of g_max count as this fraction (ln of zero)
_ZERO_CLIP = 1e-7


@dataclass(frozen=True)
class DeviceModel:
    """One noise model with its scales, as the description sets them."""

    kind: str
    g_max: float
    prog_scale: float
    read_scale: float
    drift_scale: float
    drift_nu: float

    @classmethod
    def from_config(cls, cfg: "HardwareConfig") -> "DeviceModel":
        return cls(cfg.noise_model, cfg.g_max_us, cfg.prog_noise_scale, cfg.read_noise_scale,
                   cfg.drift_scale, cfg.drift_nu)

    @property
    def noiseless(self) -> bool:
        """Every device holds its target at every time."""
        return self.prog_scale == 0 and self.read_scale == 0 and self.drift_scale == 0

    # --- the statistics (what tests compare with the published coefficients)
    def prog_std(self, g_target: np.ndarray) -> np.ndarray:
        """Standard deviation of the programmed conductance around ``g_target``."""
        if self.kind == "gaussian":
            return np.full(np.shape(g_target), self.prog_scale * self.g_max)
        rel = np.asarray(g_target, dtype=np.float64) / self.g_max
        c0, c1, c2 = PCM_PROG_COEFFS
        return self.prog_scale * (c0 + c1 * rel + c2 * rel ** 2) * (self.g_max
                                                                     / PCM_PROG_G_MAX_REF)

    def nu_mean_std(self, g_target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of the drift exponent of devices at ``g_target``
        (before the absolute value the model takes, and before drift_scale)."""
        if self.kind == "gaussian":
            shape = np.shape(g_target)
            return np.full(shape, self.drift_nu), np.zeros(shape)
        log_g = np.log(np.maximum(np.abs(np.asarray(g_target, np.float64)) / self.g_max,
                                  _ZERO_CLIP))
        a, b, lo, hi = PCM_NU_MEAN
        mean = np.clip(a * log_g + b, lo, hi)
        a, b, lo, hi = PCM_NU_STD
        return mean, np.clip(a * log_g + b, lo, hi)

    def read_std(self, g_prog: np.ndarray, t_inference: float) -> np.ndarray:
        """Read-noise standard deviation relative to |g| at ``t_inference`` seconds after
        programming (the pcm model's 1/f noise accumulated since programming)."""
        if self.kind == "gaussian":
            return np.full(np.shape(g_prog), self.read_scale)
        a, p, lo, hi = PCM_READ_Q
        q_s = np.minimum(a / np.maximum((np.abs(g_prog) / self.g_max) ** p, lo), hi)
        t = t_inference + PCM_T0_S
        return self.read_scale * q_s * math.sqrt(math.log((t + PCM_T_READ_S)
                                                          / (2 * PCM_T_READ_S)))

    # --- the draws
    def program(self, g_target: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Programmed conductances (never negative)."""
        if self.prog_scale == 0:
            return np.asarray(g_target, dtype=np.float64).copy()
        g = g_target + self.prog_std(g_target) * rng.standard_normal(np.shape(g_target))
        return np.maximum(g, 0.0)

    def drift_exponents(self, g_target: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A drift exponent per device (non-negative)."""
        if self.drift_scale == 0:
            return np.zeros(np.shape(g_target))
        mean, std = self.nu_mean_std(g_target)
        nu = np.abs(mean + std * rng.standard_normal(np.shape(g_target)))
        return nu * self.drift_scale

    def at_time(self, g_prog: np.ndarray, nu: np.ndarray, t_inference: float,
                rng: np.random.Generator) -> np.ndarray:
        """Conductances read ``t_inference`` seconds after programming: drifted, with
        read noise (never negative)."""
        g = np.asarray(g_prog, dtype=np.float64)
        if t_inference > 0 and self.drift_scale:
            g = g * ((t_inference + PCM_T0_S) / PCM_T0_S) ** (-nu)
        if self.read_scale:
            std = self.read_std(g_prog, t_inference)
            g = g + np.abs(g) * std * rng.standard_normal(g.shape)
        return np.maximum(g, 0.0)
