"""Simulator speed benchmark: values+timing runs against the fastest exact numpy.

Runs (1) a 1024x1024x1024 int8 matmul program (double-buffered, per-channel
requantize) and (2) the distinct conv layers of ResNet-50 at 224x224 (stem, the
bottleneck 1x1/3x3/1x1 convs of the four stages and the strided 1x1 downsample
convs) as hand-written conv2d programs, on one hardware preset. For each it
prints the wall time of a simulated run with values and timing, simulated
cycles, simulated cycles per wall second, MAC utilization, the wall time of a
timing-only run, and the wall time numpy takes for the same exact integer
arithmetic (BLAS matmul on exactly representable floats, im2col via
sliding_window_view for convs, then requantize), best of N repetitions each.
A whole-network line multiplies every layer by its repetition count in ResNet-50.

It prints and never asserts times (the machine is shared and noisy); bit-exactness
of every simulated output against numpy is checked and printed.

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
from dsa_tvm.programs.conv2d import (
    conv2d_program,
    pack_conv_weights,
    pack_input,
    pack_qparams,
    reference_conv2d,
    unpack_output,
)
from dsa_tvm.programs.matmul import matmul_program, pack_weights, pad_cols
from dsa_tvm.sim.simulator import Simulator

# Goals (see benchmarks/README.md)
GOAL_CYCLES_PER_S = 1e7
GOAL_RATIO = 5.0

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
def fast_requantize(acc: np.ndarray, mult: np.ndarray, shift: np.ndarray, zp: int,
                    relu: bool = False) -> np.ndarray:
    """sem.requantize for shifts in 0..62 with in-place int64 ops; returns int8."""
    mult = mult.astype(np.int64)
    shift = shift.astype(np.int64)
    half = np.where(shift > 0, np.left_shift(1, np.maximum(shift - 1, 0)), 0)
    y = acc.astype(np.int64)
    y *= mult
    y += half
    y >>= shift
    y += zp
    np.clip(y, zp if relu else -128, 127, out=y)
    return y.astype(np.int8)


def exact_float(amax: int, colsum_max: int) -> type:
    """float32 when every partial sum is an integer below 2**24 (exact in any order)."""
    return np.float32 if amax * colsum_max < (1 << 24) else np.float64


def numpy_matmul(x: np.ndarray, w: np.ndarray, mult, shift) -> np.ndarray:
    """requant(x @ w.T) exactly: x [M, K], w [N, K] int8."""
    ft = exact_float(int(np.abs(x).max()), int(np.abs(w.astype(np.int32)).sum(1).max()))
    acc = x.astype(ft) @ w.astype(ft).T
    return fast_requantize(acc, mult, shift, 0)


def numpy_conv(x: np.ndarray, wt: np.ndarray, stride: int, pad: int, bias, mult, shift,
               input_zp: int, output_zp: int, relu: bool) -> np.ndarray:
    """Exact int8 conv: pad, im2col (sliding_window_view), BLAS matmul, requantize."""
    co, kh, kw, ci = wt.shape
    amax = max(int(np.abs(x).max()), abs(input_zp) if pad else 0)
    ft = exact_float(amax, int(np.abs(wt.astype(np.int32)).reshape(co, -1).sum(1).max()))
    h, w_, _ = x.shape
    xp = np.full((h + 2 * pad, w_ + 2 * pad, ci), input_zp, dtype=ft)
    xp[pad:pad + h, pad:pad + w_] = x
    if kh == kw == 1:
        cols = xp[::stride, ::stride].reshape(-1, ci)
        wm = wt.reshape(co, ci)
    else:
        win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(0, 1))
        win = win[::stride, ::stride]                       # (OH, OW, C, KH, KW) view
        oh, ow = win.shape[:2]
        # copy as (OH, OW, KH, KW, C): C innermost keeps the gather contiguous (~10x
        # faster than copying the view in its own order)
        cols = np.ascontiguousarray(win.transpose(0, 1, 3, 4, 2)).reshape(oh * ow, -1)
        wm = wt.reshape(co, -1)                             # OHWI matches (KH, KW, C)
    acc = cols @ wm.astype(ft).T
    if bias is not None:
        acc = acc.astype(np.int64)
        acc += bias
    out = fast_requantize(acc, mult, shift, output_zp, relu)
    oh = (h + 2 * pad - kh) // stride + 1
    return out.reshape(oh, -1, co)


# ----------------------------------------------------------------------------- rows
def random_qparams(rng, n: int):
    ms = [quantize_multiplier(float(s)) for s in rng.uniform(2e-4, 2e-3, n)]
    return (np.array([m for m, _ in ms], dtype=np.int64),
            np.array([s for _, s in ms], dtype=np.int64))


def measure(sim: Simulator, prog, inputs, reps: int, numpy_fn):
    sim.run(prog, inputs)  # warm up (plans, caches)
    t_sim, res = best_of(lambda: sim.run(prog, inputs), reps)
    t_tim, _ = best_of(lambda: sim.run(prog, timing_only=True), reps)
    t_np, ref = best_of(numpy_fn, reps)
    return t_sim, t_tim, t_np, res, ref


def bench_matmul(cfg, sim, reps, rng, n=1024):
    m = k = n
    x = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    mult, shift = random_qparams(rng, n)
    t0 = CLOCK()
    prog = matmul_program(cfg, m, n, k, requant=True, double_buffer=True)
    t_build = CLOCK() - t0
    qp = pack_qparams(mult, shift, cfg)
    inputs = {"x": pad_cols(x, cfg.block_in), "w": pack_weights(w, cfg), "qp": qp}
    t_sim, t_tim, t_np, res, ref = measure(sim, prog, inputs, reps,
                                           lambda: numpy_matmul(x, w, mult, shift))
    exact = np.array_equal(res.outputs["out"][:, :n], ref)
    return dict(name=f"matmul {m}x{n}x{k}", count=1, macs=m * n * k, cycles=res.cycles,
                t_sim=t_sim, t_tim=t_tim, t_np=t_np, t_build=t_build, exact=exact,
                util=res.counters["mac_utilization"], ninstr=len(prog.instructions))


def bench_conv(cfg, sim, reps, rng, layer, check_reference: bool):
    name, h, w, ci, co, k, s, p, count, relu = layer
    x = rng.integers(-128, 128, (h, w, ci), dtype=np.int8)
    wt = rng.integers(-128, 128, (co, k, k, ci), dtype=np.int8)
    bias = rng.integers(-20000, 20000, co).astype(np.int64)
    mult, shift = random_qparams(rng, co)
    in_zp, out_zp = -3, 5
    t0 = CLOCK()
    prog = conv2d_program(cfg, h, w, ci, co, k, k, s, p, double_buffer=True, requant=True,
                          relu=relu, input_zp=in_zp, output_zp=out_zp, name=name)
    t_build = CLOCK() - t0
    # bias, mult, shift rows: the fused REQUANT adds the bias, requantizes and applies ReLU
    qp = pack_qparams(mult, shift, cfg, bias=bias)
    inputs = {"x": pack_input(x, cfg), "w": pack_conv_weights(wt, cfg), "qp": qp}
    t_sim, t_tim, t_np, res, ref = measure(
        sim, prog, inputs, reps,
        lambda: numpy_conv(x, wt, s, p, bias, mult, shift, in_zp, out_zp, relu))
    out = unpack_output(res.outputs["out"], co)
    exact = np.array_equal(out, ref)
    if check_reference:  # the shared-semantics reference agrees with the fast numpy too
        exact = exact and np.array_equal(
            ref, reference_conv2d(x, wt, qp, s, p, None, in_zp, out_zp, relu))
    macs = prog.meta["macs"]
    return dict(name=name, count=count, macs=macs, cycles=res.cycles, t_sim=t_sim,
                t_tim=t_tim, t_np=t_np, t_build=t_build, exact=exact,
                util=res.counters["mac_utilization"], ninstr=len(prog.instructions),
                shape=f"{h}x{w}x{ci}->{co} k{k}/{s}")


# ----------------------------------------------------------------------------- table
HEAD = (f"{'layer':<18}{'shape':<22}{'x':>3}{'MMACs':>8}{'cycles':>11}{'sim ms':>9}"
        f"{'Mcyc/s':>8}{'timing ms':>10}{'util':>6}{'useful':>7}{'numpy ms':>9}"
        f"{'sim/np':>7}{'build ms':>9}{'instr':>6}  exact")


def fmt_row(r, peak):
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
                    help="skip cross-checking numpy against reference_conv2d")
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
        r = bench_matmul(cfg, sim, args.reps, rng, args.matmul_size)
        print(fmt_row(r, peak), flush=True)
        mm = r
    if args.only in (None, "conv"):
        wanted = {s for s in args.layers.split(",") if s}
        rows = []
        for layer in RESNET50_CONVS:
            if wanted and layer[0] not in wanted:
                continue
            r = bench_conv(cfg, sim, args.reps, rng, layer, not args.no_reference)
            rows.append(r)
            print(fmt_row(r, peak), flush=True)
        if rows:
            tot = {k: sum(r[k] * r["count"] for r in rows)
                   for k in ("macs", "cycles", "t_sim", "t_tim", "t_np", "t_build")}
            net = dict(name="ResNet-50 convs", shape="(x repetitions)",
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


if __name__ == "__main__":
    main()
