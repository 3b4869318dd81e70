"""One pass of the functional model over a batch of inputs: bit for bit the same as one
run per input, for every kind of layer (shared and per-input weight tiles, tables, norm
units, accumulator reductions); timing is worked out once per program and reused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("tvm")

from dsa_tvm.layers import ir as L  # noqa: E402
from dsa_tvm.layers.host_pack import pack_region_input  # noqa: E402
from dsa_tvm.layers.layouts import unpack_activation  # noqa: E402
from dsa_tvm.lowering.region import compile_region  # noqa: E402
from dsa_tvm.sim.errors import SimulationError  # noqa: E402
from dsa_tvm.sim.simulator import Simulator  # noqa: E402
from tir_schedules.kinds import run_region  # noqa: E402

from .test_lowering import CFGS, add, batch_matmul, conv, dense, gap, qt, region  # noqa: E402
from .test_norm_lowering import NORM_CFGS, _norm  # noqa: E402


def _regions(rng, cfg) -> dict[str, L.Region]:
    x = qt(rng, "x", (1, 24, 7, 6))
    c1 = conv(rng, x, 20, 3, 1, 1, name="c1")
    c2 = conv(rng, c1.output, 24, 1, 2, 0, name="c2")       # a strided 1x1: subsampled loads
    t = L.Table("t", c1.output, qt(rng, "ty", c1.output.shape),
                rng.integers(-128, 128, 256).astype(np.int8))
    s = add(rng, x, x, name="sum")
    g = gap(rng, c2.output, flat=True)
    a, b = qt(rng, "a", (2, 5, 20)), qt(rng, "b", (2, 20, 18))
    h = qt(rng, "h", (6, 40))
    d = dense(rng, h, 33)
    return {
        "convs_table_pool": region([x], [c1, t, c2, g, s], [t.output, g.output, s.output]),
        # the b operand is packed by the host into weight tiles: different in every input
        "batch_matmul": region([a, b], [batch_matmul(rng, a, b)]),
        "dense_norm": region([h], [d, _norm("layernorm", d.output, rng),
                                   _norm("softmax", d.output, rng, "sm")]),
    }


def _feeds(reg: L.Region, prog, cfg, rng) -> tuple[dict, dict]:
    logical = {t.name: rng.integers(-128, 128, t.shape, dtype=np.int8) for t in reg.inputs}
    packed = {}
    for k, v in logical.items():
        packed.update(pack_region_input(k, v, prog.meta["io"][k], cfg.block_in, cfg.block_out))
    return logical, packed


def _one(name: str, seed: int):
    """(cfg, compiled program, packed feeds) of one of the test regions on ``default``."""
    cfg = CFGS["default"]
    rng = np.random.default_rng(seed)
    reg = _regions(rng, cfg)[name]
    prog = compile_region(reg, cfg).program
    return cfg, prog, _feeds(reg, prog, cfg, rng)[1]


@pytest.mark.parametrize("preset", ["edge", "default"])
@pytest.mark.parametrize("name", ["convs_table_pool", "batch_matmul", "dense_norm"])
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_batch_is_bit_for_bit_its_single_runs(preset, name, data):
    cfg = NORM_CFGS[preset]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    reg = _regions(rng, cfg)[name]
    prog = compile_region(reg, cfg).program
    n = data.draw(st.integers(1, 4))
    runs = [_feeds(reg, prog, cfg, rng) for _ in range(n)]
    sim = Simulator(cfg)
    singles = [sim.run(prog, packed) for _, packed in runs]
    batched = sim.run_batch(prog, {k: np.stack([p[k] for _, p in runs]) for k in runs[0][1]})
    assert batched.batch == n and batched.timing_reused
    assert batched.cycles == singles[0].cycles
    for k, (logical, _) in enumerate(runs):
        want = run_region(reg, logical)
        for t in reg.outputs:
            got = batched.outputs[t.name][k]
            np.testing.assert_array_equal(got, singles[k].outputs[t.name])
            np.testing.assert_array_equal(unpack_activation(got, t.shape), want[t.name])


def test_timing_is_worked_out_once_per_program_and_redone_when_asked():
    cfg, prog, packed = _one("convs_table_pool", 3)
    sim = Simulator(cfg)
    first, again = sim.run(prog, packed), sim.run(prog, packed)
    assert not first.timing_reused and again.timing_reused
    assert again.schedule is first.schedule and again.counters == first.counters
    fresh = sim.run(prog, packed, fresh_timing=True)
    assert not fresh.timing_reused and fresh.cycles == first.cycles
    # another simulator, or an edited program, times it again
    assert not Simulator(cfg).run(prog, packed).timing_reused
    prog.instructions[-2] = prog.instructions[-2]  # same object: still the same program
    assert sim.run(prog, packed).timing_reused
    prog.instructions.insert(0, prog.instructions[-1])   # a FINISH first: edited, re-timed
    with pytest.raises(SimulationError):
        sim.run(prog, packed)


@pytest.mark.parametrize("bad, every, match", [
    (lambda x: x, False, "must be \\(N, "),                        # unbatched
    (lambda x: np.stack([x, x])[:, :-1], False, "must be \\(N, "),  # wrong shape
    (lambda x: np.stack([x])[:0], True, "empty batch"),
])
def test_bad_batches_say_what_to_give(bad, every, match):
    cfg, prog, packed = _one("batch_matmul", 4)
    feeds = {k: np.stack([v, v]) for k, v in packed.items()}
    for k in list(packed)[:None if every else 1]:
        feeds[k] = bad(packed[k])
    with pytest.raises(SimulationError, match=match):
        Simulator(cfg).run_batch(prog, feeds)


def test_inputs_of_different_batch_sizes_are_refused():
    cfg, prog, packed = _one("batch_matmul", 5)
    feeds = {k: np.stack([v] * (2 if i else 3)) for i, (k, v) in enumerate(packed.items())}
    with pytest.raises(SimulationError, match="disagree on N"):
        Simulator(cfg).run_batch(prog, feeds)


def test_the_run_report_says_when_timing_was_reused():
    from dsa_tvm.report import build_report
    from dsa_tvm.runtime import Launch

    cfg, prog, packed = _one("convs_table_pool", 6)
    sim = Simulator(cfg)
    first, again = sim.run(prog, packed), sim.run(prog, packed)
    fresh = build_report([Launch(prog, first, {}, {})])
    reused = build_report([Launch(prog, again, {}, {})])
    assert fresh.timing_reused == 0 and "reused the schedule" not in str(fresh)
    assert reused.timing_reused == 1 and "1 of 1 launch(es) reused the schedule" in str(reused)
    assert reused.total_cycles == fresh.total_cycles
    assert [r.cycles for r in reused.rows] == [r.cycles for r in fresh.rows]


def test_blas_is_pinned_during_a_run_and_given_back():
    import threading

    from threadpoolctl import threadpool_info

    from dsa_tvm.sim.simulator import one_blas_thread

    def blas() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = blas()
    with one_blas_thread():
        assert all(n == 1 for n in blas())
    assert blas() == before
    seen = []
    t = threading.Thread(target=lambda: seen.append(one_blas_thread().__enter__() or blas()))
    t.start()
    t.join()
    assert seen == [before] and blas() == before   # the caller's threads: left alone


def test_blas_loaded_after_the_first_run_is_pinned_too():
    """A BLAS library loaded after the first pinned run (scipy's own OpenBLAS, imported
    late) is pinned as well: a fresh interpreter, so the import order is this one."""
    import os
    import subprocess
    import sys

    code = """
