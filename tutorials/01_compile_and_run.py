"""Tutorial 1: compile a quantized ONNX model for the DSA, run it, read the report.

Run it:  python tutorials/01_compile_and_run.py [--hw edge|default|large|my.toml]

What happens:
1. a bundled int8 model (a small CNN quantized by onnxruntime to QDQ form) is
   imported into TVM Relax;
2. ``tvm.compile(mod, target=...)`` partitions it: every supported subgraph
   becomes a DSA program (TIR schedule -> instructions), the rest is built by LLVM;
3. the Relax VM runs it; the DSA parts execute on the bundled simulator, which
   gives the values and the cycle-level timing from the same instructions;
4. the run report shows each layer: where it ran, cycles, utilization, DRAM traffic.
"""

import argparse

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm  # registers the "dsa" target, the pipeline hook and the runtime
from dsa_tvm.models.quantize import calibration_data, run_onnxruntime
from dsa_tvm.models.zoo import get_model

ap = argparse.ArgumentParser()
ap.add_argument("--hw", default="default", help="hardware preset or .toml file")
ap.add_argument("--trace", default="tutorial1.trace.json")
args = ap.parse_args()

# 1. a quantized model (QDQ int8) and an input
model = get_model("small_cnn", quantized=True)
x = calibration_data(model, n=1, seed=42)[0]["input"]
mod = from_onnx(model, keep_params_in_input=False)

# 2. compile: "dsa" is the default preset; dsa_tvm.target(hw) picks another one
ex = tvm.compile(mod, target=dsa_tvm.target(args.hw))
print(dsa_tvm.compile_report(ex))      # the report belongs to the executable

# 3. run
vm = relax.VirtualMachine(ex, tvm.cpu())
logits = vm["main"](tvm.runtime.tensor(x)).numpy()

# 4. the per-layer report, and the whole model's timeline for ui.perfetto.dev
report = dsa_tvm.run_report(vm)        # this VM's last run in this thread
print(report)
report.write_trace(args.trace)
print(f"trace written to {args.trace}")

# the same QDQ graph in onnxruntime gives the same answer (to one quantization step)
ref = run_onnxruntime(model, {"input": x}, optimize=False)[0]
print("top-1 DSA:", int(logits.argmax()), " onnxruntime:", int(ref.argmax()),
      " max |diff|:", float(np.abs(logits - ref).max()))
