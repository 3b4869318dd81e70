"""Memory of a serving loop: run small_cnn N times with no report in between and print
how much traced Python memory grew and how many launch records the runtime kept.

    python benchmarks/bench_serving_memory.py [--runs 1000] [--model small_cnn]

Bounded runtime state keeps one run's records per thread: the growth stays near zero
whatever N is (issue 11, finding 4: it was ~26 KB per run of small_cnn).
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--model", default="small_cnn")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    import dsa_tvm
    from dsa_tvm.models.quantize import calibration_data
    from dsa_tvm.models.zoo import get_model

    model = get_model(args.model, quantized=True)
    ex = tvm.compile(from_onnx(model, keep_params_in_input=False), target="dsa")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    (_, x), = calibration_data(model, n=1, seed=1)[0].items()
    for _ in range(20):                       # warm every cache first
        vm["main"](tvm.runtime.tensor(x))
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    for _ in range(args.runs):
        vm["main"](tvm.runtime.tensor(x))
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    kept = len(dsa_tvm.runtime.take_launches())
    print(f"{args.runs} runs of {args.model} in {time.perf_counter() - t0:.1f} s: traced memory "
          f"grew by {grown / 1e6:.3f} MB ({grown / args.runs:,.0f} B/run); launch records kept: "
          f"{kept}")


if __name__ == "__main__":
    main()
