"""The tuning space in MetaSchedule terms: knobs as trace decisions, instruction counts,
the search's filters, worker processes, progress, and the cost model's ranking.

References are independent of the tuner: cycles a runner reports are compared with a
direct simulation of the same knobs' program; the rank-correlation helpers with scipy
when it is installed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import tvm_ffi
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import s_tir

import dsa_tvm
from dsa_tvm.tuning import Task
from dsa_tvm.tuning.measure import DSABuilder, SimRunner, secs_to_cycles
from dsa_tvm.tuning.rank import cost_model_check, kendall_tau, spearman
from dsa_tvm.tuning.search import (
    LEAN_FLOOR,
    LEANER,
    FitsPostproc,
    KnobMutator,
    reject_reason,
    searchable,
    within_budget,
)
from dsa_tvm.tuning.task import measure_knobs
from tir_schedules.kinds import kind_of
from tir_schedules.kinds.conv2d import ConvShape
from tir_schedules.kinds.grouped_dense import GroupedShape
from tir_schedules.kinds.matmul import MatmulShape
from tir_schedules.kinds.space import check_knobs, knobs_from_mod, perf_shape, sample_knobs
from tir_schedules.kinds.window import WindowShape

from .shapes import DEFAULT, EDGE, SHAPES, conv_shape, sampled


# ----------------------------------------------------------------------------- the space
@pytest.mark.parametrize("kind", list(SHAPES))
def test_knobs_are_trace_decisions(kind):
    """Fixed knobs replay through the trace; random decisions give divisor tiles; a
    mutated trace is another point of the same space."""
    task = Task(DEFAULT, SHAPES[kind])
    default = task.default_knobs()
    sch = sampled(task, default)
    assert knobs_from_mod(sch.mod, task.shape) == default
    replay = s_tir.Schedule(task.workload())
    sch.trace.apply_to_schedule(replay, remove_postproc=False)
    assert knobs_from_mod(replay.mod, task.shape) == default
    space = set(task.candidates())
    for seed in range(1, 7):
        s = s_tir.Schedule(task.workload(), seed=seed)
        sample_knobs(s, task.shape)
        k = knobs_from_mod(s.mod, task.shape)
        assert (k in space) == (check_knobs(DEFAULT, task.shape, k) is None)
    mutator = KnobMutator(seed=1)
    seen = set()
    for _ in range(10):
        t = mutator.apply(sch.trace)
        s = s_tir.Schedule(task.workload())
        t.apply_to_schedule(s, remove_postproc=False)
        seen.add(knobs_from_mod(s.mod, task.shape))
    assert len(seen - {default}) >= 2


COUNTED = {**SHAPES,
           "window_dw": WindowShape("dw", 1, 12, 12, 2, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 16,
                                    0, 0, (-128, 127)),
           "conv_dw": conv_shape(icb=1, ocb=4, depthwise=True),
           "conv_1x1_s2": dataclasses.replace(conv_shape(k=1), strides=(2, 2))}


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_instruction_counts_match_the_lowered_programs(data):
    """The search's instruction count of a knob setting (no lowering) against the program
    the walker makes: exact for a tile away from the borders, within 15% overall (border
    tiles of padded layers differ by a few rows)."""
    kind = data.draw(st.sampled_from(sorted(COUNTED)))
    cfg = data.draw(st.sampled_from([DEFAULT, EDGE]))
    shape = COUNTED[kind]
    if cfg is EDGE:
        shape = perf_shape(_with_block(shape, EDGE))
    task = Task(cfg, shape)
    knobs = data.draw(st.sampled_from(task.candidates()))
    got = len(task.program(knobs).instructions)
    counted = kind_of(shape).instructions(cfg, shape, knobs)
    assert abs(counted / got - 1) <= 0.15, (kind, cfg.name, knobs, counted, got)
    if not any(getattr(shape, "padding", (0,))):
        assert counted == got, (kind, cfg.name, knobs)


def _with_block(shape, cfg):
    """``shape`` with the block sizes of ``cfg``."""
    if isinstance(shape, (ConvShape, MatmulShape, GroupedShape)):
        return dataclasses.replace(shape, block_in=cfg.block_in, block_out=cfg.block_out)
    return dataclasses.replace(shape, block=cfg.block_out)


def test_search_skips_settings_with_a_leaner_twin():
    """A tall, thin pooling tile takes several times the instructions of its wide, short
    twin for the same estimate: the search measures the twin only, says why it skips the
    other, and skips nothing without such a twin."""
    shape = WindowShape("max", 1, 56, 56, 8, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 8, -128, 0,
                        (-128, 127))
    task = Task(EDGE, shape)
    kind = kind_of(shape)
    budget, search = within_budget(task), set(searchable(task))
    est = {k: kind.estimate(EDGE, shape, k) for k in budget}
    n = {k: kind.instructions(EDGE, shape, k) for k in budget}
    skipped = [k for k in budget if k not in search]
    assert skipped and len(search) < len(budget)
    for k in budget:
        twins = [t for t in budget if est[t] <= est[k] and LEANER * n[t] <= n[k]
                 and n[k] > LEAN_FLOOR]
        assert (k in search) == (not twins), k
        if twins:
            reason = reject_reason(task, k)
            assert f"{n[k]:,} instructions" in reason and "estimated no slower" in reason
    tall = dataclasses.replace(task.default_knobs(), tile_oh=14, tile_ow=1)
    if tall in budget:
        assert tall not in search


def test_perf_shape_ignores_values_only():
    s = dataclasses.replace(conv_shape(), input_zp=5, output_zp=-3, clip=(0, 127))
    assert perf_shape(s) == conv_shape()
    assert tvm_ffi.structural_equal(Task(DEFAULT, perf_shape(s)).workload(),
                                    Task(DEFAULT, conv_shape()).workload())
    # the hardware is part of the workload: records of one part never serve another
    assert not tvm_ffi.structural_equal(Task(DEFAULT, conv_shape()).workload(),
                                        Task(DEFAULT.replace(mhz=500), conv_shape()).workload())


def test_misfits_are_rejected_before_measurement():
    """A knob setting whose input tile overflows the scratchpad: the search's postproc
    drops it and the builder refuses it with the reason; a fitting one builds, and the
    runner's cycles are a direct simulation of the same knobs."""
    task = Task(EDGE, conv_shape(h=56, icb=8, ocb=8, cfg=EDGE))
    bad = dataclasses.replace(task.default_knobs(), tile_oh=56, tile_ow=56)
    problem = check_knobs(EDGE, task.shape, bad)
    assert problem and "scratchpad" in problem
    assert FitsPostproc().apply(sampled(task, bad)) is False
    good = task.default_knobs()
    assert FitsPostproc().apply(sampled(task, good)) is True
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    target = dsa_tvm.target(EDGE)
    res = DSABuilder().build([BuilderInput(sampled(task, bad).mod, target),
                              BuilderInput(sampled(task, good).mod, target)])
    assert res[0].artifact_path is None and "rejected before measurement" in res[0].error_msg
    assert res[1].error_msg is None and Path(res[1].artifact_path).is_file()
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    (fut,) = SimRunner().run([RunnerInput(res[1].artifact_path, "cpu", [])])
    got = fut.result()
    assert got.error_msg is None
    assert secs_to_cycles(EDGE, float(got.run_secs[0])) == measure_knobs(task, good)


