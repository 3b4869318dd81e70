"""ONNX node-suite conformance: every node case through ``dsa_tvm.onnx_backend`` with
target llvm and target dsa (one import, one compile per target).

Prints: cases, how many TVM imports and llvm builds and runs correctly, dsa breaks
(raised or changed an answer where llvm runs: must be 0), dsa wrong (must be 0),
cases with a region offloaded, and the wall time. ``--write-expected`` regenerates
``tests/e2e/onnx_conformance_expected.json`` (the cases llvm does not run correctly,
with reasons); otherwise the run is compared with it.

    python benchmarks/bench_conformance.py [-k SUBSTRING] [--write-expected] [--hw default]
                                          [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    ap.add_argument("--hw", default=None, help="hardware description (preset or TOML)")
    ap.add_argument("--write-expected", action="store_true",
                    help="regenerate tests/e2e/onnx_conformance_expected.json from this run")
    ap.add_argument("-v", action="store_true", help="one line per case")
    ap.add_argument("--workers", type=int, default=1, help="processes sharing the cases")
    args = ap.parse_args(argv)

    from dsa_tvm import conformance as C

    t0 = time.perf_counter()
    cases = [c for c in C.node_cases() if args.k in c.name]
    t_cases = time.perf_counter() - t0

    def show(r):
        if args.v or r in C.dsa_breaks([r]):
            print(f"{r.name}: llvm {r.llvm} {r.llvm_reason} | dsa {r.dsa} {r.dsa_reason}"
                  f"{' | offloaded ' + str(r.offloaded) if r.offloaded else ''}", flush=True)

    results = C.sweep(cases, args.hw, progress=show, workers=args.workers)
    wall = time.perf_counter() - t0
    for k, v in C.summary(results).items():
        print(f"{k:>30}: {v}")
    print(f"{'seconds':>30}: {wall:.1f} ({t_cases:.1f} generating the cases)")
    if args.write_expected:
        if args.k:
            print("--write-expected needs the whole suite (no -k)", file=sys.stderr)
            return 2
        print(f"wrote {C.write_expected(results)}")
        return 0
    fixed, broken = C.compare_expected(results, C.load_expected())
    for line in fixed:
        print(f"now passes under llvm (regenerate the expectations): {line}")
    for line in broken:
        print(f"llvm regressed: {line}")
    return 1 if C.dsa_breaks(results) else 0


if __name__ == "__main__":
    sys.exit(main())
