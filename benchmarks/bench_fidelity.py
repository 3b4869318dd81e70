"""Fidelity benchmark: the simulator's per-layer cycles under each array dataflow against
an independent closed-form systolic model (issue 19, deliverable 5).

For each network (ResNet-18, MobileNetV2) every distinct conv / dense layer is compiled
as a region of its own ("alone", as SCALE-Sim runs a layer) under each dataflow of the
hardware description and simulated (timing only). Printed per layer:

* ``sim GEMM``: the compute-engine cycles of the layer's GEMM instructions (what the
  closed form and SCALE-Sim's "compute cycles" count), compiled with the mapping the closed
  form assumes (``fewest_folds``: each weight tile streams every pixel the accumulator
  holds), so the ratio tests the timing model, not the tiling choice;
* ``default GEMM`` / ``total alone``: the same with the compiler's default tiling, which may
  split pixels finer (more folds, but the first input tile loads sooner);
* ``closed``: the closed-form systolic model below, written from SCALE-Sim's per-fold
  counts and independent of the simulator (no dsa_tvm timing code is used), on the GEMM the
  array is handed: each tap's channels rounded up to whole blocks of ``block_in`` (the DSA's
  layout; only output-stationary, which streams K element by element, sees the padding, and
  ``why`` prints what it costs against SCALE-Sim's unpadded GEMM);
* ``ratio`` = sim GEMM / closed, and ``total``: the layer's whole simulated run (DMA,
  requantize, tokens), and whether the layer is compute-bound (closed >= DRAM bytes /
  bandwidth). Where they differ, ``why`` says which mapping detail the closed form lacks.

``--network`` also compiles the whole network under each dataflow and prints each
layer's attributed cycles in the network (the run report's ``cycles`` column) beside
its cycles alone. A SCALE-Sim column is added when ``--scalesim PYTHON`` names a venv's
python with ``scalesim`` installed (never installed in the shared environment).

    python benchmarks/bench_fidelity.py [resnet18 mobilenet_v2] [--hw default] [--size 224]
        [--network] [--stage shared|pipelined] [--double-buffer]
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess

DATAFLOWS = ("matrix-vector", "weight-stationary", "output-stationary")


def closed_form(flow: str, m: int, k: int, n: int, r: int, c: int) -> int:
    """Compute cycles of an (m x k) @ (k x n) layer alone on an r x c systolic array.

    weight-stationary: the k x n weights fold into ceil(k/r) * ceil(n/c) tiles; each is
    preloaded (r cycles), the m rows stream through it (m cycles) and the last partial
    sums leave through the array's skew (r + c - 2): m + 2r + c - 2 per fold.
    output-stationary: the m x n outputs fold into ceil(m/r) * ceil(n/c) tiles; each
    streams its k-long reduction and drains: k + r + c - 2 per fold.
    matrix-vector: one r-element input row times one r x c weight tile per cycle,
    m * ceil(k/r) * ceil(n/c) cycles, plus one fill and drain (r + c)."""
    if flow == "weight-stationary":
        return math.ceil(k / r) * math.ceil(n / c) * (m + 2 * r + c - 2)
    if flow == "output-stationary":
        return math.ceil(m / r) * math.ceil(n / c) * (k + r + c - 2)
    return m * math.ceil(k / r) * math.ceil(n / c) + r + c


def layer_gemm(ly, r: int) -> tuple[int, int, int, int, int, str]:
    """(groups, m, k, k_blocked, n, note) of a layer as GEMMs: m output pixels, k reduction,
    n outputs. ``k_blocked`` is the reduction the array is handed: the DSA stores channels in
    blocks of r (block_in), so each tap's channels round up to whole blocks (a 24-channel
    1x1 conv streams 32). SCALE-Sim given that GEMM counts what the closed form does.

    A depthwise conv runs on the array as diagonal r x r tiles, one group of r channels at
    a time (k = taps x r, n = r), so its closed form is the per-group GEMM times groups."""
    from dsa_tvm.layers import ir as L

    if isinstance(ly, L.Dense):
        m, k = math.prod(ly.input.shape[:-1]), ly.weight.shape[1]
        return 1, m, k, math.ceil(k / r) * r, ly.weight.shape[0], ""
    n_img, cout, oh, ow = ly.output.shape
    kh, kw = ly.weight.shape[2:]
    if ly.depthwise:
        return (math.ceil(cout / r), n_img * oh * ow, kh * kw * r, kh * kw * r, r,
                "depthwise as diagonal tiles")
    cin = ly.weight.shape[1]
    return 1, n_img * oh * ow, kh * kw * cin, kh * kw * math.ceil(cin / r) * r, cout, ""


def network_layers(name: str, size: int, cfg) -> tuple[list, dict[str, int]]:
    """The network's DSA layers (compiled once) and, per layer, its cycles in the network."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    import dsa_tvm
    from dsa_tvm.models.quantize import calibration_data
    from dsa_tvm.models.zoo import get_model

    qdq = get_model(name, quantized=True, input_size=size)
    fp32 = get_model(name, quantized=False, input_size=size)
    (_, x), = calibration_data(fp32, n=1, seed=7)[0].items()
    ex = tvm.compile(from_onnx(qdq, keep_params_in_input=False), target=dsa_tvm.target(cfg))
    crep = dsa_tvm.last_compile_report()
    relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    rep = dsa_tvm.last_run_report()
    layers = [ly for d in crep.regions if d.region is not None for ly in d.region.layers]
    in_net = {r.name: r.cycles for r in rep.rows if r.target == "DSA"}
    in_net["__total__"] = rep.total_cycles
    return layers, in_net


