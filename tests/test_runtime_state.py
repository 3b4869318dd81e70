"""The DSA runtime's state: reports belong to the model that ran, memory stays bounded,
threads with their own VirtualMachine run exactly (issue 11, findings 4 and 10).

Before, ``last_run_report()`` paired the launches with the last *compiled* model, every
launch and every compile report (weights included) was kept forever, and the launch
records were one list shared by all threads.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
import weakref

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm import pipeline, runtime
from dsa_tvm.layers.reference import run_region
from dsa_tvm.runtime import take_launches

from . import qdq_models as Q

# no launch overhead: these small layers offload, and a run takes milliseconds
HW = dsa_tvm.load_config("default").replace(launch_overhead_us=0.0)


def _compile(path):
    ex = tvm.compile(from_onnx(onnx.load(path), keep_params_in_input=False),
                     target=dsa_tvm.target(HW))
    return ex, dsa_tvm.last_compile_report()


def _input(path, seed: int) -> np.ndarray:
    m = onnx.load(path)
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(vm, x: np.ndarray) -> np.ndarray:
    out = vm["main"](tvm.runtime.tensor(x))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def _rows(rep) -> list[tuple]:
    return [(r.name, r.op, r.target, r.macs, r.cycles, r.dram_read, r.dram_written)
            for r in rep.rows]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two DSA models (a conv, a conv + ReLU of another shape) and a dense one that stays
    on the CPU."""
    mk = tmp_path_factory.mktemp
    return {"conv": Q.conv_net(mk("conv"), cin=16, cout=16, hw=8),
            "relu": Q.conv_net(mk("relu"), cin=16, cout=32, hw=8, act="relu", seed=3),
            "dense": Q.dense_net(mk("dense"))}


def test_run_report_belongs_to_the_model_that_ran(models):
    """Compile A, run A (the reference report), compile B, run A again: the same report,
    without B's dense layer and with A's own MAC share."""
    ex_a, rep_a = _compile(models["conv"])
    assert [d.target for d in rep_a.regions] == ["dsa"]
    vm_a = relax.VirtualMachine(ex_a, tvm.cpu())
    x = _input(models["conv"], 1)
    take_launches()
    _run(vm_a, x)
    want = dsa_tvm.last_run_report()
    assert want.dsa_mac_share == 1.0 and want.regions == 1

    _ex_b, rep_b = _compile(models["dense"])
    assert [d.target for d in rep_b.regions] == ["cpu"]        # B has a CPU dense layer
    assert dsa_tvm.last_compile_report() is rep_b
    _run(vm_a, x)
    got = dsa_tvm.last_run_report()
    assert _rows(got) == _rows(want)
    assert not any(r.op == "Dense" for r in got.rows)
    assert got.dsa_mac_share == want.dsa_mac_share == 1.0
    assert got.total_cycles == want.total_cycles


def test_serving_loop_keeps_one_run(models):
    """Runs without a report in between keep the last run's launches only: the record
    count stays at one run and traced memory does not grow with the number of runs."""
    ex, rep = _compile(models["conv"])
    region = rep.regions[0].region
    vm = relax.VirtualMachine(ex, tvm.cpu())
    xs = [_input(models["conv"], s) for s in range(4)]
    for k in range(30):                                          # warm every cache
        _run(vm, xs[k % 4])
    gc.collect()
    tracemalloc.start()
    try:
        for k in range(20):
            _run(vm, xs[k % 4])
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for k in range(200):
            _run(vm, xs[k % 4])
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # one run's records are ~10 KB; 200 runs kept would be > 1 MB
    assert grown < 64 << 10, f"{grown:,} bytes more after 200 more runs"
    (launch,) = take_launches()                                  # the last run, only
    want = run_region(region, launch.inputs)                     # integer reference
    for name, out in launch.outputs.items():
        np.testing.assert_array_equal(out, want[name])


def test_compile_reports_do_not_pin_weights(models):
    """Only the newest compile report keeps its regions' layers; older compiles are
    remembered by their CPU rows alone, and only so many of them."""
    _ex, rep = _compile(models["conv"])
    weight = weakref.ref(rep.regions[0].region.layers[0].weight)
    del rep
    _compile(models["dense"])
    gc.collect()
    assert weight() is None, "an older compile report still holds its weights"
    assert len(pipeline._last_report) == 1


def test_compile_records_are_bounded(monkeypatch):
    monkeypatch.setattr(pipeline, "COMPILE_RECORDS", 3)
    for k in range(10):
        pipeline._remember(f"id{k}", pipeline.CompileReport("default"))
    assert list(pipeline._records) == ["id7", "id8", "id9"]
    assert pipeline.compile_record("id2") is None and pipeline.compile_record("id9") is not None


def test_program_cache_is_bounded_and_still_exact(models, monkeypatch):
    monkeypatch.setattr(runtime, "PROGRAM_CACHE_ENTRIES", 1)
    exes = {k: _compile(models[k])[0] for k in ("conv", "relu")}
    vms = {k: relax.VirtualMachine(ex, tvm.cpu()) for k, ex in exes.items()}
    xs = {k: _input(models[k], 2) for k in exes}
    first = {k: _run(vms[k], xs[k]) for k in exes}
    for _ in range(3):
        for k in exes:
            np.testing.assert_array_equal(_run(vms[k], xs[k]), first[k])
            assert len(runtime._programs) == 1


@pytest.mark.parametrize("cache_entries", [runtime.PROGRAM_CACHE_ENTRIES, 1])
def test_threads_with_their_own_vm_are_exact_and_report_their_own_run(models, monkeypatch,
                                                                      cache_entries):
    """Six threads, each with its own VirtualMachine of one of two executables, run
    concurrently: outputs bit-exact against single-thread runs, and every thread's
    last_run_report() is that of its own model's last run (also while the program cache
    evicts on every other launch)."""
    monkeypatch.setattr(runtime, "PROGRAM_CACHE_ENTRIES", cache_entries)
    exes = {k: _compile(models[k])[0] for k in ("conv", "relu")}
    inputs = {k: [_input(models[k], 10 + s) for s in range(3)] for k in exes}
    want_out, want_rep = {}, {}
    for k, ex in exes.items():
        vm = relax.VirtualMachine(ex, tvm.cpu())
        want_out[k] = [_run(vm, x) for x in inputs[k]]
        want_rep[k] = _rows(dsa_tvm.last_run_report())       # the last input's run
        assert want_rep[k] and all(r[2] == "DSA" for r in want_rep[k])
    kinds = ["conv", "relu"] * 3
    start = threading.Barrier(len(kinds))
    got: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            k = kinds[t]
            vm = relax.VirtualMachine(exes[k], tvm.cpu())
            start.wait()
            outs = [[_run(vm, x) for x in inputs[k]] for _ in range(3)]
            got[t] = (outs, _rows(dsa_tvm.last_run_report()))
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(kinds))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors
    assert sorted(got) == list(range(len(kinds)))
    for t, (outs, rows) in got.items():
        k = kinds[t]
        for rep_outs in outs:
            for o, w in zip(rep_outs, want_out[k]):
                np.testing.assert_array_equal(o, w)
        assert rows == want_rep[k], (t, k)
