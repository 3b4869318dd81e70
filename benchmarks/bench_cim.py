"""Analog in-memory compute (issue 15): what a CIM part does to real models, measured side
by side in one run. Never asserts; every number is measured here.

Parts (``--parts``, default all):

* ``exact``: noise off (noiseless devices, an ADC that resolves every sum) against the
  digital DSA, bit for bit, on the bundled CNN, the encoder block and EfficientNet-Lite0;
  the same seed twice (same outputs) and another seed (other outputs).
* ``cnn``: EfficientNet-Lite0 (real ImageNet weights) over photo crops: the fewest ADC bits
  (noiseless devices; plain: the best of four global ADC ranges for those bits, picked on
  the calibration crops) and the most programming noise
  (gaussian, fraction of g_max) that keep top-1 agreement with the FP32 model within 1
  point of the digital int8 part's, and the longest time since programming (aihwkit's PCM
  drift), the last two with an ADC that resolves every sum (the devices alone), each plain
  and with the mitigations (per-column ADC ranges and device-bias correction from the
  calibration crops, global drift compensation, and the ``--digital`` N layers that are
  most sensitive to programming noise kept on the digital array); goal: the mitigations
  buy >= 2 ADC bits or >= 2x noise.
* ``llm``: the same limits for SmolLM2, perplexity within +5% of the digital W8A8 part's
  over ``--tokens`` tokens of pydoc_data.topics.
* ``decode``: SmolLM2 decode on the CIM part (noiseless, so the tokens match) against the
  digital part at the same context: tokens/s at the clock, DRAM bytes per token (weights /
  KV cache / activations) and energy per token by where it goes.

    python benchmarks/bench_cim.py [--parts exact,cnn,llm,decode] [--images 97]
        [--tokens 128] [--crossbars 4096]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

#: the values each search walks (easiest first; --adc, --noise, --drift change them)
SEARCH = {"adc": (16, 12, 10, 8, 6),
          "noise": (0.00125, 0.0025, 0.005, 0.01, 0.02),
          "drift": ("1d", "1y")}
#: global ADC full scales a designer picks from (fractions of the worst-case column sum)
RANGES = (1.0, 0.25, 0.0625, 0.015625)
MITIGATE = ("adc", "drift", "bias")


def part_of(base, **changes):
    return base.replace(**changes)


def exact(args) -> None:
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    import dsa_tvm
    from dsa_tvm.models.zoo import get_model
    from dsa_tvm.runtime import release_programs, take_launches

    quiet = dict(adc_bits=32, adc_range=1.0, prog_noise_scale=0.0, read_noise_scale=0.0,
                 drift_scale=0.0)
    cim = dsa_tvm.load_config("cim-pcm")

    def run(cfg, mod, x):
        with dsa_tvm.options(offload="all"):
            vm = relax.VirtualMachine(tvm.compile(mod, target=dsa_tvm.target(cfg)), tvm.cpu())
        take_launches()
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
        n = sum(len(la.result.cim.analog) for la in take_launches() if la.result.cim)
        release_programs()
        return out, n

    print("== noise off against the digital part; seeds")
    models = [("small_cnn", get_model("small_cnn", quantized=True)),
              ("transformer_encoder", get_model("transformer_encoder", quantized=True))]
    if "cnn" in args.parts or args.lite0_exact:
        from dsa_tvm.cim_study.cnn import LITE0, ImageBench

        bench = ImageBench(LITE0, calibration=8, limit=1)
        models.append((LITE0, bench.mod))
    for name, model in models:
        mod = model if not hasattr(model, "graph") else from_onnx(model,
                                                                  keep_params_in_input=False)
        if hasattr(model, "graph"):
            shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        else:
            x = next(iter(bench.evals[0].values()))
        dig, _ = run(dsa_tvm.load_config("default"), mod, x)
        got, n = run(cim.replace(**quiet), mod, x)
        a, _ = run(cim, mod, x)
        b, _ = run(cim, mod, x)
        c, _ = run(cim.replace(noise_seed=1), mod, x)
        print(f"  {name:<22} {n:>5} GEMMs on crossbars; noise off == digital: "
              f"{np.array_equal(got, dig)}; same seed same outputs: {np.array_equal(a, b)}; "
              f"other seed other outputs: {not np.array_equal(a, c)}", flush=True)


#: an ADC that resolves every sum: the noise and drift searches see the devices alone
FINE_ADC = dict(adc_bits=24, adc_range=1.0)
#: noiseless devices at programming time: the ADC search sees the converters alone
QUIET = dict(noise_model="gaussian", prog_noise_scale=0.0, read_noise_scale=0.0,
             t_inference_s=0.0)


def _fmt(m) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in m.metrics.items())


def sweep_axes(measure_at, pick_range) -> dict:
    """Every value of each search axis, plain and mitigated: ADC bits (noiseless devices;
    plain: the best global range for those bits, ``pick_range(bits)``, chosen on the
    calibration data; mitigated: per-column ranges from it), programming noise and time
    since programming (an ADC that resolves every sum). (axis, mitigated) -> [(value, m)]."""
    from dsa_tvm.cim_study.grid import parse_duration

    runs = {}
    for mitigated in (False, True):
        print(f"  {'mitigated' if mitigated else 'plain'}:", flush=True)
        for axis in ("adc", "noise", "drift"):
            rows = []
            for v in SEARCH[axis]:
                if axis == "adc":
                    m = measure_at(adc_bits=v, adc_range=1.0 if mitigated else pick_range(v),
                                   noise=0.0, t=0.0, mitigated=mitigated)
                elif axis == "noise":
                    m = measure_at(**FINE_ADC, noise=v, t=0.0, mitigated=mitigated)
                else:
                    m = measure_at(**FINE_ADC, noise=0.0, t=parse_duration(v), pcm_drift=True,
                                   mitigated=mitigated)
                rows.append((v, m))
                print(f"    {axis} {v}: {_fmt(m)}", flush=True)
            runs[(axis, mitigated)] = rows
    return runs


def limit(rows: list, passes) -> object:
    """The last value (easiest first) before the first that fails the criterion."""
    best = None
    for v, m in rows:
        if not passes(m):
            break
        best = v
    return best


def print_limits(name: str, runs: dict, criteria: dict) -> None:
    """Per criterion: fewest ADC bits, most noise, longest time, plain and mitigated."""
    for crit, passes in criteria.items():
        lim = {k: limit(rows, passes) for k, rows in runs.items()}
        adc = (lim[("adc", False)], lim[("adc", True)])
        noise = (lim[("noise", False)], lim[("noise", True)])
        drift = (lim[("drift", False)], lim[("drift", True)])
        bits = (adc[0] - adc[1]) if adc[0] is not None and adc[1] is not None else None
        times = (noise[1] / noise[0]) if noise[0] and noise[1] else None
        met = (bits is not None and bits >= 2) or (times is not None and times >= 2) or (
            noise[0] is None and noise[1] is not None) or (adc[0] is None and adc[1] is not None)
        print(f"\n{name}, {crit}:")
        print(f"  {'':<34}{'plain':>10}{'mitigated':>12}{'bought':>10}")
        print(f"  {'fewest ADC bits (noiseless)':<34}{adc[0]!s:>10}{adc[1]!s:>12}"
              f"{'-' if bits is None else f'{bits:+d} bits':>10}")
        print(f"  {'most programming noise':<34}{noise[0]!s:>10}{noise[1]!s:>12}"
              f"{'-' if times is None else f'{times:.0f}x':>10}")
        print(f"  {'longest time since programming':<34}{drift[0]!s:>10}{drift[1]!s:>12}")
        print(f"  goal (mitigations buy >= 2 ADC bits or >= 2x noise): "
              f"{'met' if met else 'missed'}  (None: no value of the search passes)")


def keep_digital(bench, base, n: int) -> list[str]:
    """The ``n`` analog layers whose staying digital alone buys the most output cosine at
    the noisiest programming noise of the search (``cim_study.sensitivity``, 4 crops), and
    what they take back from the crossbars."""
    from dsa_tvm.cim_study.sensitivity import analog_share, sensitivity

    worst = base.replace(**FINE_ADC, noise_model="gaussian", prog_noise_scale=max(SEARCH["noise"]),
                         read_noise_scale=0.0, t_inference_s=0.0)
    ranked = sensitivity(bench, worst, limit=4)
    keep = [r.layer for r in ranked[:n]]
    bench.measure(worst, limit=1)                     # every layer analog: the shares' base
    macs, weights = analog_share(bench.last_launches, keep)
    print(f"  kept digital (most sensitive of {len(ranked)} analog layers at noise "
          f"{max(SEARCH['noise'])}): " + ", ".join(f"{r.layer} +{r.gain:.3f}" for r in ranked[:n])
          + f"; {macs:.1%} of the analog MACs, {weights:.1%} of the crossbar weights",
          flush=True)
    return keep


def cnn(args) -> None:
    from dsa_tvm.cim_study.cnn import LITE0, ImageBench
    from dsa_tvm.cim_study.grid import MITIGATIONS

    t0 = time.perf_counter()
    bench = ImageBench(LITE0, calibration=8, limit=args.images, say=print)
    base = part_of(__import__("dsa_tvm").load_config("cim-pcm"), crossbars=args.crossbars)
    digital = bench.measure(__import__("dsa_tvm").load_config("default"))
    floor = digital.metrics["top1_agreement"] - 0.01
    print(f"== EfficientNet-Lite0 over {len(bench.evals)} crops: digital int8 {_fmt(digital)}; "
          f"criterion top-1 agreement >= {floor:.4f}", flush=True)

    mitigations = {MITIGATIONS[m]: True for m in MITIGATE}
    if args.digital:
        mitigations["digital_layers"] = ",".join(keep_digital(bench, base, args.digital))

    def measure_at(adc_bits, adc_range, noise, t, mitigated, pcm_drift=False):
        cfg = base.replace(adc_bits=adc_bits, adc_range=adc_range,
                           noise_model="pcm" if pcm_drift else "gaussian",
                           prog_noise_scale=noise, read_noise_scale=0.0, t_inference_s=t,
                           **(mitigations if mitigated else {}))
        return bench.measure(cfg, calibrate=mitigated)

    def pick_range(bits):
        score = {r: bench.measure(base.replace(adc_bits=bits, adc_range=r, **QUIET),
                                  on_calibration=True).metrics for r in RANGES}
        best = max(RANGES, key=lambda r: (score[r]["top1_agreement"], score[r]["cosine"]))
        print(f"      {bits}-bit ADC: global range {best:g} (calibration crops: "
              + ", ".join(f"{r:g} {score[r]['cosine']:.3f}" for r in RANGES) + ")", flush=True)
        return best

    runs = sweep_axes(measure_at, pick_range)
    print_limits("EfficientNet-Lite0", runs, {
        f"top-1 agreement within 1 point of the digital part's "
        f"{digital.metrics['top1_agreement']:.4f}":
            lambda m: m.metrics["top1_agreement"] >= floor - 1e-9,
        f"output cosine within 0.01 of the digital part's {digital.metrics['cosine']:.4f}":
            lambda m: m.metrics["cosine"] >= digital.metrics["cosine"] - 0.01})
    print(f"  [{time.perf_counter() - t0:.0f} s]", flush=True)


def llm(args) -> None:
    from dsa_tvm.cim_study.grid import MITIGATIONS
    from dsa_tvm.cim_study.llm import LlmBench

    t0 = time.perf_counter()
    bench = LlmBench("smollm2", tokens=args.tokens, say=print)
    base = part_of(__import__("dsa_tvm").load_config("cim-pcm"), crossbars=args.crossbars)
    digital = bench.measure(decode=False)
    ceiling = 1.05 * digital.metrics["perplexity"]
    print(f"== SmolLM2 over {len(bench.ids)} tokens: FP32 perplexity "
          f"{bench.fp32_perplexity:.3f}, digital W8A8 {digital.metrics['perplexity']:.3f}; "
          f"criterion perplexity <= {ceiling:.3f}", flush=True)

    def measure_at(adc_bits, adc_range, noise, t, mitigated, pcm_drift=False):
        cfg = base.replace(adc_bits=adc_bits, adc_range=adc_range,
                           noise_model="pcm" if pcm_drift else "gaussian",
                           prog_noise_scale=noise, read_noise_scale=0.0, t_inference_s=t,
                           **({MITIGATIONS[m]: True for m in MITIGATE} if mitigated else {}))
        return bench.measure(cfg, calibrate=mitigated, decode=False)

    def pick_range(bits):   # the preset's (the best on the calibration text at 16 bits)
        return base.adc_range

    runs = sweep_axes(measure_at, pick_range)
    print_limits("SmolLM2", runs, {
        f"perplexity within +5% of the digital part's {digital.metrics['perplexity']:.3f}":
            lambda m: m.metrics["perplexity"] <= ceiling})
    print(f"  [{time.perf_counter() - t0:.0f} s]", flush=True)


def decode(args) -> None:
    import dsa_tvm
    from dsa_tvm.llm import load
    from dsa_tvm.sim.counters import energy_split

    quiet = dict(adc_bits=32, adc_range=1.0, prog_noise_scale=0.0, read_noise_scale=0.0,
                 drift_scale=0.0, crossbars=args.crossbars)
    dig = load("smollm2", hw="default", quant="w8a8", prefill_buckets=(16,),
               context_buckets=(args.context,), wide_down=False,
               wide_mlp=False)                             # as the analog views run
    cim = dig.on_hardware(dsa_tvm.load_config("cim-pcm").replace(**quiet))
    print(f"\n== SmolLM2 decode at context {args.context}: digital 'default' vs CIM 'cim-pcm' "
          f"({args.crossbars} crossbars, noiseless: the same tokens)", flush=True)
    rows = []
    for name, model in (("digital", dig), ("CIM", cim)):
        gen = model.generate("The capital of France is", 6)
        last = gen.decode[-1]
        split: dict[str, float] = {}
        shared = 0
        for la in model.last_launches:
            for k, v in energy_split(la.result.counters, la.result.config).items():
                split[k] = split.get(k, 0.0) + v
            shared += la.result.cim is not None and not la.result.cim.fits
        rows.append((name, gen, last, split, shared, model))
    print(f"  {'':<10}{'tokens/s':>10}{'cycles/token':>15}{'DRAM MB/token':>15}{'weights':>9}"
          f"{'KV':>7}{'act.':>7}{'uJ/token':>10}  energy split (uJ)")
    for name, _gen, last, split, shared, model in rows:
        print(f"  {name:<10}{model.cfg.mhz * 1e6 / last.cycles:>10.1f}{last.cycles:>15,}"
              f"{last.dram_read / 1e6:>15.2f}{last.read_weights / 1e6:>9.2f}"
              f"{last.read_kv / 1e6:>7.2f}{last.read_activations / 1e6:>7.2f}"
              f"{sum(split.values()):>10.1f}  "
              + ", ".join(f"{k} {v:.0f}" for k, v in split.items() if v)
              + (f"  ({shared} launches time-shared)" if shared else ""))
    same = rows[0][1].ids == rows[1][1].ids
    print(f"  tokens identical: {same} ({rows[1][1].text!r})")
    print(f"  CIM/digital: {rows[0][2].cycles / rows[1][2].cycles:.2f}x tokens/s, "
          f"{sum(rows[1][3].values()) / sum(rows[0][3].values()):.2f}x energy per token")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="exact,cnn,llm,decode")
    ap.add_argument("--images", type=int, default=97, help="EfficientNet-Lite0 evaluation crops")
    ap.add_argument("--tokens", type=int, default=128, help="SmolLM2 perplexity tokens")
    ap.add_argument("--context", type=int, default=128, help="decode context bucket")
    ap.add_argument("--crossbars", type=int, default=4096,
                    help="crossbars of the CIM part (SmolLM2 needs ~2,000)")
    ap.add_argument("--adc", default=",".join(map(str, SEARCH["adc"])),
                    help="ADC bits to search, most first")
    ap.add_argument("--noise", default=",".join(map(str, SEARCH["noise"])),
                    help="programming noise levels to search, least first")
    ap.add_argument("--drift", default=",".join(SEARCH["drift"]),
                    help="times to search, shortest first")
    ap.add_argument("--digital", type=int, default=8,
                    help="mitigation: the N most sensitive EfficientNet-Lite0 layers kept on "
                         "the digital array (0: none)")
    ap.add_argument("--lite0-exact", action="store_true",
                    help="check EfficientNet-Lite0 in the exact part even without cnn")
    args = ap.parse_args()
    if args.digital < 0:
        ap.error(f"--digital {args.digital}: pass 0 (no layer kept digital) or more")
    args.parts = set(args.parts.split(","))
    SEARCH.update(adc=tuple(int(v) for v in args.adc.split(",")),
                  noise=tuple(float(v) for v in args.noise.split(",")),
                  drift=tuple(args.drift.split(",")))
    t0 = time.perf_counter()
    for part in ("exact", "cnn", "llm", "decode"):
        if part in args.parts:
            globals()[part](args)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