def alone(ly, cfg, mapping: bool = False) -> dict:
    """Compile one layer as its own region and simulate it (timing only); ``mapping``:
    with the closed form's tiling (``tir_schedules.kinds.conv2d.fewest_folds``) instead of
    the default."""
    from dsa_tvm.isa.instructions import Gemm, Load, Store
    from dsa_tvm.layers import ir as L
    from dsa_tvm.lowering.region import compile_region
    from dsa_tvm.sim.simulator import Simulator
    from dsa_tvm.sim.timing import compute_cycles, dma_bytes
    from tir_schedules.kinds.conv2d import fewest_folds

    choose = fewest_folds if mapping else None
    prog = compile_region(L.Region(ly.name, [ly.input], [ly.output], [ly]), cfg,
                          choose).program
    res = Simulator(cfg).run(prog, timing_only=True)
    gemm = sum(compute_cycles(i, cfg) for i in prog.instructions if isinstance(i, Gemm))
    dram = sum(dma_bytes(i, cfg) for i in prog.instructions if isinstance(i, (Load, Store)))
    return {"total": res.cycles, "gemm": gemm, "dram": dram}


def why(flow: str, ratio: float, note: str, k: int, k_blocked: int, r: int, c: int) -> str:
    """Which mapping detail the closed form lacks, when the two differ by more than 2%;
    and, for output-stationary, what channel padding costs against SCALE-Sim's element K."""
    if note:
        return note
    pad = ""
    if flow == "output-stationary" and k_blocked != k:
        pad = (f"K {k} streams as {k_blocked} (channels in blocks of {r}): "
               f"{(k_blocked + r + c - 2) / (k + r + c - 2):.3f}x SCALE-Sim's unpadded GEMM; ")
    if abs(ratio - 1) <= 0.02:
        return pad
    if flow == "weight-stationary":
        return pad + ("the accumulator or input scratchpad cannot hold every output pixel of "
                      "the layer: pixels split into tiles, each weight tile folds once per "
                      "pixel tile (its preload and skew again)")
    if flow == "output-stationary":
        return pad + ("the input scratchpad cannot hold every pixel's whole reduction: pixel "
                      "tiles of whole rows fold separately (a fold straddling two tiles costs "
                      "two), or the reduction splits into chunks that each drain")
    return pad + "fill/drain once per GEMM instruction (several per layer)"


def as_run(ly, cfg):
    """The layer as the array runs it alone: a few-channel stem whose input the host packs
    as its im2col matrix is a 1x1 conv over C*KH*KW channels (``lowering.fold_input``)."""
    from dsa_tvm.layers import ir as L
    from dsa_tvm.lowering.fold_input import fold_region_inputs

    return fold_region_inputs(L.Region(ly.name, [ly.input], [ly.output], [ly]), cfg)[0].layers[0]


