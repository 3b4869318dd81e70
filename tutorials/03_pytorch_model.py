"""Tutorial 3: bring your own PyTorch model: quantize, compile, run, see where the cycles go.

Run it:  python tutorials/03_pytorch_model.py [--hw edge|default|large|my.toml] [--out pytorch_out]

What happens:
1. a small PyTorch CNN (conv-bn-relu blocks, a residual add, pooling, a linear head)
   with seeded random weights stands in for your model;
2. ``dsa_tvm.from_pytorch(model, (example,), calibration_data=[...])`` traces it with
   ``torch.export`` (in eval mode: batch norms use their running statistics), imports it
   into TVM Relax and quantizes it to int8 QDQ on the calibration inputs (batch norms
   folded into the convs, per-channel int8 weights, int32 biases);
3. ``tvm.compile(mod, target="dsa")`` offloads every supported subgraph to the DSA; the
   compile report says what went where and why;
4. the Relax VM runs it (the DSA part on the bundled simulator); the run report gives
   each layer's cycles, utilization and DRAM traffic;
5. the output is checked twice: against torch's FP32 output (cosine: what int8 costs)
   and against TVM's LLVM build of the same quantized module (in output quantization
   steps: what the DSA costs, which should be nothing or one rounding step);
6. the roofline plot (each layer's MACs per cycle against its MACs per DRAM byte, under
   the hardware's roof), the cycle breakdown (compute / DRAM wait / token wait per layer)
   and a per-layer CSV are written, the pictures ``dsa-tvm run --plot --breakdown --csv``
   draws for a bundled model.
"""

import argparse
from pathlib import Path

import numpy as np
import torch
import tvm
from torch import nn
from tvm import relax

import dsa_tvm
from dsa_tvm import plots
from dsa_tvm.models.quantize import image_like  # photo-like test images

ap = argparse.ArgumentParser()
ap.add_argument("--hw", default="default", help="hardware preset or .toml file")
ap.add_argument("--out", default="pytorch_out", help="folder for the plots and the CSV")
args = ap.parse_args()
SHAPE = (1, 3, 32, 32)


# 1. your model: any torch.nn.Module that torch.export can trace
class Block(nn.Module):
    """conv-bn-relu, conv-bn, plus the block's input, relu (a ResNet basic block)."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch)
        self.conv2, self.bn2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class TinyResNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.block = Block(16)
        self.down = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(32, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.down(self.block(self.stem(image)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


torch.manual_seed(0)
model = TinyResNet()
with torch.no_grad():  # batch-norm statistics as a trained model would have them
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.3, 0.3)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.2, 0.2)
model.eval()

rng = np.random.default_rng(0)
calibration = [image_like(SHAPE, rng) for _ in range(8)]  # stand-ins for your own images
x = image_like(SHAPE, np.random.default_rng(42))           # the input we run (not calibrated on)

# 2. trace, import and quantize in one call. A single-input model takes its calibration
#    feeds as a list of arrays; several inputs: dicts by forward() parameter name.
mod = dsa_tvm.from_pytorch(model, (torch.from_numpy(x),), calibration_data=calibration,
                           show_progress=False)
print(f"imported and quantized TinyResNet: main({', '.join(p.name for p in mod['main'].params)})")

# 3. compile for the DSA
ex = tvm.compile(mod, target=dsa_tvm.target(args.hw))
print(dsa_tvm.compile_report(ex))

# 4. run, and the per-layer report of that run
vm = relax.VirtualMachine(ex, tvm.cpu())
out = vm["main"](tvm.runtime.tensor(x)).numpy()
report = dsa_tvm.run_report(vm)
print(report)


# 5. how close is it? torch FP32 (the quantization error) and TVM's LLVM build of the same
#    int8 module (the DSA's own error, in steps of the output's quantization scale)
def output_scale(qmod: tvm.IRModule) -> float:
    """The scale of the dequantize that makes main's output (the last one in main)."""
    scales = [b.value.args[1] for blk in qmod["main"].body.blocks for b in blk.bindings
              if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.dequantize"]
    return float(scales[-1].value.numpy())  # a relax constant


with torch.no_grad():
    fp32 = model(torch.from_numpy(x)).numpy()
llvm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
ref = llvm["main"](tvm.runtime.tensor(x)).numpy()
cos = float((out * fp32).sum() / (np.linalg.norm(out) * np.linalg.norm(fp32)))
steps = float(np.abs(out - ref).max()) / output_scale(mod)
print(f"top-1 DSA: {int(out.argmax())}  torch FP32: {int(fp32.argmax())}  LLVM int8: {int(ref.argmax())}")
print(f"cosine DSA vs torch FP32: {cos:.5f}")
print(f"max |DSA - LLVM int8|: {steps:.0f} output step(s) of {output_scale(mod):.4g}")

# 6. where the cycles went: the roofline of this hardware, the cycle breakdown, a CSV
out_dir = Path(args.out)
out_dir.mkdir(parents=True, exist_ok=True)
cfg = dsa_tvm.load_config(args.hw)
roof = plots.roofline(report, cfg, out_dir / "roofline.png", model="TinyResNet")
bars = plots.breakdown(report, out_dir / "breakdown.png", model="TinyResNet")
csv = report.write_csv(out_dir / "layers.csv")
print(f"\nroofline of '{cfg.name}': {cfg.peak_macs_per_cycle} MACs/cycle peak, "
      f"{cfg.bandwidth_bytes_per_cycle:g} B/cycle DRAM; ridge at "
      f"{cfg.peak_macs_per_cycle / cfg.bandwidth_bytes_per_cycle:g} MACs per byte")
for r in report.rows:
    if r.target == "DSA" and r.macs:  # the points of the roofline plot
        print(f"  {r.name:<26} {r.macs / r.cycles:6.1f} MACs/cycle, {r.bound_by:>7}-bound, "
              f"{r.cycles / r.bound:.2f}x its bound; waited on DRAM {r.dram_wait / r.cycles:.0%}")
print(f"roofline:      {roof}")
print(f"breakdown:     {bars}")
print(f"per-layer CSV: {csv}")
