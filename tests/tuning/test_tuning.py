"""Autotuning with MetaSchedule: the knob space, measurement, cost model, database, compile.

References are independent of the tuner: cycles a runner reports are compared
with a direct simulation of the same knobs' program; the tuned compile is
compared bit for bit with the integer reference (``tir_schedules.kinds.run_region``); the
rank-correlation helpers with scipy when it is installed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import s_tir

import dsa_tvm
from dsa_tvm.hw.config import load_config
from dsa_tvm.tuning import Task, TunedKnobs, open_database, tune_task, tuned
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
from dsa_tvm.tuning.tuner import commit_knobs, record_knobs, workload_records
from tir_schedules.kinds import kind_of, run_region
from tir_schedules.kinds.conv2d import ConvShape
from tir_schedules.kinds.eltwise import EltwiseShape
from tir_schedules.kinds.global_pool import GlobalSumShape
from tir_schedules.kinds.matmul import MatmulShape
from tir_schedules.kinds.space import check_knobs, knobs_from_mod, perf_shape, sample_knobs
from tir_schedules.kinds.window import WindowShape

from ..compiler.test_lowering import batch_matmul, bias_add, check, conv, qt, region

DEFAULT = load_config("default")
EDGE = load_config("edge")


def conv_shape(h=14, icb=4, ocb=4, k=3, cfg=DEFAULT, **kw) -> ConvShape:
    b = cfg.block_in
    return ConvShape(1, h, h, icb, ocb, k, k, (1, 1), (k // 2,) * 4, (1, 1), b, b, 0, 0,
                     (-128, 127), **kw)


SHAPES = {
    "conv": conv_shape(),
    "window": WindowShape("max", 1, 12, 12, 2, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 16, -128, 0,
                          (-128, 127)),
    "global_sum": GlobalSumShape(1, 49, 4, 16, 0, (-128, 127)),
    "eltwise": EltwiseShape("add", 36, 3, 16, 0, (-128, 127), 1, 1),
    "matmul": MatmulShape(2, 12, 2, 3, 16, 16, 0, (-128, 127)),
}


def sampled(task: Task, knobs=None):
    sch = s_tir.Schedule(task.workload())
    sample_knobs(sch, task.shape, fixed=knobs)
    return sch


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
    if isinstance(shape, (ConvShape, MatmulShape)):
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


# ----------------------------------------------------------------------------- tune + database
@pytest.fixture(scope="module")
def tuned_conv(tmp_path_factory):
    work = tmp_path_factory.mktemp("tune")
    task = Task(DEFAULT, conv_shape(h=14, icb=2, ocb=4))
    db = open_database(work)
    return work, task, tune_task(task, 12, db, work / "task", seed=0)


def test_tune_task_beats_or_keeps_the_default(tuned_conv):
    work, task, r = tuned_conv
    assert r.trials == 12
    assert r.best_cycles <= r.default_cycles
    assert r.best_cycles == measure_knobs(task, r.best_knobs)       # the record is honest
    assert r.default_cycles == measure_knobs(task, r.default_knobs)
    records = workload_records(open_database(work), task)
    assert len(records) >= 8                                           # measured candidates
    # distinct settings (the seed we committed may be measured once more by the search)
    assert len({record_knobs(x, task) for x in records}) >= len(records) - 1
    for rec in (records[0], records[len(records) // 2], records[-1]):  # records are honest
        assert secs_to_cycles(DEFAULT, float(rec.run_secs[0])) == measure_knobs(
            task, record_knobs(rec, task))


def test_database_round_trip(tuned_conv):
    """Reopened from its files, the database gives the same best knobs, also for a layer
    that differs from the task only in zero points and clip bounds."""
    work, task, r = tuned_conv
    lines = (work / "database_tuning_record.json").read_text().splitlines()
    assert all(json.loads(line) for line in lines)
    chooser = TunedKnobs(open_database(work))
    layer_shape = dataclasses.replace(task.shape, input_zp=7, output_zp=-9, clip=(0, 127))
    assert chooser(DEFAULT, layer_shape) == r.best_knobs
    assert chooser(EDGE, conv_shape(cfg=EDGE)) is None                # other hardware: default
    assert (chooser.hits, chooser.misses) == (1, 1)


def test_a_record_of_an_older_knob_space_warns_and_keeps_the_default(tmp_path):
    """A record tuned before the conv room gained ``tile_icb`` replays without that knob:
    the layer takes its default schedule and the user is told to tune again."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord

    from dsa_tvm.tuning.tuner import target_of

    task = Task(DEFAULT, conv_shape(h=14, icb=2, ocb=4))
    mod = task.workload()
    sch = s_tir.Schedule(mod)
    sample_knobs(sch, task.shape, fixed=_non_default(task))
    old = [i for i in sch.trace.insts
           if not (i.kind.name == "Annotate" and "tile_icb" in str(i.attrs))]
    assert len(old) == len(sch.trace.insts) - 1
    trace = s_tir.schedule.Trace(old, {i: d for i, d in sch.trace.decisions.items() if i in old})
    db = open_database(tmp_path)
    db.commit_tuning_record(TuningRecord(trace, db.commit_workload(mod), [1e-6],
                                         target_of(DEFAULT), ArgInfo.from_prim_func(mod["main"])))
    chooser = TunedKnobs(db)
    with pytest.warns(UserWarning, match="tile_icb.*tune again"):
        assert chooser(DEFAULT, task.shape) is None
    assert (chooser.hits, chooser.misses) == (0, 1)


