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
from dsa_tvm.lowering.program_cache import PROGRAMS
from dsa_tvm.runtime import take_launches
from tir_schedules.kinds import run_region

from .. import qdq_models as Q

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
    remembered by their CPU rows alone, and only so many of them. The program cache
    keeps programs, not the layers they were compiled from (it kept them until
    2026-12-06: this passed only when an earlier test had compiled the same model)."""
    PROGRAMS.clear()            # this compile fills the cache, whatever ran before
    _ex, rep = _compile(models["conv"])
    weight = weakref.ref(rep.regions[0].region.layers[0].weight)
    del rep
    _compile(models["dense"])
    gc.collect()
    assert len(PROGRAMS) > 0
    assert weight() is None, "an older compile report (or the program cache) holds its weights"


def test_compile_records_are_bounded():
    memory = pipeline.CompileMemory(limit=3)
    for k in range(10):
        memory.add(pipeline.CompileReport("default", compile_id=f"id{k}"))
    assert len(memory) == 3
    assert memory.record("id2") is None and memory.report("id2") is None
    assert [memory.report(f"id{k}").compile_id for k in (7, 8, 9)] == ["id7", "id8", "id9"]
    assert memory.record("id9") is not None


def test_program_cache_is_bounded_and_still_exact(models):
    with runtime.program_cache_bounds(max_entries=1):
        exes = {k: _compile(models[k])[0] for k in ("conv", "relu")}
        vms = {k: relax.VirtualMachine(ex, tvm.cpu()) for k, ex in exes.items()}
        xs = {k: _input(models[k], 2) for k in exes}
        first = {k: _run(vms[k], xs[k]) for k in exes}
        for _ in range(3):
            for k in exes:
                np.testing.assert_array_equal(_run(vms[k], xs[k]), first[k])
                assert len(runtime._programs) == 1
    assert runtime._programs.max_entries == runtime.PROGRAM_CACHE_ENTRIES


@pytest.mark.parametrize("cache_entries", [runtime.PROGRAM_CACHE_ENTRIES, 1])
def test_threads_with_their_own_vm_are_exact_and_report_their_own_run(models, cache_entries):
    """Six threads, each with its own VirtualMachine of one of two executables, run
    concurrently: outputs bit-exact against single-thread runs, and every thread's
    last_run_report() is that of its own model's last run (also while the program cache
    evicts on every other launch)."""
    with runtime.program_cache_bounds(max_entries=cache_entries):
        _threads_report_their_own_run(models)


def _threads_report_their_own_run(models) -> None:
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
            got[t] = (outs, _rows(dsa_tvm.last_run_report()), _rows(dsa_tvm.run_report(vm)))
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(kinds))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors
    assert sorted(got) == list(range(len(kinds)))
    for t, (outs, rows, own) in got.items():
        k = kinds[t]
        for rep_outs in outs:
            for o, w in zip(rep_outs, want_out[k]):
                np.testing.assert_array_equal(o, w)
        assert rows == own == want_rep[k], (t, k)


def test_compile_report_belongs_to_its_executable(models):
    """Compile A, then B: ``compile_report(A)`` is A's (not the last compile's), from the
    executable or a VirtualMachine of it; the newest report is complete, older ones keep
    everything but their regions' layers."""
    ex_a, rep_a = _compile(models["conv"])
    ex_b, rep_b = _compile(models["dense"])
    got_a = dsa_tvm.compile_report(ex_a)
    assert got_a.compile_id == rep_a.compile_id != rep_b.compile_id
    assert str(got_a) == str(rep_a)
    assert [(d.name, d.target, d.layers, d.macs) for d in got_a.regions] == [
        (d.name, d.target, d.layers, d.macs) for d in rep_a.regions] and got_a.regions
    assert all(d.region is None for d in got_a.regions)            # weight-free
    assert dsa_tvm.compile_report(relax.VirtualMachine(ex_a, tvm.cpu())) is got_a
    assert dsa_tvm.compile_report(ex_b) is rep_b is dsa_tvm.last_compile_report()
    assert rep_b.regions[0].region is not None                      # the newest, complete
    # the programs the executable launches carry the same id
    vm = relax.VirtualMachine(ex_a, tvm.cpu())
    _run(vm, _input(models["conv"], 0))
    assert {ln.compile_id for ln in runtime.launches_of(rep_a.compile_id)} == {rep_a.compile_id}


