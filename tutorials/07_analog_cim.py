"""Tutorial 7: an analog in-memory-compute part: what its ADCs, device noise and drift do
to a model, what the mitigations buy back, and where the time and energy go.

Run it:  python tutorials/07_analog_cim.py [--out cim_out] [--model efficientnet-lite0]

The study from the shell (the table, then cim_sweep.json and cim_sweep.png):

    dsa-tvm cim-sweep efficientnet-lite0 --adc 4,6,8 --noise 0,0.02,0.05 --drift 1s,1d,1y \\
        --mitigate adc,drift,bias

What happens:
1. ``cim-pcm`` is the default part's digital periphery plus 1024 phase-change-memory
   crossbars of 256 x 256 (HERMES class) with aihwkit's PCM noise statistics. Every GEMM
   whose weights are constants runs on crossbars the weights were programmed into once;
   GEMMs of two activations (attention) stay on the digital array.
2. Trust first: with noiseless devices and an ADC that resolves every column sum, the
   compiled model on crossbars gives the digital part's outputs bit for bit, and reads no
   weight byte at run time.
3. The same seed gives the same chip and the same outputs; another seed, another chip.
4. A study of the bundled CNN (or ``--model efficientnet-lite0``, real ImageNet weights on
   photos): ADC bits, programming noise and time since programming, plain and with the
   mitigations (per-column ADC ranges and device-bias correction from calibration data,
   global drift compensation), against the FP32 model: the table and ``cim_sweep.png``.
5. Where one inference's cycles, DRAM bytes and energy go on each part.
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.cim_study.cnn import study_cnn
from dsa_tvm.models.zoo import get_model
from dsa_tvm.runtime import take_launches

EXACT = dict(adc_bits=32, adc_range=1.0, prog_noise_scale=0.0, read_noise_scale=0.0,
             drift_scale=0.0)


def run(cfg, mod, x):
    """The model compiled for ``cfg`` (every region on the part) run on ``x``: its output
    and the run's counters, summed over its launches."""
    with dsa_tvm.options(offload="all"):
        vm = relax.VirtualMachine(tvm.compile(mod, target=dsa_tvm.target(cfg)), tvm.cpu())
    take_launches()
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    counters: dict[str, float] = {}
    for la in take_launches():
        for k, v in la.result.counters.items():
            counters[k] = counters.get(k, 0) + v
    return out, counters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="cim_out", help="folder for cim_sweep.json and .png")
    ap.add_argument("--model", default="small_cnn",
                    help="small_cnn (bundled, seeded weights) or efficientnet-lite0")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # 1. the part
    cim = dsa_tvm.load_config("cim-pcm")
    print(f"{cim.name}: {cim.description}")
    print(f"  {cim.crossbars} crossbars of {cim.crossbar_rows}x{cim.crossbar_cols}, "
          f"{cim.adc_bits}-bit ADCs (range {cim.adc_range:g} of the worst case), "
          f"{cim.noise_model} noise, read {cim.t_inference_s:g} s after programming")

    # 2. trust first: noiseless and a fine ADC are the digital part, bit for bit
    qdq = get_model("small_cnn", quantized=True)
    mod = from_onnx(qdq, keep_params_in_input=False)
    shape = [d.dim_value for d in qdq.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    digital, dig = run(dsa_tvm.load_config("default"), mod, x)
    exact, ex = run(cim.replace(**EXACT), mod, x)
    print(f"\nnoiseless crossbars, 32-bit ADC: outputs equal to the digital part's: "
          f"{np.array_equal(exact, digital)}; weight bytes read: digital "
          f"{int(dig['dram_read_bytes.wgt']):,}, CIM {int(ex['dram_read_bytes.wgt']):,}")

    # 3. seeds are chips
    a, _ = run(cim, mod, x)
    b, _ = run(cim, mod, x)
    c, _ = run(cim.replace(noise_seed=1), mod, x)
    print(f"same seed, same outputs: {np.array_equal(a, b)}; another seed, other outputs: "
          f"{not np.array_equal(a, c)}")

    # 4. the study
    with tempfile.TemporaryDirectory() as tmp:
        if args.model == "small_cnn":
            fp32 = get_model("small_cnn", quantized=False)
            path = Path(tmp) / "small_cnn.onnx"
            path.write_bytes(fp32.SerializeToString())
            rng = np.random.default_rng(1)
            data = [{fp32.graph.input[0].name: rng.standard_normal(shape).astype(np.float32)}
                    for _ in range(12)]
            study = study_cnn(path, data, adc=[4, 6, 8], noise=[0.0, 0.05, 0.1],
                              drift=["1s", "1d", "1y"], mitigate=["adc", "drift", "bias"],
                              calibration=4, limit=8, progress=None)
        else:
            study = study_cnn(args.model, adc=[4, 6, 8], noise=[0.0, 0.02, 0.05],
                              drift=["1s", "1d", "1y"], mitigate=["adc", "drift", "bias"],
                              calibration=8, limit=16)
    print()
    print(study)
    print(f"json: {study.write_json(out / 'cim_sweep.json')}")
    print(f"plot: {study.plot(out / 'cim_sweep.png')}")

    # 5. where one inference goes
    print("\none inference of the bundled CNN (noise as in cim-pcm):")
    _, noisy = run(cim, mod, x)
    for name, c in (("digital (default)", dig), ("CIM (cim-pcm)", noisy)):
        print(f"  {name:<18} {int(c['cycles']):>9,} cycles, DRAM read "
              f"{int(c['dram_read_bytes']):>7,} B (weights {int(c['dram_read_bytes.wgt']):>6,}), "
              f"{c['energy_uj']:.2f} uJ (crossbars {c.get('cim.energy_pj', 0) / 1e6:.2f})")


if __name__ == "__main__":
    main()
