"""Tutorial 2: autotune a model's DSA schedules with MetaSchedule, then compile with them.

Run it:  python tutorials/02_tune.py [--hw edge|default|large|my.toml] [--trials 32]
                                     [--work-dir tune_small_cnn]

What happens:
1. the model's DSA tasks are found the way the compiler finds them: each distinct
   layer shape it offloads (zero points aside) is one task;
2. ``dsa_tvm.tune`` searches each task's schedule knobs (tile sizes, resident operand,
   double buffering) with MetaSchedule's evolutionary search and XGBoost cost model;
   every candidate is lowered to a DSA program and timed on the simulator. The default
   schedule is measured first and seeds the search, so no layer gets slower. The
   records go to a MetaSchedule JSON database in the work directory;
3. the model is compiled twice, without and with the database in scope
   (``with dsa_tvm.tuned(work_dir):``), and both builds run: the tuned one takes no
   more cycles (a region whose tuned layers would run slower together, their transfers
   overlapping differently, keeps the default schedules; the compile report says so)
   and gives the same int8 outputs, bit for bit.
"""

import argparse

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.models.quantize import calibration_data
from dsa_tvm.models.zoo import get_model

ap = argparse.ArgumentParser()
ap.add_argument("--hw", default="default", help="hardware preset or .toml file")
ap.add_argument("--trials", type=int, default=32, help="measured candidates per task")
ap.add_argument("--work-dir", default="tune_small_cnn")
args = ap.parse_args()

model = get_model("small_cnn", quantized=True)
x = calibration_data(model, n=1, seed=42)[0]["input"]
mod = from_onnx(model, keep_params_in_input=False)

# 1 + 2. tune every DSA task (progress on stderr; the final table below)
report = dsa_tvm.tune(mod, work_dir=args.work_dir, trials=args.trials, hw=args.hw)
print(report)


def run(compiled) -> tuple[np.ndarray, int]:
    """The model's output and the DSA cycles of one run."""
    vm = relax.VirtualMachine(compiled, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    return out, dsa_tvm.last_run_report().total_cycles


# 3. compile and run with the default schedules, then with the tuned ones
target = dsa_tvm.target(args.hw)
default_out, default_cycles = run(tvm.compile(mod, target=target))
with dsa_tvm.tuned(args.work_dir):
    tuned_out, tuned_cycles = run(tvm.compile(mod, target=target))
print(dsa_tvm.last_compile_report())  # per region: tuned or default schedules, and cycles

print(f"DSA cycles: default schedules {default_cycles:,}, tuned {tuned_cycles:,} "
      f"(x{default_cycles / tuned_cycles:.3f})")
print("outputs identical:", bool(np.array_equal(default_out, tuned_out)))
assert np.array_equal(default_out, tuned_out), "tuned schedules changed the outputs"
