"""Launches and MACs on the DSA for a YOLO-ish neck and a UNet-ish skip concat (issue 13.5).

Quantized with dsa_tvm's quantizer (one scale over Concat/Resize), compiled for ``default``:
``PYTHONPATH=$PWD python benchmarks/movement_necks.py``. Prints one line per model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.compiler.test_movement_e2e import neck  # noqa: E402


def main() -> None:
    from tvm.relax.frontend.onnx import from_onnx

    import dsa_tvm

    for name, unet in (("yolo_neck", False), ("unet_skip", True)):
        rng = np.random.default_rng(1)
        calib = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
        q = dsa_tvm.quant.quantize_onnx(neck(unet), calib, show_progress=False).model
        dsa_tvm.compile(from_onnx(q, keep_params_in_input=False), "default", verbose=False)
        rep = dsa_tvm.last_compile_report()
        on = [d for d in rep.regions if d.target == "dsa"]
        dsa_macs = sum(d.macs for d in on)
        total = dsa_macs + sum(c.macs for c in rep.partition.cpu_ops) + \
            sum(d.macs for d in rep.regions if d.target != "dsa")
        cpu = sorted({c.op for c in rep.partition.cpu_ops
                      if c.op not in ("relax.quantize", "relax.dequantize")})
        print(f"{name:10s} launches {len(on)}  MACs on DSA {dsa_macs:,}/{total:,} "
              f"({100 * dsa_macs / max(total, 1):.1f}%)  CPU ops: {', '.join(cpu) or '-'}")


if __name__ == "__main__":
    main()