import numpy
from threadpoolctl import threadpool_info
from dsa_tvm.sim.simulator import one_blas_thread
with one_blas_thread():
    pass
import scipy.linalg
blas = lambda: [(i["filepath"], i["num_threads"]) for i in threadpool_info()
                if i["user_api"] == "blas"]
assert len(blas()) == 2, blas()   # numpy's and scipy's
with one_blas_thread():
    assert all(n == 1 for _, n in blas()), blas()
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OPENBLAS_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]

def test_a_reused_schedule_reports_its_rows_once_as_fresh_rows():
    """A decode loop's programs are attributed once per schedule: the same rows every
    launch, each report's rows its own objects, another program never served them."""
    import dataclasses

    from dsa_tvm.report import _ROWS, _attributed_rows, build_report
    from dsa_tvm.runtime import Launch

    cfg, prog, packed = _one("convs_table_pool", 6)
    sim = Simulator(cfg)
    first, again = sim.run(prog, packed), sim.run(prog, packed)
    assert again.schedule is first.schedule   # what the memo keys on
    a = build_report([Launch(prog, first, {}, {})], trace=False)
    assert _ROWS[id(first.schedule)][1]() is prog
    a.rows[0].cycles = -1     # a caller's edit stays in its report
    b = build_report([Launch(prog, again, {}, {})], trace=False)
    want, _ = _attributed_rows(Launch(prog, again, {}, {}), cfg.peak_macs_per_cycle)
    assert [dataclasses.asdict(r) for r in b.rows] == [dataclasses.asdict(r) for r in want]
    assert b.rows[0].cycles != -1
    # another program's run (its own schedule) is attributed on its own
    cfg2, prog2, packed2 = _one("batch_matmul", 5)
    c = build_report([Launch(prog2, Simulator(cfg2).run(prog2, packed2), {}, {})])
    assert [r.name for r in c.rows] != [r.name for r in b.rows]
