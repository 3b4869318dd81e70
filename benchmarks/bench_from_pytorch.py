"""The torch zoo through ``dsa_tvm.from_pytorch`` (issue 16.5): torch.export, no ONNX.

Each model of ``dsa_tvm.models.torch_zoo`` (seeded random weights, the benchmark sizes of
``bench_zoo.py``) goes through ``dsa_tvm.from_pytorch(model, example, calibration)``
(torch.export -> TVM's ``from_exported_program`` -> the Relax quantizer, 8 seeded
calibration inputs) -> ``tvm.compile(target=dsa)`` -> one run on the simulator. Per model:
MACs on the DSA (``run_report(vm).dsa_mac_share``), launches, the DSA output against
TVM's LLVM build of the same quantized module (max difference in output quantization
steps; "-" when FP32 ops follow the last dequantize) and the cosine against torch's FP32
output, then the ops left on the CPU (Q/DQ and data movement not listed). A model that
fails is reported with its reason; the run goes on.

    python benchmarks/bench_from_pytorch.py [model ...] [--hw default] [--tiny] [--all]
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

#: the default run: a CNN of each kind the Relax quantizer plans differently, and a
#: token model (int64 ids); about two minutes on two cores
FAST = ("resnet18", "mobilenet_v3_small", "bert")
CALIBRATION, CALIBRATION_SEED, EVAL_SEED = 8, 1234, 7


@dataclass
class Row:
    name: str
    mac_share: float = 0.0
    launches: int = 0
    steps: float | None = None      # max |DSA - LLVM build of the same module| in output steps
    cosine: float | None = None     # DSA output against torch FP32
    cpu_ops: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    error: str = ""


def measure(name: str, hw: str = "default", tiny: bool = False) -> Row:
    """Zoo model ``name`` through from_pytorch -> compile -> one simulated run."""
    import torch
    import tvm
    from tvm import relax

    import dsa_tvm
    from dsa_tvm.flow_pytorch import output_step
    from dsa_tvm.models import torch_zoo
    from dsa_tvm.models.torch_zoo.measure import cpu_ops_left
    from dsa_tvm.quant.metrics import cosine

    row, t0 = Row(name), time.perf_counter()
    try:
        model = torch_zoo.build(name, tiny)
        calib = [f["input"] for f in torch_zoo.feeds(name, CALIBRATION, CALIBRATION_SEED, tiny)]
        x = torch_zoo.feeds(name, 1, EVAL_SEED, tiny)[0]["input"]
        qmod = dsa_tvm.from_pytorch(model, (x,), calib, verbose=False, show_progress=False)
        ex = tvm.compile(qmod, target=dsa_tvm.target(hw))
        crep = dsa_tvm.compile_report(ex)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        rep = dsa_tvm.run_report(vm)
        row.mac_share, row.launches = rep.dsa_mac_share, rep.regions
        row.cpu_ops.update(cpu_ops_left(crep))
        want = relax.VirtualMachine(tvm.compile(qmod, target="llvm"), tvm.cpu())["main"](
            tvm.runtime.tensor(x)).numpy()
        step = output_step(qmod)
        if step:
            row.steps = float(np.abs(got.astype(np.float64) - want).max() / step)
        with torch.no_grad():
            row.cosine = cosine(got, model(torch.from_numpy(x)).numpy())
    except Exception as e:  # noqa: BLE001 - a failing model is a result, not a crash
        row.error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"
        traceback.print_exc(limit=-2, file=sys.stderr)
    row.seconds = time.perf_counter() - t0
    return row


def table(rows: list[Row]) -> str:
    lines = ["| model | MACs on DSA | launches | max steps vs LLVM | cosine vs torch FP32 | s |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r.error:
            lines.append(f"| {r.name} | FAILED: {r.error} | | | | {r.seconds:.0f} |")
            continue
        steps = "-" if r.steps is None else f"{r.steps:.2f}"
        lines.append(f"| {r.name} | {r.mac_share:.1%} | {r.launches} | {steps} | "
                     f"{r.cosine:.4f} | {r.seconds:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from dsa_tvm.models.torch_zoo import names

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", help=f"zoo models (default {' '.join(FAST)}; "
                                             f"choose from {', '.join(names())})")
    p.add_argument("--all", action="store_true", help="every zoo model")
    p.add_argument("--hw", default="default", help="hardware preset or .toml")
    p.add_argument("--tiny", action="store_true", help="the test sizes (fast, mostly CPU)")
    args = p.parse_args(argv)
    chosen = names() if args.all else (args.models or list(FAST))
    unknown = [m for m in chosen if m not in names()]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {', '.join(names())}")
    rows = []
    for name in chosen:
        rows.append(measure(name, args.hw, args.tiny))
        r = rows[-1]
        print(f"{name}: {'FAILED ' + r.error if r.error else f'{r.mac_share:.1%} of MACs on the DSA'}"
              f" ({r.seconds:.0f} s)", file=sys.stderr)
    print(table(rows))
    for r in rows:
        if r.cpu_ops:
            print(f"{r.name} CPU ops: " + ", ".join(f"{k} x{n}" for k, n in r.cpu_ops.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