def _non_default(task: Task):
    default = task.default_knobs()
    return next(k for k in task.candidates() if k != default and k.tile_ocb != default.tile_ocb)


@pytest.mark.parametrize("preset", ["default", "edge"])
def test_tuned_region_is_bit_exact(preset, tmp_path):
    """A region compiled with a database record uses its knobs, stays bit-exact against
    the integer reference, and takes the cycles the tuner measured for those knobs."""
    cfg = load_config(preset)
    rng = np.random.default_rng(5)
    x = qt(rng, "x", (1, 2 * cfg.block_in, 10, 10))
    c1 = conv(rng, x, 2 * cfg.block_out, 3, 1, 1, name="c1")
    c2 = conv(rng, c1.output, cfg.block_out, 1, 1, 0, name="c2")
    reg = region([x], [c1, c2])
    from tir_schedules.kinds import recipe

    task = Task(cfg, perf_shape(recipe(c1, cfg).shape))
    knobs = _non_default(task)
    db = open_database(tmp_path)
    commit_knobs(db, task, knobs, measure_knobs(task, knobs))
    chooser = TunedKnobs(open_database(tmp_path))
    res = check(reg, cfg, rng, chooser)
    from dsa_tvm.lowering.region import compile_region

    plans = compile_region(reg, cfg, TunedKnobs(db)).plans
    assert plans[0].knobs == knobs and plans[1].knobs == recipe(c2, cfg).kind.default(
        cfg, recipe(c2, cfg).shape)
    assert (chooser.hits, chooser.misses) == (1, 1)
    one = compile_region(region([x], [c1]), cfg, TunedKnobs(db)).program
    from dsa_tvm.tuning.task import simulate_cycles

    assert simulate_cycles(cfg, one) == measure_knobs(task, knobs)
    assert res.cycles > 0


@pytest.mark.parametrize("preset", ["default", "edge"])
def test_tuned_vector_and_matmul_layers_are_bit_exact(preset, tmp_path):
    """A batch matmul (attention) and a bias add take tuned knobs from the database and
    stay bit-exact; the task's measured cycles are the region's."""
    from dsa_tvm.lowering.region import compile_region
    from dsa_tvm.tuning.api import _tunable
    from dsa_tvm.tuning.task import simulate_cycles
    from tir_schedules.kinds import recipe

    cfg = load_config(preset)
    rng = np.random.default_rng(11)
    a = qt(rng, "a", (2, 12, 2 * cfg.block_in))
    b = qt(rng, "b", (2, 2 * cfg.block_in, 3 * cfg.block_out))
    mm = batch_matmul(rng, a, b)
    ba = bias_add(rng, mm.output)
    db = open_database(tmp_path)
    want = []
    for layer in (mm, ba):
        task = Task(cfg, perf_shape(recipe(layer, cfg).shape))
        assert _tunable(task), task.name
        default = task.default_knobs()
        knobs = next(k for k in task.candidates() if k != default)
        commit_knobs(db, task, knobs, measure_knobs(task, knobs))
        want.append(knobs)
    chooser = TunedKnobs(open_database(tmp_path))
    check(region([a, b], [mm, ba]), cfg, rng, chooser)
    assert (chooser.hits, chooser.misses) == (2, 0)
    assert [p.knobs for p in compile_region(region([a, b], [mm, ba]), cfg,
                                            TunedKnobs(db)).plans] == want
    one = compile_region(region([a, b], [mm]), cfg, TunedKnobs(db))
    assert simulate_cycles(cfg, one.program) == measure_knobs(
        Task(cfg, perf_shape(recipe(mm, cfg).shape)), want[0])


