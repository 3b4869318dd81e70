"""Dataset-scale simulation speed (issue 17): per-image wall time of the DSA run against
onnxruntime running the FP32 model on the same images, side by side in one run.

For each network (one DSA region between the host's quantize and dequantize),
``batch x procs`` images are run these ways, every output checked identical to the
single runs, image by image:

* ``single, first``: the model's first VM run (the region's program is validated and its
  timing simulated along with the values);
* ``single``: later VM runs, one image each (the timing is reused: it does not depend on
  the data; the program is replayed with its plan, ``dsa_tvm.sim.replay``);
* ``batch``: the region's program over ``--batch`` images in one pass of the functional
  model (``Simulator.run_batch``) in this process, steady state (timing and plan worked
  out before, as a dataset run does once);
* ``P x batch``: ``--procs`` processes (default: every core) each running one such
  batch at once, timed from a barrier they pass together: the cores used through
  processes, as ``dsa-tvm eval`` uses them;
* ``VM, batch``: the images through TVM's VM, as ``dsa-tvm eval --batch B`` runs them
  (``--vm-batch``, default 8): B threads with a VM each, their launches joined into one
  batched simulation per program (``dsa_tvm.launch_batch``).

onnxruntime runs with its default threads (every core: the ratios are against it) and
with one thread (printed beside it).

``--profile K``: cProfile over K single-image VM runs (after the first), the time split
by component (the functional model's instruction semantics, the simulator's dispatch and
validation, timing, program decode, host packing, numpy kernels, TVM), as issue 17 asks
before any speed work.

    python benchmarks/bench_eval.py [resnet18 resnet50] [--batch 32] [--procs CORES]
                                    [--size 224] [--vm-batch 8] [--profile 4]
"""

from __future__ import annotations

import argparse
import os
import time

#: how long the parent waits for a worker's batch (a dead worker must not hang the bench)
WORKER_TIMEOUT_S = 3600


def _sim_worker(index: int, program: bytes, hw_json: str, feeds: dict, ready,
                results) -> None:
    """One process of the 'procs' column: its batch through the region's program, timed
    from a barrier all workers pass together (its timing and replay plan worked out
    first, once per program, as a dataset run does once)."""
    import json

    try:
        from dsa_tvm.hw.config import config_from_dict
        from dsa_tvm.sim.simulator import Simulator

        sim = Simulator(config_from_dict(json.loads(hw_json)))
        prog = sim.load_program(program)
        sim.run(prog, {k: v[0] for k, v in feeds.items()})     # timing
        sim.run_batch(prog, feeds)                              # replay plan, memory warm
        ready.wait(WORKER_TIMEOUT_S)
        t0 = time.time()
        out = sim.run_batch(prog, feeds).outputs
        results.put((index, t0, time.time(), out))
    except BaseException as e:  # noqa: BLE001 - reported by the parent, which must not wait
        ready.abort()
        results.put((index, None, None, f"{type(e).__name__}: {e}"))


