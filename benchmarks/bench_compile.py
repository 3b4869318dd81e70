"""Compiler benchmark: int8 ResNet-shaped networks on the default DSA preset.

Prints, for each network (measured side by side in one run; never asserts):

* per-layer DSA cycles against the roofline bound
  max(MACs / peak MACs per cycle, compulsory DRAM bytes / bandwidth) (the run report's
  ``LayerRow.bound``: bytes as the DSA reads them, a folded stem's host-packed im2col
  matrix included, from the program's layer table), the
  network total against the sum of the bounds (goal <= 1.25x), and the share of
  MACs on the DSA (goal >= 95%);
* wall time of the simulated run against onnxruntime running the FP32 model;
* DSA compile time against ``tvm.compile(..., target="llvm")`` of the same
  QDQ model (goal <= 3x).

    python benchmarks/bench_compile.py [resnet18 resnet50 ...] [--hw default] [--size 224]
"""

from __future__ import annotations

import argparse
import time


def bench(name: str, hw: str, size: int, show_layers: bool) -> dict:
    import onnxruntime as ort
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    import dsa_tvm
    from dsa_tvm.models.quantize import calibration_data
    from dsa_tvm.models.zoo import get_model
    from dsa_tvm.runtime import take_launches

    cfg = dsa_tvm.load_config(hw)
    fp32 = get_model(name, quantized=False, input_size=size)
    qdq = get_model(name, quantized=True, input_size=size)
    feed = calibration_data(fp32, n=1, seed=7)[0]
    (in_name, x), = feed.items()

    t0 = time.perf_counter()
    mod = from_onnx(qdq, keep_params_in_input=False)
    ex = tvm.compile(mod, target=dsa_tvm.target(cfg))
    t_dsa = time.perf_counter() - t0
    t0 = time.perf_counter()
    tvm.compile(from_onnx(qdq, keep_params_in_input=False), target="llvm")
    t_llvm = time.perf_counter() - t0

    vm = relax.VirtualMachine(ex, tvm.cpu())
    take_launches()
    best_sim = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        vm["main"](tvm.runtime.tensor(x))
        best_sim = min(best_sim, time.perf_counter() - t0)
        rep = dsa_tvm.last_run_report()
    sess = ort.InferenceSession(fp32.SerializeToString())
    sess.run(None, {in_name: x})
    best_ort = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        sess.run(None, {in_name: x})
        best_ort = min(best_ort, time.perf_counter() - t0)

    lines = []
    for r in rep.rows:  # bounds from the program's layer table: the bytes the DSA reads
        if r.target != "DSA":
            continue
        bound = r.bound
        lines.append(f"  {r.name[:30]:<30} {r.op:<13} {r.macs:>12,} {r.cycles:>11,} "
                     f"{bound:>11,.0f} {r.cycles / bound if bound else 0:>6.2f}")
    if show_layers:
        print(f"  {'layer':<30} {'op':<13} {'MACs':>12} {'cycles':>11} {'bound':>11} {'x':>6}")
        print("\n".join(lines))
    res = {"net": name, "layers": len(lines), "cycles": rep.total_cycles, "bound": rep.bound_cycles,
           "ratio": rep.total_cycles / rep.bound_cycles if rep.bound_cycles else float("nan"),
           "dsa_macs": rep.dsa_mac_share, "sim_s": best_sim, "ort_s": best_ort,
           "compile_s": t_dsa, "llvm_s": t_llvm}
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("nets", nargs="*", default=["resnet18", "resnet50"])
    ap.add_argument("--hw", default="default")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--layers", action="store_true", help="print every layer")
    a = ap.parse_args()
    rows = [bench(n, a.hw, a.size, a.layers) for n in a.nets]
    print(f"\n{'network':<10} {'layers':>6} {'DSA cycles':>12} {'sum bounds':>12} {'x bound':>8} "
          f"{'MACs on DSA':>11} {'sim s':>7} {'ORT fp32 s':>10} {'sim/ORT':>8} "
          f"{'compile s':>9} {'llvm s':>7} {'ratio':>6}")
    for r in rows:
        print(f"{r['net']:<10} {r['layers']:>6} {r['cycles']:>12,} {r['bound']:>12,.0f} "
              f"{r['ratio']:>8.3f} {r['dsa_macs']:>11.1%} {r['sim_s']:>7.2f} {r['ort_s']:>10.3f} "
              f"{r['sim_s'] / r['ort_s']:>8.1f} {r['compile_s']:>9.1f} {r['llvm_s']:>7.1f} "
              f"{r['compile_s'] / r['llvm_s']:>6.2f}")
    print("goals: x bound <= 1.25, MACs on DSA >= 95%, compile ratio <= 3 (simulated run vs "
          "ORT FP32 is reported, not a goal)")


if __name__ == "__main__":
    main()