def test_worker_processes_build_and_measure_the_same(tmp_path):
    """Two worker processes build and time the candidates: the same artifacts' cycles as
    in this process and as a direct simulation; a misfit is still refused by name; the
    work ran in other processes."""
    import os

    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from dsa_tvm.tuning.measure import worker_pool

    task = Task(DEFAULT, conv_shape(h=7, icb=2, ocb=2))
    knobs = task.candidates()[:4]
    big = Task(EDGE, conv_shape(h=56, icb=8, ocb=8, cfg=EDGE))
    bad = dataclasses.replace(big.default_knobs(), tile_oh=56, tile_ow=56)  # overflows
    target = dsa_tvm.target(DEFAULT)
    got = {}
    for workers in (1, 2):
        built = DSABuilder(str(tmp_path), workers=workers).build(
            [BuilderInput(sampled(big, bad).mod, dsa_tvm.target(EDGE))]
            + [BuilderInput(sampled(task, k).mod, target) for k in knobs])
        assert built[0].artifact_path is None and "rejected" in built[0].error_msg
        futures = SimRunner(workers).run(
            [RunnerInput(b.artifact_path, "cpu", []) for b in built[1:]])
        got[workers] = [secs_to_cycles(DEFAULT, float(f.result().run_secs[0]))
                        for f in futures]
    assert got[1] == got[2] == [measure_knobs(task, k) for k in knobs]
    pids = {worker_pool(2).submit(os.getpid).result() for _ in range(6)}
    assert pids and os.getpid() not in pids


def test_progress_bar_counts_trials_best_and_failures(capsys):
    from tvm.s_tir.meta_schedule import MeasureCandidate
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.builder import BuilderResult
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from dsa_tvm.tuning.progress import TrialProgress

    task = Task(DEFAULT, SHAPES["conv"])
    cand = MeasureCandidate(sampled(task), ArgInfo.from_prim_func(task.workload()["main"]))
    bar = TrialProgress("conv2d_x", total=4, mhz=DEFAULT.mhz, best_cycles=1000, enabled=True)
    ok = BuilderResult("/a/program.dsa", None)
    from tvm.s_tir.meta_schedule.task_scheduler import TaskScheduler

    bar.apply(TaskScheduler.create("round-robin"), 0, [cand] * 3,
              [ok, BuilderResult(None, "ValueError: rejected before measurement: too big"), ok],
              [RunnerResult([800 / (DEFAULT.mhz * 1e6)], None), RunnerResult(None, None),
               RunnerResult([1200 / (DEFAULT.mhz * 1e6)], None)])
    assert (bar.bar.n, bar.best, bar.failed) == (3, 800, 1)
    bar.close()
    err = capsys.readouterr().err
    assert "best cycles=800" in err and "rejected before measurement" in err


# ----------------------------------------------------------------------------- cost model
def test_rank_correlation_helpers():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=40), rng.normal(size=40)
    b[:5] = b[5]  # ties
    assert spearman(a, a) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    stats = pytest.importorskip("scipy.stats")
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)
    assert kendall_tau(a, b) == pytest.approx(stats.kendalltau(a, b).statistic)


def test_cost_model_ranks_candidates_better_than_chance():
    task = Task(DEFAULT, conv_shape(h=12, icb=2, ocb=4))
    c = cost_model_check(task, n_train=24, n_test=24, seed=3)
    print(f"XGB on knob features, {c['n_train']} -> {c['n_test']} held out: Spearman "
          f"{c['spearman']:.3f}, Kendall {c['kendall']:.3f} (estimate {c['estimate_spearman']:.3f})")
    assert c["spearman"] > 0.3 and c["kendall"] > 0.2
