"""The grouped dense (int4 codes with a scale and a minimum per group of input rows,
GGUF Q4_1's grid) against a per-channel int4 dense of the same shape, simulated side by
side on one part: cycles, DRAM bytes read and their ratios, each program bit-exact
against its integer reference. SmolLM2's projection shapes at decode (one row) and a
16-row prefill tile::

    python benchmarks/bench_grouped_dense.py [--hw default] [--group 32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: (rows, K, N): q_proj/o_proj, gate/up, down at decode; a prefill tile of gate/up
SHAPES = ((1, 576, 576), (1, 576, 1536), (1, 1536, 576), (16, 576, 1536))


def run(layer, cfg, rng) -> dict[str, int]:
    """Compile and simulate one layer; its counters (bit-exact against the reference)."""
    from dsa_tvm.layers.host_pack import pack_region_input
    from dsa_tvm.layers.ir import Region
    from dsa_tvm.layers.layouts import unpack_activation
    from dsa_tvm.lowering.region import compile_region
    from dsa_tvm.sim.simulator import Simulator
    from tir_schedules.kinds import run_region

    reg = Region("r", [layer.input], [layer.output], [layer])
    x = rng.integers(-128, 128, layer.input.shape, dtype=np.int8)
    prog = compile_region(reg, cfg).program
    feeds = pack_region_input("x", x, prog.meta["io"]["x"], cfg.block_in, cfg.block_out)
    res = Simulator(cfg).run(prog, feeds)
    got = unpack_activation(res.outputs[layer.output.name], layer.output.shape)
    if not np.array_equal(got, run_region(reg, {"x": x})[layer.output.name]):
        raise SystemExit(f"{layer.name}: the DSA differs from the integer reference")
    return res.counters


def main() -> None:
    from dsa_tvm.hw.config import load_config
    from dsa_tvm.isa import semantics as sem
    from dsa_tvm.layers import ir as L
    from dsa_tvm.layers.group_grid import group_grid, grouped_dense

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hw", default="default")
    ap.add_argument("--group", type=int, default=32)
    args = ap.parse_args()
    cfg = load_config(args.hw)
    rng = np.random.default_rng(0)
    print(f"{'rows x K x N':>16} {'grouped cyc':>12} {'int4 cyc':>10} {'ratio':>6} "
          f"{'grouped KB':>11} {'int4 KB':>8} {'ratio':>6}")
    for m, k, n in SHAPES:
        x = L.QTensor("x", (m, k), 0.02, 3)
        y = L.QTensor("y", (m, n), 0.05, -2)
        grouped = grouped_dense("grouped", x, y, group_grid(rng.normal(0, 0.05, (n, k)),
                                                           args.group))
        mult, shift = sem.quantize_multipliers(np.full(n, 1e-3))
        per_channel = L.Dense("int4", x, y, rng.integers(-8, 8, (n, k)).astype(np.int8),
                              np.zeros(n, np.int32), L.Requant(mult, shift, 0))
        g, d = run(grouped, cfg, rng), run(per_channel, cfg, rng)
        print(f"{f'{m} x {k} x {n}':>16} {g['cycles']:>12,} {d['cycles']:>10,} "
              f"{g['cycles'] / d['cycles']:>6.2f} {g['dram_read_bytes'] / 1e3:>11,.1f} "
              f"{d['dram_read_bytes'] / 1e3:>8,.1f} "
              f"{g['dram_read_bytes'] / d['dram_read_bytes']:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
