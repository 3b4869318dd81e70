"""Depthwise benchmark: each depthwise layer's DSA cycles against its roofline bound.

Compiles a bundled network (QDQ int8) for a preset, runs it on the simulator and
prints, per depthwise layer: the engine its schedule uses (``vector``: the ALU MAC
over accumulator rows, ``array``: diagonal weight tiles), the busy cycles of the
load / compute / store engines, the cycles charged to it, its bound and the ratio;
then the network's cycles against the sum of every DSA layer's bound. The bound is
the one the program's layer table records: max(MACs / peak MACs per cycle,
compulsory DRAM bytes / bandwidth); ``floor`` is the fewest cycles this ISA allows (one
compute step per accumulator row and tap on the array, per ``mac8_ways`` taps on the
vector unit, plus the requant step: the engine's ceiling, whatever the mapping).
Goals (issue 13): depthwise <= 2x, the network <= 1.2x. Never asserts::

    python benchmarks/bench_depthwise.py [mobilenet_v2 ...] [--hw default] [--size 224]
        [--engine auto|vector|array] [--lanes 64] [--all]
"""

from __future__ import annotations

import argparse
import math


def layer_bound(meta: dict, cfg) -> float:
    """max(compute bound, DRAM bound) of one entry of a program's layer table."""
    from dsa_tvm.layers.checks import compute_bound

    dram = (meta["min_read_bytes"] + meta["min_write_bytes"]) / cfg.bandwidth_bytes_per_cycle
    return max(compute_bound(int(meta["macs"]), cfg.peak_macs_per_cycle), math.ceil(dram))


def engine_floor(layer, cfg) -> float:
    """Fewest compute-engine cycles of a depthwise layer on this ISA: every output row of
    ``block_out`` channels takes one step per tap on the array (a GEMM step) or one per
    ``mac8_ways`` taps on the vector unit (a MAC8 step), whichever is faster, and one
    requant step."""
    n, c, oh, ow = layer.output.shape
    kh, kw = layer.weight.shape[2:]
    rows = n * oh * ow * -(-c // cfg.block_out)
    alu = cfg.alu_cycles_per_row
    return rows * (min(kh * kw, -(-kh * kw // cfg.dot_ways) * alu) + alu)


def engine_of(meta: dict) -> str:
    """The depthwise engine a layer's knobs belong to (conv knobs: the array)."""
    return "array" if "weights_outer" in meta.get("knobs", {}) else "vector"


def bench(name: str, hw: str, size: int, engine: str, show_all: bool,
          lanes: int | None = None) -> dict:
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    import dsa_tvm
    from dsa_tvm.models.zoo import get_model
    from dsa_tvm.report import build_report
    from dsa_tvm.runtime import take_launches

    cfg = dsa_tvm.load_config(hw)
    if lanes:
        cfg = cfg.replace(lanes=lanes)
    qdq = get_model(name, quantized=True, input_size=size)
    with dsa_tvm.options(depthwise_engine=engine):
        ex = tvm.compile(from_onnx(qdq, keep_params_in_input=False), target=dsa_tvm.target(cfg))
    crep = dsa_tvm.last_compile_report()
    dw_layers = {ly.name: ly for d in crep.regions if d.region is not None
                 for ly in d.region.layers if getattr(ly, "depthwise", False)}
    vm = relax.VirtualMachine(ex, tvm.cpu())
    shape = tuple(int(d.dim_value) for d in qdq.graph.input[0].type.tensor_type.shape.dim)
    x = np.random.default_rng(7).standard_normal(shape).astype("float32")
    take_launches()
    vm["main"](tvm.runtime.tensor(x))
    launches = take_launches()
    rep = build_report(launches)
    metas = {m["name"]: m for ln in launches for m in ln.program.meta.get("layers", [])}
    print(f"\n{name} (input {size}) on '{hw}' ({cfg.lanes} vector lanes), depthwise "
          f"engine {engine}")
    print(f"  {'layer':<28} {'engine':<6} {'knobs':<12} {'load':>9} {'compute':>9} {'store':>9} "
          f"{'cycles':>10} {'bound':>9} {'x bound':>7} {'floor':>9} {'x floor':>7}")
    total_bound = dw_cycles = dw_bound = 0.0
    worst = 0.0
    for r in rep.rows:
        m = metas[r.name]
        bound = layer_bound(m, cfg)
        total_bound += bound
        is_dw = r.name in dw_layers
        if is_dw:
            dw_cycles += r.cycles
            dw_bound += bound
            worst = max(worst, r.cycles / bound)
        if is_dw or show_all:
            eng = engine_of(m) if is_dw else "-"
            fl = engine_floor(dw_layers[r.name], cfg) if is_dw else 0.0
            knobs = ",".join(str(int(v)) for v in m.get("knobs", {}).values())
            print(f"  {r.name[:28]:<28} {eng:<6} {knobs:<12} {r.load_cycles:>9,} "
                  f"{r.compute_cycles:>9,} {r.store_cycles:>9,} {r.cycles:>10,} {bound:>9,.0f} "
                  f"{r.cycles / bound:>7.2f}" + (f" {fl:>9,.0f} {r.cycles / fl:>7.2f}" if is_dw else ""))
    res = {"net": name, "cycles": rep.total_cycles, "bound": total_bound,
           "dw_cycles": dw_cycles, "dw_bound": dw_bound, "dw_worst": worst,
           "dw_share": dw_cycles / rep.total_cycles if rep.total_cycles else 0.0,
           "launches": len(launches), "violations": len(rep.violations)}
    print(f"  depthwise: {dw_cycles:,.0f} cycles for {dw_bound:,.0f} bound "
          f"({dw_cycles / max(dw_bound, 1):.2f}x, worst layer {worst:.2f}x, "
          f"{res['dw_share']:.1%} of the DSA cycles)")
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("nets", nargs="*", default=["mobilenet_v2"])
    ap.add_argument("--hw", default="default")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--engine", default="auto", choices=("auto", "vector", "array"))
    ap.add_argument("--all", action="store_true", help="print every DSA layer")
    ap.add_argument("--lanes", type=int, help="the preset with this many vector lanes "
                    "(wider than block_out: several accumulator rows per cycle)")
    a = ap.parse_args()
    rows = [bench(n, a.hw, a.size, a.engine, a.all, a.lanes) for n in a.nets]
    print(f"\n{'network':<14} {'launches':>8} {'DSA cycles':>12} {'sum bounds':>12} "
          f"{'x bound':>8} {'dw x bound':>10} {'dw worst':>8} {'dw share':>8} {'impossible':>10}")
    for r in rows:
        print(f"{r['net']:<14} {r['launches']:>8} {r['cycles']:>12,} {r['bound']:>12,.0f} "
              f"{r['cycles'] / r['bound']:>8.3f} {r['dw_cycles'] / max(r['dw_bound'], 1):>10.2f} "
              f"{r['dw_worst']:>8.2f} {r['dw_share']:>8.1%} {r['violations']:>10}")
    print("goals: every depthwise layer <= 2x its bound, the network <= 1.2x the sum of bounds")


if __name__ == "__main__":
    main()