def parallel_batches(program, cfg, feeds: dict, procs: int) -> tuple[float, dict]:
    """Wall seconds of ``procs`` processes each running one batch of ``feeds`` (split
    evenly), from the moment they all start to the last one done; their outputs."""
    import json
    import multiprocessing as mp

    import numpy as np

    ctx = mp.get_context("spawn")
    ready, results = ctx.Barrier(procs), ctx.Queue()
    n = len(next(iter(feeds.values())))
    share = -(-n // procs)
    blob, hw_json = program.to_bytes(cfg), json.dumps(cfg.as_dict())
    workers = [ctx.Process(target=_sim_worker, args=(
        w, blob, hw_json, {k: v[w * share:(w + 1) * share] for k, v in feeds.items()},
        ready, results)) for w in range(procs)]
    for w in workers:
        w.start()
    import queue

    try:
        got = [results.get(timeout=WORKER_TIMEOUT_S) for _ in workers]
    except queue.Empty:
        raise RuntimeError(f"bench_eval: no batch back from the simulator workers within "
                           f"{WORKER_TIMEOUT_S} s") from None
    finally:
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.terminate()
    failed = [r for r in got if r[1] is None]
    if failed:
        raise RuntimeError(f"bench_eval: simulator worker {failed[0][0]} failed: "
                           f"{failed[0][3]}")
    got.sort(key=lambda r: r[0])                  # the workers' slices, in order
    wall = max(r[2] for r in got) - min(r[1] for r in got)
    return wall, {k: np.concatenate([r[3][k] for r in got]) for k in got[0][3]}


def bench(name: str, batch: int, size: int, vm_batch: int = 8, procs: int = 2) -> dict:
    import numpy as np
    import onnxruntime as ort
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    import dsa_tvm
    from dsa_tvm.launch_batch import run_joined
    from dsa_tvm.layers.host_pack import pack_region_input
    from dsa_tvm.models.quantize import calibration_data
    from dsa_tvm.models.zoo import get_model
    from dsa_tvm.runtime import take_launches
    from dsa_tvm.sim.simulator import Simulator

    n = batch * procs
    fp32 = get_model(name, quantized=False, input_size=size)
    qdq = get_model(name, quantized=True, input_size=size)
    images = [next(iter(f.values())) for f in calibration_data(fp32, n=n, seed=11)]
    ex = tvm.compile(from_onnx(qdq, keep_params_in_input=False), target=dsa_tvm.target("default"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    walls, launches, outs = [], [], []
    for x in images:
        take_launches()
        t0 = time.perf_counter()
        outs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
        walls.append(time.perf_counter() - t0)
        (launch,) = take_launches()
        launches.append(launch)
    t0 = time.perf_counter()
    joined = run_joined(lambda: relax.VirtualMachine(ex, tvm.cpu()),
                        lambda m, x: m["main"](tvm.runtime.tensor(x)).numpy(), images,
                        vm_batch)
    vm_batch = time.perf_counter() - t0
    same_vm = all(np.array_equal(a, b) for a, b in zip(joined, outs))
    prog, cfg = launches[0].program, launches[0].result.config
    feeds: dict[str, list] = {}
    for launch in launches:
        for k, v in launch.inputs.items():
            for pk, pv in pack_region_input(k, v, prog.meta["io"][k], cfg.block_in,
                                            cfg.block_out).items():
                feeds.setdefault(pk, []).append(pv)
    stacked = {k: np.stack(v) for k, v in feeds.items()}
    first = {k: v[:batch] for k, v in stacked.items()}
    sim = Simulator(cfg)
    sim.run(prog, {k: v[0] for k, v in feeds.items()})  # its timing, as the VM's first run
    sim.run_batch(prog, first)                           # its replay plan; memory warm
    t0 = time.perf_counter()
    res = sim.run_batch(prog, first)
    one_proc = time.perf_counter() - t0
    par, par_out = parallel_batches(prog, cfg, stacked, procs)
    same = all(np.array_equal(res.outputs[k][i], launches[i].result.outputs[k])
               for i in range(batch) for k in res.outputs)
    same_par = all(np.array_equal(par_out[k][i], launches[i].result.outputs[k])
                   for i in range(n) for k in par_out)
    ort_s = {}
    for threads in (0, 1):   # onnxruntime's default (every core), and one thread
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(fp32.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        iname = sess.get_inputs()[0].name
        sess.run(None, {iname: images[0]})
        t0 = time.perf_counter()
        for x in images:
            sess.run(None, {iname: x})
        ort_s[threads] = (time.perf_counter() - t0) / n
    return {"name": name, "n": n, "first": walls[0], "single": sum(walls[1:]) / max(n - 1, 1),
            "batch": one_proc / batch, "procs": par / n, "ort": ort_s[0], "ort1": ort_s[1],
            "same": same and same_par and same_vm, "vm_batch": vm_batch / n}


#: (where a function lives, component) in order: the first match names the component
COMPONENTS = (("dsa_tvm/sim/functional", "functional model (instruction semantics)"),
              ("dsa_tvm/sim/plans", "functional model (instruction semantics)"),
              ("dsa_tvm/isa/semantics", "functional model (instruction semantics)"),
              ("dsa_tvm/isa/norm_unit", "functional model (instruction semantics)"),
              ("dsa_tvm/sim/timing", "timing model"),
              ("dsa_tvm/sim/attribution", "timing model"),
              ("dsa_tvm/sim/counters", "counters"),
              ("dsa_tvm/isa/", "program decode and checks"),
              ("dsa_tvm/sim/", "simulator dispatch and validation"),
              ("dsa_tvm/layers/", "host packing and unpacking"),
              ("dsa_tvm/runtime", "host packing and unpacking"),
              ("dsa_tvm/", "other dsa_tvm"),
              ("tvm/", "TVM VM and runtime"),
              ("numpy", "numpy kernels"),
              ("{method", "numpy kernels"),
              ("{built-in method numpy", "numpy kernels"))


def profile_single(name: str, size: int, k: int) -> None:
    """Where K steady-state single-image runs spend their time (cProfile, own time)."""
    import cProfile
    import pstats

    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    import dsa_tvm
    from dsa_tvm.models.quantize import calibration_data
    from dsa_tvm.models.zoo import get_model

    fp32 = get_model(name, quantized=False, input_size=size)
    images = [next(iter(f.values())) for f in calibration_data(fp32, n=k + 1, seed=11)]
    qdq = get_model(name, quantized=True, input_size=size)
    vm = relax.VirtualMachine(tvm.compile(from_onnx(qdq, keep_params_in_input=False),
                                          target=dsa_tvm.target("default")), tvm.cpu())
    vm["main"](tvm.runtime.tensor(images[0]))   # the first run: validated and timed
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for x in images[1:]:
        vm["main"](tvm.runtime.tensor(x))
    prof.disable()
    wall = (time.perf_counter() - t0) / k
    own: dict[str, float] = {}
    funcs: list[tuple[float, str]] = []
    for (path, _, func), (_, _, tottime, _, _) in pstats.Stats(prof).stats.items():
        where = f"{path} {func}"
        part = next((c for key, c in COMPONENTS if key in where), "other Python")
        own[part] = own.get(part, 0.0) + tottime / k
        funcs.append((tottime / k, f"{path.rsplit('/', 1)[-1]}:{func}"))
    total = sum(own.values())
    print(f"\nprofile of {k} single-image {name} runs: {wall * 1e3:.0f} ms wall each "
          f"({total * 1e3:.0f} ms under the profiler)")
    for part, t in sorted(own.items(), key=lambda kv: -kv[1]):
        print(f"  {part:<44} {t * 1e3:8.1f} ms  {t / total:5.1%}")
    print("  the functions with the most own time (numpy work called inline counts here):")
    for t, where in sorted(funcs, reverse=True)[:6]:
        print(f"    {where:<54} {t * 1e3:8.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("nets", nargs="*", default=["resnet18"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--vm-batch", type=int, default=8,
                    help="threads of the 'VM, batch' column (dsa-tvm eval --batch)")
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1,
                    help="processes of the 'procs' column, a batch each (default: every core)")
    ap.add_argument("--profile", type=int, default=0, metavar="K",
                    help="also profile K single-image runs of the first network")
    a = ap.parse_args()
    if a.batch < 2 or a.procs < 1:
        raise SystemExit("bench_eval: --batch must be at least 2 and --procs at least 1")
    procs = f"{a.procs} x batch"
    print(f"{'model':<10} {'images':>6} {'ORT FP32':>9} {'(1 thread)':>10} "
          f"{'single, first':>14} {'single':>14} {'batch':>14} {procs:>14} {'VM, batch':>14}"
          f"  all == singles")
    for name in a.nets:
        r = bench(name, a.batch, a.size, a.vm_batch, a.procs)
        ort = r["ort"]
        cols = " ".join(f"{r[k] * 1e3:6.0f} ms {r[k] / ort:4.1f}x"
                        for k in ("first", "single", "batch", "procs", "vm_batch"))
        print(f"{name:<10} {r['n']:>6} {ort * 1e3:6.1f} ms {r['ort1'] * 1e3:7.1f} ms {cols}  "
              f"{'yes' if r['same'] else 'NO'}")
    print(f"per image; x: against onnxruntime FP32 (its default threads) on the same images "
          f"and machine (goal <= 3x at batch 32). 'batch': the region's program over {a.batch} "
          f"images in one process (steady state: its timing and replay plan worked out "
          f"before); '{procs}': {a.procs} process(es) each running one such batch at once, "
          f"as dsa-tvm eval uses the cores; 'VM, batch': the model through TVM's VM as "
          f"dsa-tvm eval --batch {a.vm_batch} runs it in one process (VM threads, launches "
          f"joined). Every output is checked identical to the single runs.")
    if a.profile > 0:
        profile_single(a.nets[0], a.size, a.profile)


if __name__ == "__main__":
    main()