def test_run_report_of_a_vm_is_its_own_last_run(models):
    """Run A, then C (another DSA model), then compile B: ``run_report(vm_a)`` is still A's
    last run (rows, cycles, MAC share), ``run_report(vm_c)`` C's; a model without DSA
    regions reports its CPU layers."""
    ex_a, _ = _compile(models["conv"])
    ex_c, _ = _compile(models["relu"])
    vm_a, vm_c = relax.VirtualMachine(ex_a, tvm.cpu()), relax.VirtualMachine(ex_c, tvm.cpu())
    _run(vm_a, _input(models["conv"], 4))
    want_a = dsa_tvm.last_run_report()                               # A alone
    _run(vm_c, _input(models["relu"], 5))
    want_c = dsa_tvm.last_run_report()
    ex_b, rep_b = _compile(models["dense"])
    got_a, got_c = dsa_tvm.run_report(vm_a), dsa_tvm.run_report(ex_c)
    assert _rows(got_a) == _rows(want_a) and got_a.total_cycles == want_a.total_cycles
    assert _rows(got_c) == _rows(want_c) and _rows(got_c) != _rows(got_a)
    assert got_a.regions == got_c.regions == 1
    # the outputs A's report came from are A's, checked against the integer reference
    (launch,) = runtime.launches_of(dsa_tvm.compile_report(ex_a).compile_id)
    region = launch.program.meta["layers"]
    assert [ly["name"] for ly in region] == [r.name for r in got_a.rows if r.target == "DSA"]
    vm_b = relax.VirtualMachine(ex_b, tvm.cpu())
    _run(vm_b, np.zeros((3, 20), np.float32))
    cpu_only = dsa_tvm.run_report(vm_b)
    assert cpu_only.regions == 0 and {r.target for r in cpu_only.rows} == {"CPU"}
    assert [r.name for r in cpu_only.rows] == [ly for d in rep_b.regions for ly in d.layers]


def test_unknown_executables_are_refused_with_the_reason(models):
    from dsa_tvm.compile_ids import with_compile_id

    plain = tvm.compile(from_onnx(onnx.load(models["conv"]), keep_params_in_input=False),
                        target="llvm")
    with pytest.raises(dsa_tvm.UnknownCompileError, match="not compiled for the DSA"):
        dsa_tvm.compile_report(plain)
    # what an executable compiled in another process (or forgotten) looks like here
    mod = from_onnx(onnx.load(models["conv"]), keep_params_in_input=False)
    elsewhere = tvm.compile(with_compile_id(mod, "0" * 32), target="llvm")
    with pytest.raises(dsa_tvm.UnknownCompileError, match="another process"):
        dsa_tvm.compile_report(elsewhere)
    with pytest.raises(dsa_tvm.UnknownCompileError, match="no run of this executable"):
        dsa_tvm.run_report(relax.VirtualMachine(elsewhere, tvm.cpu()))
    ex, _ = _compile(models["conv"])                                 # known, never run
    with pytest.raises(dsa_tvm.UnknownCompileError, match="run it in this thread first"):
        dsa_tvm.run_report(ex)
    with pytest.raises(TypeError, match="VirtualMachine"):
        dsa_tvm.compile_report("model.so")


def test_compile_memory_stays_bounded_over_many_compiles():
    """Reports whose regions hold 256 KB of weights each: after many more compiles than
    the memory keeps, it holds ``limit`` weight-free reports and traced memory has not
    grown by the compiles it forgot."""
    from .test_lowering import dense, qt, region

    rng = np.random.default_rng(0)
    x = qt(rng, "x", (2, 512))

    def report(k: int):
        reg = region([x], [dense(rng, x, 512, name=f"d{k}")])       # 512 x 512 int8 weight
        d = pipeline.RegionDecision(reg.name, ["d"], 1, "cpu", "test", region=reg)
        return pipeline.CompileReport("default", regions=[d], compile_id=f"id{k}")

    memory = pipeline.CompileMemory(limit=4)
    tracemalloc.start()
    try:
        for k in range(8):             # the newest report's weights are traced from here on
            memory.add(report(k))
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for k in range(8, 48):
            memory.add(report(k))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(memory) == 4
    assert memory.report("id40") is None and memory.report("id47").regions[0].region is not None
    assert all(memory.report(f"id{k}").regions[0].region is None for k in (44, 45, 46))
    assert memory.record("id45").rows[0].name == "d45"               # CPU rows still there
    assert grown < 64 << 10, f"{grown:,} bytes more after 40 more compiles"


def test_each_thread_keeps_the_last_run_of_a_few_executables():
    from types import SimpleNamespace

    runs = runtime._ThreadRuns(limit=2)

    def launch(cid: str):
        return runtime.Launch(SimpleNamespace(meta={"compile": cid}), None, {}, {})

    a1, a2, b1, c1 = launch("a"), launch("a"), launch("b"), launch("c")
    runs.add(b"r1", a1)
    runs.add(b"r1", a2)                      # r1 again: A's next run
    assert runs.of("a") == [a2]
    runs.add(b"r1", b1)
    assert runs.take() == [b1] and runs.take() == []     # the newest run, once
    assert runs.of("b") == [b1]                          # still A's and B's last runs
    runs.add(b"r1", c1)
    assert runs.of("a") == [] and runs.of("b") == [b1] and runs.of("c") == [c1]


def test_the_compile_id_survives_export_library(models, tmp_path):
    """A module loaded back from ``export_library`` is the same executable: in the process
    that compiled it, its compile report and its runs are found."""
    ex, rep = _compile(models["conv"])
    ex.export_library(str(tmp_path / "m.so"))
    loaded = tvm.runtime.load_module(str(tmp_path / "m.so"))
    assert dsa_tvm.compile_report(loaded).compile_id == rep.compile_id
    vm = relax.VirtualMachine(loaded, tvm.cpu())
    x = _input(models["conv"], 6)
    _run(vm, x)
    want = _rows(dsa_tvm.run_report(vm))
    _run(relax.VirtualMachine(ex, tvm.cpu()), x)   # the original: same compile, same rows
    assert _rows(dsa_tvm.run_report(ex)) == want and want
