"""The crossbars of a CIM part holding one program's weights, as every run reads them.

Conductances are drawn once per program (seeded by ``cim.noise_seed``, the program's name
and each constant region's offset and bytes, so the same seed gives the same chip) and
read at ``cim.t_inference_s``; every run of the program reads the same arrays. The
per-read noise (``cim.mvm_noise``) is drawn anew for every read, from a generator seeded
by the instruction, so a run is reproducible too.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

from ..cim.crossbar import Geometry, analog_matmul, effective_weights
from ..cim.devices import DeviceModel
from .cim_mapping import CimMap

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig
    from ..isa.program import Program

#: GEMM weight matrices kept per program (the oldest go first)
WEIGHT_CACHE_SIZE = 64


class ProgrammedArrays:
    """One program's weights programmed into crossbars: what its analog GEMMs read."""

    def __init__(self, program: "Program", cfg: "HardwareConfig", cmap: CimMap):
        self.cmap = cmap
        self.geom = Geometry.from_config(cfg)
        self.model = DeviceModel.from_config(cfg)
        self.t_inference = cfg.t_inference_s
        self.seed = cfg.noise_seed
        self.tile_shape = (cfg.block_out, cfg.block_in)
        unit = cfg.wgt_tile_bytes
        self._salt = zlib.crc32(program.name.encode())
        # constant regions as (first tile, tile count, region): where an origin tile lives
        self._regions = sorted((r.offset // unit, r.nbytes // unit, r) for r in program.regions
                               if r.data is not None and r.nbytes >= unit)
        self._region_digits: dict[int, np.ndarray] = {}
        self._gemm_w: dict[int, np.ndarray] = {}

    @property
    def analog(self) -> dict[int, np.ndarray]:
        return self.cmap.analog

    def _digits(self, first: int, count: int, region) -> np.ndarray:
        """(cells, count, block_out, block_in) effective digits of a region's tiles."""
        hit = self._region_digits.get(first)
        if hit is None:
            codes = np.frombuffer(region.data, dtype=np.int8, count=count * np.prod(
                self.tile_shape)).reshape((count,) + self.tile_shape)
            rng = np.random.default_rng([self.seed, self._salt, region.offset,
                                         zlib.crc32(region.data)])
            hit = effective_weights(codes, self.geom, self.model, self.t_inference, rng)
            self._region_digits[first] = hit
        return hit

    def weights(self, i: int) -> np.ndarray:
        """(cells, nb, K, N) effective digits of GEMM ``i``'s weight block."""
        hit = self._gemm_w.get(i)
        if hit is not None:
            return hit
        src = self.cmap.analog[i]                       # (nb, nn, nk) origin tiles
        bo, bi = self.tile_shape
        tiles = np.zeros((self.geom.cells,) + src.shape + (bo, bi), dtype=np.float32)
        for first, count, region in self._regions:
            inside = (src >= first) & (src < first + count)
            if inside.any():
                tiles[:, inside] = self._digits(first, count, region)[:, src[inside] - first]
        cells, nb, nn, nk = tiles.shape[:4]
        w = tiles.transpose(0, 1, 3, 5, 2, 4).reshape(cells, nb, nk * bi, nn * bo)
        if len(self._gemm_w) >= WEIGHT_CACHE_SIZE:
            del self._gemm_w[next(iter(self._gemm_w))]
        self._gemm_w[i] = w
        return w

    def gemm(self, i: int, x: np.ndarray) -> np.ndarray:
        """int64 (batch, nb, nm, N) result of GEMM ``i`` on inputs ``x`` (batch, nb, nm, K)."""
        rng = np.random.default_rng([self.seed, self._salt, i]) if self.geom.mvm_noise else None
        return analog_matmul(x, self.weights(i), self.geom, rng)
