"""The crossbars of a CIM part holding one program's weights, as every run reads them.

Conductances are drawn once per program (seeded by ``cim.noise_seed``, the program's name
and each constant region's offset and bytes, so the same seed gives the same chip) and
read at ``cim.t_inference_s``; every run of the program reads the same arrays. The
per-read noise (``cim.mvm_noise``) is drawn anew for every read, from a generator seeded
by the instruction, so a run is reproducible too.

Calibration: runs inside ``with calibrating():`` record, for every analog GEMM, the
largest sum each column showed and the output error against the exact product; a part
with ``adc_calibration`` / ``bias_correction`` then sets its per-column ADC ranges /
subtracts the mean error in every later run (a new ``calibrating()`` starts afresh).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import numpy as np

from ..cim.crossbar import (
    Geometry,
    Periphery,
    Recorder,
    analog_matmul,
    drift_gain,
    program_cells,
    read_digits,
)
from ..cim.devices import DeviceModel
from .cim_mapping import CimMap

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig
    from ..isa.program import Program

#: bytes of GEMM weight matrices kept per program (the oldest go first); the per-region
#: digits (the chip's state: 4 bytes per cell) are kept whole
WEIGHT_CACHE_BYTES = 256 << 20

_session = ContextVar("dsa_tvm_cim_calibration", default=0)
_sessions = itertools.count(1)


@contextmanager
def calibrating() -> Iterator[None]:
    """CIM runs inside record the calibration of their periphery (see the module doc)."""
    token = _session.set(next(_sessions))
    try:
        yield
    finally:
        _session.reset(token)


class ProgrammedArrays:
    """One program's weights programmed into crossbars: what its analog GEMMs read."""

    def __init__(self, program: "Program", cfg: "HardwareConfig", cmap: CimMap):
        self.cmap = cmap
        self.cfg = cfg
        self.geom = Geometry.from_config(cfg)
        self.model = DeviceModel.from_config(cfg)
        self.seed = cfg.noise_seed
        self.tile_shape = (cfg.block_out, cfg.block_in)
        unit = cfg.wgt_tile_bytes
        self._salt = zlib.crc32(program.name.encode())
        # constant regions as (first tile, tile count, region): where an origin tile lives
        self._regions = sorted((r.offset // unit, r.nbytes // unit, r) for r in program.regions
                               if r.data is not None and r.nbytes >= unit)
        self._region_digits: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        self._gemm_w: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        self._cached_bytes = 0
        self._colsums: dict[int, np.ndarray] = {}
        self._recorders: dict[int, Recorder] = {}
        self._recorded_in = 0                       # the calibration session recorded
        self._periphery: dict[int, Periphery] = {}

    @property
    def analog(self) -> dict[int, np.ndarray]:
        return self.cmap.analog

    @property
    def calibrated(self) -> bool:
        return bool(self._recorders) and not _session.get()

    def _codes(self, count: int, region) -> np.ndarray:
        return np.frombuffer(region.data, dtype=np.int8, count=count * int(
            np.prod(self.tile_shape))).reshape((count,) + self.tile_shape)

    def _digits(self, first: int, count: int, region) -> tuple[np.ndarray, np.ndarray | None]:
        """(cells, count, block_out, block_in) digits of a region's tiles as read at
        t_inference, and as read right after programming when drift is compensated."""
        hit = self._region_digits.get(first)
        if hit is None:
            rng = np.random.default_rng([self.seed, self._salt, region.offset,
                                         zlib.crc32(region.data)])
            cells = program_cells(self._codes(count, region), self.geom, self.model, rng)
            now = read_digits(cells, self.model, self.cfg.t_inference_s, rng)
            ref = (read_digits(cells, self.model, 0.0, rng) if self.cfg.drift_compensation
                   else None)
            hit = self._region_digits[first] = (now, ref)
        return hit

    def _gather(self, i: int, pick) -> np.ndarray:
        """(cells or 1, nb, K, N) matrix of GEMM ``i`` from per-region tile arrays."""
        src = self.cmap.analog[i]                       # (nb, nn, nk) origin tiles
        bo, bi = self.tile_shape
        tiles = None
        for first, count, region in self._regions:
            inside = (src >= first) & (src < first + count)
            if inside.any():
                part = pick(first, count, region)
                if tiles is None:
                    tiles = np.zeros((part.shape[0],) + src.shape + (bo, bi), part.dtype)
                tiles[:, inside] = part[:, src[inside] - first]
        cells, nb, nn, nk = tiles.shape[:4]
        return tiles.transpose(0, 1, 3, 5, 2, 4).reshape(cells, nb, nk * bi, nn * bo)

    def weights(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(cells, nb, K, N) digits of GEMM ``i``'s weight block as read now, and as read
        right after programming (drift compensation only); one copy per block."""
        block = self.cmap.block_of[i]
        hit = self._gemm_w.get(block)
        if hit is None:
            now = self._gather(i, lambda f, c, r: self._digits(f, c, r)[0])
            ref = (self._gather(i, lambda f, c, r: self._digits(f, c, r)[1])
                   if self.cfg.drift_compensation else None)
            hit = self._gemm_w[block] = (now, ref)
            self._cached_bytes += now.nbytes + (0 if ref is None else ref.nbytes)
            while self._cached_bytes > WEIGHT_CACHE_BYTES and len(self._gemm_w) > 1:
                old_now, old_ref = self._gemm_w.pop(next(iter(self._gemm_w)))
                self._cached_bytes -= old_now.nbytes + (0 if old_ref is None else old_ref.nbytes)
        return hit

    def _periphery_of(self, block: int, now: np.ndarray, ref: np.ndarray | None) -> Periphery:
        """The periphery of one weight block's crossbars (shared by every GEMM that reads
        them: a layer's pixel tiles see the same columns and ADCs)."""
        hit = self._periphery.get(block)
        if hit is None:
            gain = drift_gain(now, ref, self.geom) if ref is not None else None
            rec = self._recorders.get(block) if not _session.get() else None
            if rec is not None:
                hit = rec.periphery(self.geom, gain, self.cfg.adc_calibration,
                                    self.cfg.bias_correction)
            else:
                hit = Periphery(gain=gain)
            if not _session.get():
                self._periphery[block] = hit
        return hit

    def _exact(self, i: int) -> np.ndarray:
        """(nb, K, N) float64 integer weights of GEMM ``i`` (what calibration compares with)."""
        return self._gather(i, lambda f, c, r: self._codes(c, r)[None].astype(
            np.float64))[0]

    def _colsum(self, i: int) -> np.ndarray:
        """(nb, N) column sums of GEMM ``i``'s exact weights (one per block)."""
        block = self.cmap.block_of[i]
        hit = self._colsums.get(block)
        if hit is None:
            hit = self._colsums[block] = self._exact(i).sum(axis=1)
        return hit

    def gemm(self, i: int, x: np.ndarray) -> np.ndarray:
        """int64 (batch, nb, nm, N) result of GEMM ``i`` on inputs ``x`` (batch, nb, nm, K)."""
        now, ref = self.weights(i)
        block = self.cmap.block_of[i]
        rng = np.random.default_rng([self.seed, self._salt, i]) if self.geom.mvm_noise else None
        zp = self.cmap.input_zp.get(i, 0)
        shift = dict(zero_point=zp, colsum=self._colsum(i) if zp else None)
        session = _session.get()
        if not session:
            return analog_matmul(x, now, self.geom, rng, self._periphery_of(block, now, ref),
                                 **shift)
        if session != self._recorded_in:      # a new calibration: forget the old one
            self._recorders.clear()
            self._periphery.clear()
            self._recorded_in = session
        rec = self._recorders.setdefault(block, Recorder())
        return analog_matmul(x, now, self.geom, rng, self._periphery_of(block, now, ref), rec,
                             self._exact(i) if self.cfg.bias_correction else None, **shift)
