"""Features of a DSA candidate for MetaSchedule's XGBoost cost model.

The stock extractor (``per-store-feature``) looks at the loops and stores of the
scheduled TIR; a DSA candidate is the unscheduled compute plus sampling
annotations (``tir_schedules.kinds.space``), and the scheduled DSA TIR is call-only
tensorized code, so it would see nothing that varies and XGBoost would predict
noise. This extractor reads the knobs instead and describes what decides DSA
time: the tile sizes (log2), the loop order and double buffering, how many tiles
run (instructions, DMA transfers and their latency), how full each scratchpad is,
and the analytic estimate of the default-schedule heuristic. One row per
candidate; cheap (no lowering), since it runs on the whole evolutionary population.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.feature_extractor import PyFeatureExtractor

from .task import task_of

N_TILES = 4       # tile-size slots (conv has four tile knobs, window three)
N_FLAGS = 2       # boolean slots (resident operand, double buffering)
N_FEATURES = N_TILES + N_FLAGS + 1 + 3 + 1


def knob_features(cfg, shape, knobs) -> np.ndarray:
    """The feature row of one knob setting (fixed length across layer kinds)."""
    from tir_schedules.kinds import kind_of

    kind = kind_of(shape)
    tiles, flags, n_tiles = [], [], 1.0
    extents = kind.extents(shape)
    for f in kind.tiles(shape):
        t = getattr(knobs, f)
        tiles.append(math.log2(t))
        n_tiles *= extents[f] / t
    for f in dataclasses.fields(knobs):
        if f.type in (bool, "bool"):
            flags.append(float(getattr(knobs, f.name)))
    fill = kind.fill(cfg, shape, knobs)
    est = kind.estimate(cfg, shape, knobs)
    row = (tiles + [0.0] * (N_TILES - len(tiles)) + flags + [0.0] * (N_FLAGS - len(flags))
           + [math.log2(max(n_tiles, 1.0))] + fill + [math.log2(max(est, 1.0))])
    return np.asarray(row, np.float32)


@derived_object
class KnobFeatures(PyFeatureExtractor):
    """One feature row per candidate, from its knobs (see the module docstring)."""

    def extract_from(self, context, candidates) -> list:
        import tvm

        from tir_schedules.kinds.space import knobs_from_mod

        out = []
        for cand in candidates:
            mod = cand.sch.mod
            task = task_of(mod)
            row = knob_features(task.cfg, task.shape, knobs_from_mod(mod, task.shape))
            out.append(tvm.runtime.tensor(row[None, :]))
        return out
