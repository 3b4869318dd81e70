"""Simulator speed benchmark: values+timing runs of compiled programs against the fastest exact numpy.

Every program it times comes out of the compiler's own lowering
(``dsa_tvm.lowering.region.compile_region``: TE compute, schedule, TIR walker,
dependency tokens), one one-layer :class:`~dsa_tvm.layers.ir.Region` each:
(1) a 1024x1024x1024 int8 matmul as a Dense layer (bias, per-channel requantize,
nonzero zero points) and (2) the distinct conv layers of ResNet-50 at 224x224
(stem, the bottleneck 1x1/3x3/1x1 convs of the four stages and the strided 1x1
downsample convs) as Conv2d layers, on one hardware preset. For each it prints
the wall time of a simulated run with values and timing, simulated cycles,
simulated cycles per wall second, MAC utilization, the wall time of a
timing-only run, and the wall time numpy takes for the same exact integer
arithmetic (BLAS matmul on exactly representable floats, im2col via
sliding_window_view for convs, then requantize), best of N repetitions each.
A whole-network line multiplies every layer by its repetition count in ResNet-50.

It prints and never asserts times (the machine is shared and noisy); bit-exactness
of every simulated output against numpy, and of numpy against the CPU reference
(``tir_schedules.kinds.run_region``), is checked and printed.

    python benchmarks/bench_sim.py                      # default preset, best of 3
    python benchmarks/bench_sim.py --preset edge --reps 5
    python benchmarks/bench_sim.py --only matmul        # or: --only conv, --layers s1.c2,stem
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.semantics import quantize_multiplier
from dsa_tvm.layers import ir as L
from dsa_tvm.layers.host_pack import pack_region_input
from dsa_tvm.layers.layouts import unpack_activation
from dsa_tvm.lowering.region import compile_region, lowering_supports
from dsa_tvm.sim.simulator import Simulator
from tir_schedules.kinds import run_region

# Goals (see benchmarks/README.md)
GOAL_CYCLES_PER_S = 1e7
GOAL_RATIO = 5.0

#: input and output zero points of every benchmarked layer (nonzero: the pads and
#: the output stage pay for them as a real network's layers do)
INPUT_ZP, OUTPUT_ZP = -3, 5

#: name, H, W, Cin, Cout, K, stride, pad, repetitions in ResNet-50, relu after
RESNET50_CONVS = [
    ("stem", 224, 224, 3, 64, 7, 2, 3, 1, True),
    ("s1.c1", 56, 56, 64, 64, 1, 1, 0, 1, True),
    ("s1.c2", 56, 56, 64, 64, 3, 1, 1, 3, True),
    ("s1.c3", 56, 56, 64, 256, 1, 1, 0, 4, False),      # 3 x conv3 + the 1x1 downsample
    ("s1.c1b", 56, 56, 256, 64, 1, 1, 0, 2, True),
    ("s2.c1", 56, 56, 256, 128, 1, 1, 0, 1, True),
    ("s2.c2/2", 56, 56, 128, 128, 3, 2, 1, 1, True),
    ("s2.c3", 28, 28, 128, 512, 1, 1, 0, 4, False),
    ("s2.ds/2", 56, 56, 256, 512, 1, 2, 0, 1, False),
    ("s2.c1b", 28, 28, 512, 128, 1, 1, 0, 3, True),
    ("s2.c2", 28, 28, 128, 128, 3, 1, 1, 3, True),
    ("s3.c1", 28, 28, 512, 256, 1, 1, 0, 1, True),
    ("s3.c2/2", 28, 28, 256, 256, 3, 2, 1, 1, True),
    ("s3.c3", 14, 14, 256, 1024, 1, 1, 0, 6, False),
    ("s3.ds/2", 28, 28, 512, 1024, 1, 2, 0, 1, False),
    ("s3.c1b", 14, 14, 1024, 256, 1, 1, 0, 5, True),
    ("s3.c2", 14, 14, 256, 256, 3, 1, 1, 5, True),
    ("s4.c1", 14, 14, 1024, 512, 1, 1, 0, 1, True),
    ("s4.c2/2", 14, 14, 512, 512, 3, 2, 1, 1, True),
    ("s4.c3", 7, 7, 512, 2048, 1, 1, 0, 3, False),
    ("s4.ds/2", 14, 14, 1024, 2048, 1, 2, 0, 1, False),
    ("s4.c1b", 7, 7, 2048, 512, 1, 1, 0, 2, True),
    ("s4.c2", 7, 7, 512, 512, 3, 1, 1, 2, True),
]


#: the clock best_of reads: time.perf_counter (wall) or time.process_time (--clock cpu)
CLOCK = time.perf_counter


def best_of(fn, reps: int):
    """(best seconds on CLOCK, result of the last call)."""
    best, out = float("inf"), None
    for _ in range(reps):
        t = CLOCK()
        out = fn()
        best = min(best, CLOCK() - t)
    return best, out


# ----------------------------------------------------------------------------- numpy side
def fast_requantize(acc: np.ndarray, rq: L.Requant, channels: int) -> np.ndarray:
    """``reference.apply_requant`` (channels last) for shifts in 0..62 with in-place int64
    ops; returns int8."""
    mult, shift = (a.astype(np.int64) for a in rq.per_channel(channels))
    half = np.where(shift > 0, np.left_shift(1, np.maximum(shift - 1, 0)), 0)
    y = acc.astype(np.int64)
    y *= mult
    y += half
    y >>= shift
    y += rq.zero_point
    np.clip(y, *rq.clip, out=y)
    return y.astype(np.int8)


def exact_float(amax: int, colsum_max: int) -> type:
    """float32 when every partial sum is an integer below 2**24 (exact in any order)."""
    return np.float32 if amax * colsum_max < (1 << 24) else np.float64


def _centred_max(x: np.ndarray, zp: int) -> int:
    """max |x - zp| (pads are the zero point, 0 once centred)."""
    return max(abs(int(x.max()) - zp), abs(int(x.min()) - zp))


def numpy_dense(ly: L.Dense, x: np.ndarray) -> np.ndarray:
    """requant((x - zp) @ w.T + bias) exactly: x [M, K], w [N, K] int8."""
    w = ly.weight
    ft = exact_float(_centred_max(x, ly.input.zero_point),
                     int(np.abs(w.astype(np.int32)).sum(1).max()))
    xc = x.astype(ft)
    xc -= ly.input.zero_point
    acc = (xc @ w.astype(ft).T).astype(np.int64)
    acc += ly.bias
    return fast_requantize(acc, ly.requant, w.shape[0])


def numpy_conv(ly: L.Conv2d, x: np.ndarray) -> np.ndarray:
    """Exact int8 conv of one NCHW image: centre and pad, im2col (sliding_window_view),
    BLAS matmul, bias, requantize."""
    co, ci, kh, kw = ly.weight.shape
    wt = ly.weight.transpose(0, 2, 3, 1)                    # OHWI matches (KH, KW, C)
    zp = ly.input.zero_point
    (top, left, bottom, right), (sh, sw) = ly.padding, ly.strides
    ft = exact_float(_centred_max(x, zp), int(np.abs(wt.astype(np.int32)).reshape(co, -1)
                                             .sum(1).max()))
    img = x[0].transpose(1, 2, 0)                           # HWC: C innermost
    h, w_ = img.shape[:2]
    xp = np.zeros((h + top + bottom, w_ + left + right, ci), dtype=ft)
    inner = xp[top:top + h, left:left + w_]
    inner[...] = img
    inner -= zp
    if kh == kw == 1:
        cols = xp[::sh, ::sw].reshape(-1, ci)
    else:
        win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(0, 1))
        win = win[::sh, ::sw]                               # (OH, OW, C, KH, KW) view
        # copy as (OH, OW, KH, KW, C): C innermost keeps the gather contiguous (~10x
        # faster than copying the view in its own order)
        cols = np.ascontiguousarray(win.transpose(0, 1, 3, 4, 2)).reshape(-1, kh * kw * ci)
    acc = (cols @ wt.reshape(co, -1).astype(ft).T).astype(np.int64)
    acc += ly.bias
    oh, ow = ly.output.shape[2:]
    return fast_requantize(acc, ly.requant, co).reshape(oh, ow, co).transpose(2, 0, 1)[None]


# ----------------------------------------------------------------------------- layers
def random_requant(rng, channels: int, relu: bool) -> L.Requant:
    """Per-channel multipliers for accumulators of ~1e4..1e5; ReLU clips at the zero point."""
    ms = [quantize_multiplier(float(s)) for s in rng.uniform(2e-4, 2e-3, channels)]
    return L.Requant(np.array([m for m, _ in ms], np.int32), np.array([s for _, s in ms], np.int32),
                     OUTPUT_ZP, (OUTPUT_ZP, 127) if relu else (-128, 127))


def dense_region(rng, n: int) -> L.Region:
    """One Dense layer [n, n] x [n, n]^T: the n^3 matmul as the compiler sees it."""
    x = L.QTensor("x", (n, n), 0.05, INPUT_ZP)
    y = L.QTensor("y", (n, n), 0.05, OUTPUT_ZP)
    ly = L.Dense("matmul", x, y, rng.integers(-128, 128, (n, n), dtype=np.int8),
                 rng.integers(-20000, 20000, n).astype(np.int32), random_requant(rng, n, False))
    return L.Region("matmul", [x], [y], [ly])


def conv_region(rng, layer) -> L.Region:
    """One Conv2d layer of RESNET50_CONVS on a 1-image NCHW input."""
    name, h, w, ci, co, k, s, p, _, relu = layer
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    x = L.QTensor("x", (1, ci, h, w), 0.05, INPUT_ZP)
    y = L.QTensor("y", (1, co, oh, ow), 0.05, OUTPUT_ZP)
    ly = L.Conv2d(name, x, y, rng.integers(-128, 128, (co, ci, k, k), dtype=np.int8),
                  rng.integers(-20000, 20000, co).astype(np.int32), (s, s), (p, p, p, p),
                  (1, 1), 1, random_requant(rng, co, relu))
    return L.Region(name, [x], [y], [ly])


# ----------------------------------------------------------------------------- rows
def measure(sim: Simulator, prog, inputs, reps: int, numpy_fn):
    sim.run(prog, inputs)  # warm up (plans, caches)
    t_sim, res = best_of(lambda: sim.run(prog, inputs), reps)
    t_tim, _ = best_of(lambda: sim.run(prog, timing_only=True), reps)
    t_np, ref = best_of(numpy_fn, reps)
    return t_sim, t_tim, t_np, res, ref


def bench_region(cfg, sim, reps, rng, region: L.Region, numpy_fn, check_reference: bool,
                 **row) -> dict:
    """Compile a one-layer region, run it on the simulator and numpy_fn(layer, x) on the
    same input; the table row (``skipped``: why the compiler keeps the layer on the CPU)."""
    (xt,), (yt,), (ly,) = region.inputs, region.outputs, region.layers
    why = lowering_supports(ly, cfg)
    if why is not None:
        return dict(skipped=why, **row)
    x = rng.integers(-128, 128, xt.shape, dtype=np.int8)
    t0 = CLOCK()
    prog = compile_region(region, cfg).program
    t_build = CLOCK() - t0
    # the host's share (blocked layout; the stem's im2col) as the runtime does it, untimed
    feeds = pack_region_input(xt.name, x, prog.meta["io"][xt.name], cfg.block_in,
                              cfg.block_out)
    t_sim, t_tim, t_np, res, ref = measure(sim, prog, feeds, reps, lambda: numpy_fn(ly, x))
    out = unpack_activation(res.outputs[yt.name], yt.shape)
    exact = np.array_equal(out, ref)
    if check_reference:  # the project's CPU reference agrees with the fast numpy too
        exact = exact and np.array_equal(ref, run_region(region, {xt.name: x})[yt.name])
    return dict(macs=region.macs, cycles=res.cycles, t_sim=t_sim, t_tim=t_tim, t_np=t_np,
                t_build=t_build, exact=exact, util=res.counters["mac_utilization"],
                ninstr=len(prog.instructions), **row)


def bench_matmul(cfg, sim, reps, rng, n, check_reference: bool) -> dict:
    return bench_region(cfg, sim, reps, rng, dense_region(rng, n), numpy_dense,
                        check_reference, name=f"matmul {n}^3", count=1,
                        shape=f"{n}x{n}x{n} dense")


def bench_conv(cfg, sim, reps, rng, layer, check_reference: bool) -> dict:
    name, h, w, ci, co, k, s, _, count, _ = layer
    return bench_region(cfg, sim, reps, rng, conv_region(rng, layer), numpy_conv,
                        check_reference, name=name, count=count,
                        shape=f"{h}x{w}x{ci}->{co} k{k}/{s}")


# ----------------------------------------------------------------------------- table
HEAD = (f"{'layer':<18}{'shape':<22}{'x':>3}{'MMACs':>8}{'cycles':>11}{'sim ms':>9}"
        f"{'Mcyc/s':>8}{'timing ms':>10}{'util':>6}{'useful':>7}{'numpy ms':>9}"
        f"{'sim/np':>7}{'build ms':>9}{'instr':>6}  exact")


def fmt_row(r, peak):
    if "skipped" in r:
        return (f"{r['name']:<18}{r.get('shape', ''):<22}{r['count']:>3}  not lowered, stays "
                f"on the CPU: {r['skipped']}")
    useful = r["macs"] / (r["cycles"] * peak) if r["cycles"] else 0.0
    return (f"{r['name']:<18}{r.get('shape', ''):<22}{r['count']:>3}{r['macs'] / 1e6:>8.1f}"
            f"{r['cycles']:>11,}{r['t_sim'] * 1e3:>9.1f}{r['cycles'] / r['t_sim'] / 1e6:>8.1f}"
            f"{r['t_tim'] * 1e3:>10.1f}{r['util']:>6.2f}{useful:>7.2f}{r['t_np'] * 1e3:>9.1f}"
            f"{r['t_sim'] / r['t_np']:>7.2f}{r['t_build'] * 1e3:>9.1f}{r['ninstr']:>6}  "
            f"{'yes' if r['exact'] else 'NO'}")


def verdict(label, cyc_per_s, ratio):
    ok1 = cyc_per_s >= GOAL_CYCLES_PER_S
    ok2 = ratio <= GOAL_RATIO
    print(f"{label}: {cyc_per_s:.3g} simulated cycles/s (goal >= {GOAL_CYCLES_PER_S:.0e}: "
          f"{'met' if ok1 else 'NOT met'}), sim/numpy {ratio:.2f}x (goal <= {GOAL_RATIO:g}x: "
          f"{'met' if ok2 else 'NOT met'})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="default")
    ap.add_argument("--reps", type=int, default=3, help="best of N repetitions (default 3)")
    ap.add_argument("--only", choices=("matmul", "conv"), default=None)
    ap.add_argument("--layers", default="", help="comma-separated conv layer names")
    ap.add_argument("--matmul-size", type=int, default=1024)
    ap.add_argument("--no-reference", action="store_true",
                    help="skip cross-checking numpy against the CPU reference (run_region)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall time (default) or this process's CPU time; on a shared, busy "
                         "machine run `OPENBLAS_NUM_THREADS=1 ... --clock cpu` for numbers that "
                         "do not depend on what else runs (CPU time adds up all threads)")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter

    cfg = load_config(args.preset)
    sim = Simulator(cfg)
    rng = np.random.default_rng(0)
    peak = cfg.peak_macs_per_cycle
    print(f"DSA simulator benchmark on '{cfg.name}': {cfg.summary()}")
    print(f"clock: {args.clock}; best of {args.reps}; 'sim ms' = values+timing run, "
          f"'timing ms' = timing-only run, 'util' = array MAC slots issued / peak (padding "
          f"lanes count), 'useful' = real MACs / (cycles x peak)")
    print()
    print(HEAD)
    print("-" * len(HEAD))
    if args.only in (None, "matmul"):
        r = bench_matmul(cfg, sim, args.reps, rng, args.matmul_size,
                         not args.no_reference)
        print(fmt_row(r, peak), flush=True)
        mm = r
    if args.only in (None, "conv"):
        wanted = {s for s in args.layers.split(",") if s}
        unknown = wanted - {layer[0] for layer in RESNET50_CONVS}
        if unknown:
            ap.error(f"--layers: no conv layer named {', '.join(sorted(unknown))}; the names "
                     f"are {', '.join(layer[0] for layer in RESNET50_CONVS)}")
        rows, cpu = [], []
        for layer in RESNET50_CONVS:
            if wanted and layer[0] not in wanted:
                continue
            r = bench_conv(cfg, sim, args.reps, rng, layer, not args.no_reference)
            print(fmt_row(r, peak), flush=True)
            if "skipped" in r:
                cpu.append(r)
            else:
                rows.append(r)
        if rows:
            tot = {k: sum(r[k] * r["count"] for r in rows)
                   for k in ("macs", "cycles", "t_sim", "t_tim", "t_np", "t_build")}
            net = dict(name="ResNet-50 convs",
                       shape=f"(x reps; {len(cpu)} on CPU)" if cpu else "(x repetitions)",
                       count=sum(r["count"] for r in rows), util=sum(
                           r["util"] * r["cycles"] * r["count"] for r in rows) / tot["cycles"],
                       ninstr=sum(r["ninstr"] * r["count"] for r in rows),
                       exact=all(r["exact"] for r in rows), **tot)
            print("-" * len(HEAD))
            print(fmt_row(net, peak))
    print()
    if args.only in (None, "matmul"):
        verdict(f"matmul {args.matmul_size}^3", mm["cycles"] / mm["t_sim"],
                mm["t_sim"] / mm["t_np"])
    if args.only in (None, "conv") and rows:
        verdict("ResNet-50 convs (whole network)", net["cycles"] / net["t_sim"],
                net["t_sim"] / net["t_np"])
        print(f"ResNet-50 convs: {net['cycles']:,} cycles = {net['cycles'] / cfg.mhz / 1e3:.2f} ms "
              f"at {cfg.mhz:g} MHz; simulated in {net['t_sim']:.2f} s "
              f"(timing only {net['t_tim']:.2f} s), numpy {net['t_np']:.2f} s")
        if cpu:
            print(f"left out of the total (the compiler keeps them on the CPU): "
                  f"{', '.join(r['name'] for r in cpu)}")


if __name__ == "__main__":
    main()