def scalesim_cycles(python: str, flow: str, m: int, k: int, n: int, cfg) -> int | None:
    """SCALE-Sim's compute cycles for the GEMM, run in its own venv (None if absent)."""
    code = ("import sys,tempfile,os\n"
            "from scalesim.scale_sim import scalesim\n"
            "d=tempfile.mkdtemp()\n"
            f"open(d+'/c.cfg','w').write('[general]\\nrun_name=f\\n[architecture_presets]\\n"
            f"ArrayHeight:{cfg.block_in}\\nArrayWidth:{cfg.block_out}\\nIfmapSramSzkB:"
            f"{cfg.inp_kib}\\nFilterSramSzkB:{cfg.wgt_kib}\\nOfmapSramSzkB:{cfg.acc_kib}\\n"
            "IfmapOffset:0\\nFilterOffset:10000000\\nOfmapOffset:20000000\\nBandwidth:10\\n"
            f"Dataflow:{dict(zip(DATAFLOWS, ('ws', 'ws', 'os')))[flow]}\\n"
            "MemoryBanks:1\\n[run_presets]\\nInterfaceBandwidth:CALC\\n')\n"
            f"open(d+'/t.csv','w').write('L,{m},{k},{n},\\n')\n"
            "s=scalesim(save_disk_space=True,verbose=False,config=d+'/c.cfg',"
            "topology=d+'/t.csv',input_type_gemm=True)\n"
            "s.run_scale(top_path=d)\n"
            "print(s.runner.single_layer_sim_object_list[0].get_compute_report_items()[0])\n")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=3600)
        return int(float(out.stdout.strip().splitlines()[-1]))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("nets", nargs="*", default=["resnet18", "mobilenet_v2"])
    ap.add_argument("--hw", default="default")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--stage", default="shared", choices=("shared", "pipelined"))
    ap.add_argument("--double-buffer", action="store_true", help="weight_double_buffer = true")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="override a field of the description, e.g. --set sram.inp_kib=128")
    ap.add_argument("--network", action="store_true",
                    help="also each layer's attributed cycles in the whole network")
    ap.add_argument("--scalesim", default="", help="python of a venv with scalesim installed")
    a = ap.parse_args()

    import dsa_tvm
    from dsa_tvm.hw.config import ConfigError, with_overrides

    try:
        base = with_overrides(dsa_tvm.load_config(a.hw), a.set).replace(
            stage=a.stage, weight_double_buffer=a.double_buffer)
    except (ConfigError, OSError) as e:
        raise SystemExit(f"bench_fidelity: {e}") from None
    r, c = base.block_in, base.block_out
    scalesim = a.scalesim if a.scalesim and shutil.which(a.scalesim) else ""
    worst: dict[str, float] = {}
    for net in a.nets:
        mv = base.replace(dataflow="matrix-vector")
        layers, net_mv = network_layers(net, a.size, mv)
        in_net = {"matrix-vector": net_mv}
        if a.network:
            for flow in DATAFLOWS[1:]:
                in_net[flow] = network_layers(net, a.size, base.replace(dataflow=flow))[1]
        print(f"\n== {net} @ {a.hw} ({a.size}x{a.size}), output stage {a.stage}, "
              f"weight double buffer {a.double_buffer}; network total (matrix-vector) "
              f"{net_mv['__total__']:,} cycles")
        for flow in DATAFLOWS:
            cfg = base.replace(dataflow=flow)
            print(f"\n-- dataflow {flow}" + (f"; network total {in_net[flow]['__total__']:,}"
                                            if flow in in_net else ""))
            seen: dict[tuple, str] = {}
            print(f"  {'layer':<28} {'m x k x n':>18} {'sim GEMM':>11} {'closed':>11} "
                  f"{'ratio':>6} {'default GEMM':>12} {'total alone':>11} {'in network':>11} "
                  f"{'bound':>5}"
                  + ("  scalesim" if scalesim else "") + "  why")
            for ly in layers:
                if type(ly).__name__ not in ("Conv2d", "Dense"):
                    continue
                g, m, k, kb, n, note = layer_gemm(as_run(ly, cfg), r)
                key = (type(ly).__name__, ly.input.shape, ly.output.shape,
                       ly.weight.shape, getattr(ly, "strides", None))
                if key in seen and not a.network:
                    continue
                seen.setdefault(key, ly.name)
                dflt = alone(ly, cfg)
                got = alone(ly, cfg, mapping=not note)   # depthwise: its own mapping
                ref = g * closed_form(flow, m, kb, n, r, c)
                ratio = got["gemm"] / ref
                compute_bound = ref >= got["dram"] / cfg.bandwidth_bytes_per_cycle
                if compute_bound and not note:
                    worst[flow] = max(worst.get(flow, 0.0), abs(ratio - 1))
                net_c = in_net.get(flow, {}).get(ly.name)
                ss = ""
                if scalesim:
                    v = scalesim_cycles(scalesim, flow, m, k, n, cfg)
                    ss = f"  {v * g:>8,}" if v is not None else "  n/a"
                print(f"  {ly.name[:28]:<28} {f'{m}x{k}x{n}':>18} {got['gemm']:>11,} "
                      f"{ref:>11,} {ratio:>6.3f} {dflt['gemm']:>12,} {dflt['total']:>11,} "
                      f"{net_c if net_c is not None else '':>11} "
                      f"{'C' if compute_bound else 'M':>5}{ss}  "
                      f"{why(flow, ratio, note, k, kb, r, c)}")
    print("\nworst |sim GEMM / closed - 1| over compute-bound (C) convs and dense layers "
          "(depthwise excluded):")
    for flow in DATAFLOWS:
        if flow in worst:
            print(f"  {flow:<18} {worst[flow]:.2%}  (goal <= 5%)")


if __name__ == "__main__":
    main()