def test_tasks_are_the_layers_the_compiler_lowers(tmp_path):
    """A 3-channel 7x7 stem is lowered as a 1x1 conv over its im2col channels; its task is
    that conv, and the compiler takes the record tuned for it."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    from dsa_tvm.lowering.region import compile_region
    from relay_passes import partition_for_dsa, region_from_function
    from relay_passes.partition import region_functions

    from ..qdq_models import conv_net

    model = conv_net(tmp_path, cin=3, cout=16, hw=32, k=7, stride=2, pad=3)
    mod = from_onnx(onnx.load(str(model)), keep_params_in_input=False)
    tasks, _ = dsa_tvm.tuning.extract_tasks(mod, DEFAULT)
    (task,) = [t for t in tasks if isinstance(t.shape, ConvShape)]
    assert (task.shape.kh, task.shape.kw) == (1, 1)
    assert task.shape.icb == -(-3 * 7 * 7 // DEFAULT.block_in)
    knobs = next(k for k in task.candidates() if k != task.default_knobs())
    db = open_database(tmp_path / "db")
    commit_knobs(db, task, knobs, measure_knobs(task, knobs))
    part, _ = partition_for_dsa(mod, DEFAULT)
    (func,) = [f for _, f in region_functions(part)]
    plans = compile_region(region_from_function(func, "r"), DEFAULT, TunedKnobs(db)).plans
    assert [p.knobs for p in plans if isinstance(p.shape, ConvShape)] == [knobs]


def _compile_with_record(tmp_path, pick):
    """A one-conv model, a database holding one record for its conv (``pick(task)``'s
    knobs), and ``run(ctx)``: compile within ``ctx``, run, check the outputs against the
    integer reference; the launched knobs and the compile report."""
    import onnx
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from dsa_tvm.runtime import register as register_runtime
    from dsa_tvm.runtime import take_launches

    from ..qdq_models import conv_net

    cfg = DEFAULT.replace(cpu_gmacs=0.01)
    model = onnx.load(str(conv_net(tmp_path, cin=16, cout=32, hw=12)))
    tasks, _ = dsa_tvm.tuning.extract_tasks(from_onnx(model, keep_params_in_input=False), cfg)
    (task,) = [t for t in tasks if isinstance(t.shape, ConvShape)]
    knobs = pick(task)
    commit_knobs(open_database(tmp_path / "db"), task, knobs, measure_knobs(task, knobs))

    def run(ctx) -> tuple[dict, object]:
        with ctx:
            ex = tvm.compile(from_onnx(model, keep_params_in_input=False),
                             target=dsa_tvm.target(cfg))
        report = dsa_tvm.last_compile_report()
        take_launches()
        register_runtime()  # the real dsa.launch (test_partition installs a fake one)
        x = np.random.default_rng(0).normal(size=(1, 16, 12, 12)).astype("float32")
        relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
        (launch,) = take_launches()
        regions = {d.name: d.region for d in report.regions if d.target == "dsa"}
        want = run_region(regions[launch.program.name], launch.inputs)
        for name, got in launch.outputs.items():
            np.testing.assert_array_equal(got, want[name])
        return launch.program.meta["layers"][0]["knobs"], report

    return task, knobs, run


def _faster_than_default(task: Task):
    """The fastest of the settings the estimate likes best other than the default, as fast
    as the default at least (on default the estimate's pick is often the fastest: a tie)."""
    from tir_schedules.kinds import kind_of

    kind = kind_of(task.shape)
    default = task.default_knobs()
    near = sorted(task.candidates(), key=lambda k: kind.estimate(task.cfg, task.shape, k))[:16]
    cycles, _, knobs = min((measure_knobs(task, k), i, k) for i, k in enumerate(near)
                           if k != default)
    assert cycles <= measure_knobs(task, default)
    return knobs


def test_tvm_compile_uses_the_database_in_scope(tmp_path):
    """``with dsa_tvm.tuned(dir): tvm.compile(mod, target=dsa)``: the launched program
    carries the tuned knobs and its outputs match the reference; without it, defaults."""
    from contextlib import nullcontext

    task, knobs, run = _compile_with_record(tmp_path, _faster_than_default)
    got, report = run(tuned(tmp_path / "db"))
    assert got == dataclasses.asdict(knobs)
    assert "tuned schedules for 1 layer(s)" in str(report)
    plain, report = run(nullcontext())
    assert plain == dataclasses.asdict(task.default_knobs())
    assert "schedules" not in str(report)


def test_a_record_slower_in_its_region_keeps_the_default(tmp_path):
    """A record whose schedule makes the region slower (here: the smallest tiles) is not
    used: the region keeps the default schedules and the compile report says why."""
    def slowest(task: Task):
        return min(task.candidates(), key=lambda k: dataclasses.astuple(k))

    task, knobs, run = _compile_with_record(tmp_path, slowest)
    got, report = run(tuned(tmp_path / "db"))
    assert got == dataclasses.asdict(task.default_knobs()) != dataclasses.asdict(knobs)
    (region,) = [d for d in report.regions if d.target == "dsa"]
    assert region.schedules.startswith("default schedules: with the tuned ones for 1 layer(s)")
    assert f"with the defaults {region.dsa_cycles:,}" in region.schedules


# ----------------------------------------------------------------------------- RPC
def _free_port_range(span: int = 20) -> int:
    """The start of ``span`` consecutive ports nobody listens on (checked, best effort)."""
    import random
    import socket

    for _ in range(50):
        start = random.randrange(20000, 60000 - span)
        try:
            socks = []
            for p in range(start, start + span):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return start
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range on loopback")


def test_measurement_over_rpc_tracker_and_two_servers(tmp_path):
    """A tracker and two simulator servers on loopback (subprocesses running this
    worktree's code): both serve sessions, and the RPC runner's cycles equal local
    simulations of the same programs."""
    import os
    import subprocess
    import sys

    from tvm import rpc
    from tvm.rpc.tracker import Tracker
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from dsa_tvm.tuning.rpc import RPCSimRunner, measure_remote, wait_for_servers

    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    base = _free_port_range(60)
    tracker = Tracker("127.0.0.1", port=base, port_end=base + 20, silent=True)
    key = f"dsa-test-{os.getpid()}"
    servers = [subprocess.Popen(
        [sys.executable, "-m", "dsa_tvm.tuning.rpc", "serve", "--tracker",
         f"127.0.0.1:{tracker.port}", "--key", key, "--port", str(base + 20 + 20 * i),
         "--port-end", str(base + 40 + 20 * i)], cwd=root, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    try:
        wait_for_servers("127.0.0.1", tracker.port, key, 2, timeout=240)
        hw = json.dumps(DEFAULT.as_dict(), sort_keys=True)
        task = Task(DEFAULT, conv_shape(h=7, icb=2, ocb=2))
        knobs = task.candidates()[:4]
        progs = [task.program(k).to_bytes(DEFAULT) for k in knobs]
        conn = rpc.connect_tracker("127.0.0.1", tracker.port)
        s1 = conn.request(key, session_timeout=60)
        s2 = conn.request(key, session_timeout=60)   # the second server (the first is busy)
        pids = {measure_remote(s, progs[0], hw)["server"] for s in (s1, s2)}
        assert len(pids) == 2 and os.getpid() not in pids
        del s1, s2
        built = DSABuilder(str(tmp_path)).build(
            [BuilderInput(sampled(task, k).mod, dsa_tvm.target(DEFAULT)) for k in knobs])
        runner = RPCSimRunner("127.0.0.1", tracker.port, key, max_workers=2)
        futures = runner.run([RunnerInput(b.artifact_path, "cpu", []) for b in built])
        got = [f.result() for f in futures]
        assert all(g.error_msg is None for g in got), [g.error_msg for g in got]
        want = [measure_knobs(task, k) for k in knobs]
        assert [secs_to_cycles(DEFAULT, float(g.run_secs[0])) for g in got] == want
        assert set(runner.served) <= pids and sum(runner.served.values()) == len(knobs)
    finally:
        for p in servers:
            p.terminate()
        for p in servers:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        tracker.terminate()


# ----------------------------------------------------------------------------- CLI
def test_cli_tune_prints_the_table_and_fills_the_database(tmp_path, capsys):
    from dsa_tvm.cli import main

    from ..qdq_models import conv_net

    model = conv_net(tmp_path, cin=16, cout=32, hw=8)
    work = tmp_path / "work"
    assert main(["tune", str(model), "--trials", "4", "--work-dir", str(work)]) == 0
    out = capsys.readouterr()
    assert "default cyc" in out.out and "speedup" in out.out and "[1/" in out.err
    rows = [line for line in out.out.splitlines() if line.startswith("conv2d_")]
    assert len(rows) == 1
    default, best, trials = (rows[0].split()[i] for i in (2, 3, 5))
    assert int(best.replace(",", "")) <= int(default.replace(",", "")) and 2 <= int(trials) <= 4
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    tasks, _ = dsa_tvm.tuning.extract_tasks(
        from_onnx(onnx.load(str(model)), keep_params_in_input=False), DEFAULT)
    conv_task = next(t for t in tasks if isinstance(t.shape, ConvShape))
    knobs = TunedKnobs(open_database(work))(DEFAULT, conv_task.shape)
    assert measure_knobs(conv_task, knobs) == int(best.replace(",", ""))
