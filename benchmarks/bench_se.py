"""A squeeze-excite block on the DSA in one region (issue 13, deliverables 2 and 4).

torch (random weights, seeded) -> ONNX -> ``dsa_tvm.quantize_onnx`` -> ``tvm.compile(...,
target="dsa")``; prints per gate: DSA regions and their layers, the DSA output against
the integer reference (``run_region``, must be bit-exact), against TVM's llvm build of
the same QDQ module and against onnxruntime (graph optimizations off) in output steps::

    python benchmarks/bench_se.py [--size 28] [--channels 32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def se_model(path: Path, gate: str, c: int = 32, size: int = 28, batch: int = 1, seed: int = 0):
    """stem conv + ReLU -> SE (global mean, 1x1 reduce + ReLU, 1x1 expand + gate, x * gate)
    -> 1x1 project, + a residual with the stem, 1x1 head (MobileNetV3's shape).
    ``gate``: ``relu`` or ``clip6`` (``clip(x, 0, 6) / 6``, hardsigmoid-like)."""
    import torch

    class SE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, c, 3, padding=1)
            self.fc1, self.fc2 = torch.nn.Conv2d(c, c // 4, 1), torch.nn.Conv2d(c // 4, c, 1)
            self.proj, self.head = torch.nn.Conv2d(c, c, 1), torch.nn.Conv2d(c, 16, 1)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            g = torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))
            g = self.fc2(g)
            g = torch.relu(g) if gate == "relu" else torch.clamp(g, 0, 6) / 6
            return self.head(x + self.proj(x * g))

    torch.manual_seed(seed)
    net = SE().eval()
    torch.onnx.export(net, torch.randn(batch, 3, size, size), str(path), opset_version=17,
                      dynamo=False, input_names=["x"])
    return path


def measure(gate: str, tmp: Path, c: int, size: int, batch: int = 1, target="dsa") -> dict:
    """Compile and run one SE model for ``target`` (a target or a hardware config); the
    numbers the module docstring lists."""
    import tvm
    from tvm import relax

    import dsa_tvm
    from dsa_tvm.ort_session import session
    from dsa_tvm.quant import quantize_onnx
    from dsa_tvm.runtime import take_launches
    from tir_schedules.kinds import run_region

    path = se_model(tmp / f"se_{gate}.onnx", gate, c, size, batch)
    shape = (batch, 3, size, size)
    calib = [np.random.default_rng(i).standard_normal(shape).astype(np.float32)
             for i in range(8)]
    qm = quantize_onnx(str(path), calib, preprocess="raw", show_progress=False)
    mod = qm.to_relax()
    x = np.random.default_rng(99).standard_normal(shape).astype(np.float32)
    ex = tvm.compile(mod, target=target) if isinstance(target, str) else dsa_tvm.compile(
        mod, target)
    rep = dsa_tvm.last_compile_report()
    take_launches()
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    launches = take_launches()
    run = dsa_tvm.run_report(vm)
    regions = {d.name: d.region for d in rep.regions if d.target == "dsa"}
    exact = bool(launches) and all(
        np.array_equal(arr, run_region(regions[la.program.name], la.inputs)[name])
        for la in launches for name, arr in la.outputs.items())
    llvm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(x)).numpy()
    ort = session(qm.model, optimize=False).run(None, {"x": x})[0]
    out_q = [n for n in qm.model.graph.node if n.op_type == "DequantizeLinear"
             and n.output[0] == qm.model.graph.output[0].name]
    step = _step(qm.model, out_q)
    layers = [type(ly).__name__ for r in regions.values() for ly in r.layers]
    return {"gate": gate, "dsa_regions": len(regions), "launches": len(launches),
            "layers": layers, "bit_exact": exact,
            "max_steps_llvm": float(np.abs(got - llvm).max() / step),
            "differ_llvm": float((got != llvm).mean()),
            "max_steps_ort": float(np.abs(got - ort).max() / step),
            "differ_ort": float((got != ort).mean()),
            "cpu_ops": [str(op.op) for op in rep.partition.cpu_ops],
            "violations": [r.name for r in run.violations],
            "cycles": {r.name: (r.op, r.cycles) for r in run.rows if r.target == "DSA"},
            "total_cycles": run.total_cycles}


def _step(model, out_q) -> float:
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    return float(numpy_helper.to_array(inits[out_q[0].input[1]]).reshape(-1)[0])


def main(argv: list[str] | None = None) -> int:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--channels", type=int, default=32)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for gate in ("relu", "clip6"):
            r = measure(gate, Path(tmp), args.channels, args.size)
            print(f"SE gate={r['gate']:6s} DSA regions {r['dsa_regions']} (launches "
                  f"{r['launches']}), layers {', '.join(r['layers'])}")
            print(f"    bit-exact vs integer reference: {r['bit_exact']}; vs llvm: max "
                  f"{r['max_steps_llvm']:.0f} step(s), {100 * r['differ_llvm']:.2f}% of outputs "
                  f"differ; vs onnxruntime (opt off): max {r['max_steps_ort']:.0f} step(s), "
                  f"{100 * r['differ_ort']:.2f}% differ")
            muls = [f"{op} {cyc:,}" for op, cyc in r["cycles"].values() if op in ("Mul", "Rescale", "Add")]
            print(f"    {r['total_cycles']:,} cycles in the region; {', '.join(muls)}; "
                  f"impossible layers: {r['violations'] or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
