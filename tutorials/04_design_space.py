"""Tutorial 4: explore the design space of one model, then pick a design and build it.

Run it:  python tutorials/04_design_space.py [--out sweep_out] [--slack 0.25]

The same sweep from the shell (the table, then sweep.csv, sweep.json and pareto.png):

    dsa-tvm sweep small_cnn --set array=8,16,32 --set dram.bandwidth_bytes_per_cycle=4,16,64 \\
        --out sweep_out

What happens:
1. ``dsa_tvm.sweep.sweep`` compiles the bundled int8 CNN for every point of a grid of
   hardware descriptions (MAC array 8x8, 16x16, 32x32 times DRAM 4, 16, 64 bytes per
   cycle: 9 designs, each the ``default`` preset with those fields changed) and simulates
   its DSA regions timing-only (no outputs are needed to compare designs). Each design
   gets a latency, an area estimate (the description's ``[area]`` model), the DSA's energy,
   MAC utilization and DRAM traffic;
2. the designs no other design beats in both latency and area form the Pareto front;
   ``res.write(out)`` writes the table as CSV and JSON and draws the front (pareto.png);
3. a design is picked by a rule you can state: the smallest area on the front whose
   latency is within ``--slack`` of the fastest design's;
4. its hardware description is built the way the sweep built it, saved as a TOML file
   you can pass anywhere a preset is accepted (``dsa-tvm run --hw picked.toml``,
   ``dsa_tvm.target("picked.toml")``), and the model is compiled and run on it.

The sweep runs its points in spawned worker processes, which import the script that
started them: a script calling ``sweep`` keeps its work under ``if __name__ == "__main__":``.
"""

import argparse
from pathlib import Path

import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.models.quantize import calibration_data
from dsa_tvm.models.zoo import get_model
from dsa_tvm.sweep import Point, sweep
from dsa_tvm.sweep.space import config_of

MODEL = "small_cnn"
AXES = ["array=8,16,32", "dram.bandwidth_bytes_per_cycle=4,16,64"]  # "array": block_in and block_out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sweep_out", help="folder for sweep.csv, sweep.json, pareto.png")
    ap.add_argument("--slack", type=float, default=0.25,
                    help="latency allowed above the fastest design's, as a fraction")
    args = ap.parse_args()

    base = dsa_tvm.load_config("default")

    # 1. every design of the grid, on worker processes (one per core by default)
    res = sweep([MODEL], AXES, hw=base, progress=False)
    print(res)

    # 2. the files, and the front
    files = res.write(args.out)
    for what, path in files.items():
        print(f"{what}: {path}")
    front = sorted(res.front(MODEL), key=lambda r: r.area_mm2)
    print(f"\nPareto front of {MODEL} (latency, area): {len(front)} of {len(res.results)} designs")
    for r in front:
        print(f"  {r.point:<44} {r.latency_us:7.1f} us  {r.area_mm2:5.2f} mm2  {r.energy_uj:5.1f} uJ  "
              f"MAC utilization {r.mac_utilization:.0%}")

    # 3. pick: the smallest design on the front within the latency budget
    fastest = min(front, key=lambda r: r.latency_us)
    budget = fastest.latency_us * (1 + args.slack)
    pick = min((r for r in front if r.latency_us <= budget), key=lambda r: r.area_mm2)
    print(f"\npicked: {pick.point}: {pick.latency_us:.1f} us, {pick.area_mm2:.2f} mm2 "
          f"(the fastest, {fastest.point}, takes {fastest.latency_us:.1f} us on "
          f"{fastest.area_mm2:.2f} mm2; the budget is {budget:.1f} us, {args.slack:.0%} above it)")
    frugal = min(front, key=lambda r: r.energy_uj)
    print("why: the smallest design within the budget"
          + (" (and the front's lowest DSA energy)" if frugal is pick else "")
          + ". The area model charges the MAC array and the SRAMs, not the DRAM interface, "
            "so the front takes the widest DRAM; and a bigger array pays only when DRAM keeps up:")
    arrays, widths = (a.values for a in res.axes)
    latency = {(r.values["array"], r.values["dram.bandwidth_bytes_per_cycle"]): r.latency_us
               for r in res.results}
    print("  latency us   " + "".join(f"{'DRAM ' + w + ' B/cycle':>18}" for w in widths))
    for a in arrays:
        print(f"  array {a:>2}x{a:<2} " + "".join(f"{latency[a, w]:>18.1f}" for w in widths))
    print(f"  (each includes {pick.launches} launch(es) at {base.launch_overhead_us:g} us, the "
          f"part's [host] launch_overhead_us, beside the DSA's cycles at {base.mhz:g} MHz)")

    # 4. the picked design's description, as the sweep built it: the default preset with the
    #    point's fields set (dsa_tvm.hw.config.with_overrides(base, ["array.block_in=16", ...]));
    #    config_of also widens isa.instruction_bits when the point's fields need it, and says so
    cfg, note = config_of(base, res.axes, Point(tuple(pick.values.items())))
    if note:
        print(f"note: {note}")
    cfg = cfg.replace(name="small_cnn_pick",
                      description=f"default preset with {pick.point}, picked by tutorials/04")
    toml_path = Path(args.out) / "small_cnn_pick.toml"
    toml_path.write_text(cfg.to_toml())
    assert dsa_tvm.load_config(toml_path) == cfg  # the file reads back as the same description
    print(f"hardware description written to {toml_path}: {cfg.summary()}")
    print(f"use it: dsa-tvm run {MODEL} --hw {toml_path}")

    # ... and the model on it: compile, run one input, the run report's total
    model = get_model(MODEL, quantized=True)
    x = calibration_data(model, n=1, seed=42)[0]["input"]
    ex = tvm.compile(from_onnx(model, keep_params_in_input=False), target=dsa_tvm.target(toml_path))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    vm["main"](tvm.runtime.tensor(x))
    report = dsa_tvm.run_report(vm)
    print(f"{MODEL} on {cfg.name}: {report.total_cycles:,} DSA cycles = {report.latency_us:.1f} us "
          f"over {report.regions} launch(es), {report.dsa_mac_share:.0%} of MACs on the DSA "
          f"(the sweep counted {pick.cycles:,} cycles)")


if __name__ == "__main__":  # the sweep's worker processes import this file: run only here
    main()
