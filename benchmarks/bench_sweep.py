"""Sweep speed with and without the program cache, and the must-show sweeps.

    python benchmarks/bench_sweep.py                       # ResNet-50, 27 points, cache on/off
    python benchmarks/bench_sweep.py resnet18 mobilenet_v2 --out sweep_out --no-compare
    python benchmarks/bench_sweep.py --timing-axes        # 27 points that differ in timing only

The 27 points are array 8/16/32 x DRAM 4/16/64 B/cycle x weight SRAM 64/128/256 KiB on
`default`. Both runs use the same workers (all cores) in one invocation, so the ratio is
measured side by side; each run starts with fresh worker processes (cold caches).
"""

from __future__ import annotations

import argparse
import sys
import time

from dsa_tvm.sweep import sweep

AXES = ["array=8,16,32", "dram.bandwidth_bytes_per_cycle=4,16,64", "sram.wgt_kib=64,128,256"]
#: points that differ only in fields the code generator never reads (program_cache.TIMING_ONLY)
TIMING_AXES = ["clock.mhz=500,1000,2000", "energy.dram_byte_pj=20,40,80",
               "host.launch_overhead_us=5,20,50"]
GOAL_S = 300.0   # issue 16: ResNet-50 over 27 design points in under 5 minutes on 2 cores


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("models", nargs="*", default=["resnet50"])
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--out", default=None, help="write sweep.csv/json and pareto.png here")
    p.add_argument("--no-compare", action="store_true", help="only the cached run")
    p.add_argument("--timing-axes", action="store_true",
                   help="sweep clock x DRAM energy x launch overhead instead (timing-only fields)")
    args = p.parse_args(argv)
    runs = {}
    for cache in (True,) if args.no_compare else (True, False):
        t0 = time.perf_counter()
        res = sweep(args.models, TIMING_AXES if args.timing_axes else AXES,
                    workers=args.workers, cache=cache)
        runs[cache] = time.perf_counter() - t0
        print(res)
        if cache and args.out:
            for what, path in res.write(args.out).items():
                print(f"{what}: {path}")
        print(f"program cache {'on' if cache else 'off'}: {len(res.results)} runs in "
              f"{runs[cache]:.1f} s on {res.workers} worker(s)", flush=True)
    if False in runs:
        print(f"\nsweep speed: cache on {runs[True]:.1f} s, off {runs[False]:.1f} s "
              f"({runs[False] / runs[True]:.2f}x); goal < {GOAL_S:.0f} s: "
              f"{'met' if runs[True] < GOAL_S else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
