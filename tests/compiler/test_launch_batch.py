"""Launches of threads running one model, joined into batched simulations
(``dsa_tvm.launch_batch``): the outputs of every input are the single runs' bit for bit,
the groups really are batches, and a member that fails or stalls cannot hang the rest."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm.launch_batch import LaunchBatch, batch_of_this_thread, run_joined
from dsa_tvm.models.quantize import calibration_data
from dsa_tvm.models.zoo import get_model
from dsa_tvm.runtime import take_launches


@pytest.fixture(scope="module")
def model():
    fp32 = get_model("small_cnn", quantized=False)
    ex = tvm.compile(from_onnx(get_model("small_cnn", quantized=True),
                               keep_params_in_input=False), target=dsa_tvm.target("default"))
    xs = [f["input"] for f in calibration_data(fp32, n=5, seed=3)]
    return ex, xs


def _single(ex, xs):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    outs, launches = [], []
    for x in xs:
        take_launches()
        outs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
        launches.append(take_launches())
    return outs, launches


def _threads(ex, feeds, joined, bad=None):
    """One thread per feed, each with its own VM, all members of ``joined``."""
    outs, errors, records = [None] * len(feeds), [None] * len(feeds), [None] * len(feeds)
    ready = threading.Barrier(len(feeds))

    def work(k):
        vm = relax.VirtualMachine(ex, tvm.cpu())
        with joined.member():
            assert batch_of_this_thread() is joined
            ready.wait()
            try:
                outs[k] = vm["main"](tvm.runtime.tensor(feeds[k])).numpy()
                records[k] = take_launches()
            except Exception as e:  # noqa: BLE001 - the test looks at it
                errors[k] = e

    pool = [threading.Thread(target=work, args=(k,)) for k in range(len(feeds))]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in pool), "a member hung"
    return outs, errors, records


def test_joined_launches_are_the_single_runs_bit_for_bit(model):
    ex, xs = model
    want, single = _single(ex, xs)
    joined = LaunchBatch()
    got, errors, records = _threads(ex, xs, joined)
    assert errors == [None] * len(xs)
    ticks = []
    pairs = run_joined(lambda: relax.VirtualMachine(ex, tvm.cpu()),
                       lambda vm, x: vm["main"](tvm.runtime.tensor(x)).numpy(), xs, 3,
                       ticks.append)   # 3 threads for 5 inputs: the last group has two
    assert len(ticks) == len(xs)
    for p, w in zip(pairs, want):
        np.testing.assert_array_equal(p, w)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    per_run = len(single[0])
    assert joined.launches == per_run * len(xs)     # every launch of every input served
    assert joined.batches == per_run                # ... in one batch per program
    for rec, ref in zip(records, single):           # each thread's records are its own
        assert [r.result.batch for r in rec] == [1] * per_run
        assert [r.result.cycles for r in rec] == [r.result.cycles for r in ref]
        for r, s in zip(rec, ref):
            for name in s.outputs:
                np.testing.assert_array_equal(r.outputs[name], s.outputs[name])
    assert batch_of_this_thread() is None           # outside the members: single runs


def test_a_failing_member_leaves_and_the_others_finish(model):
    """One input has the wrong shape: its VM refuses it before any launch; the groups go
    ahead without that member."""
    ex, xs = model
    want, _ = _single(ex, xs[:3])
    feeds = [xs[0], xs[1][:, :1], xs[2]]
    got, errors, _ = _threads(ex, feeds, LaunchBatch())
    assert errors[0] is None and errors[2] is None and errors[1] is not None
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[2], want[2])


def test_run_joined_raises_the_first_error_after_every_thread_stopped(model):
    ex, xs = model

    made = []

    def make_vm():
        made.append(1)
        if len(made) == 2:
            raise RuntimeError("no VM for this thread")
        return relax.VirtualMachine(ex, tvm.cpu())

    with pytest.raises(RuntimeError, match="no VM for this thread"):
        run_joined(make_vm, lambda vm, x: vm["main"](tvm.runtime.tensor(x)).numpy(),
                   xs, 3)
    with pytest.raises(RuntimeError, match="shape"):   # a bad input stops the loop, no hang
        run_joined(lambda: relax.VirtualMachine(ex, tvm.cpu()),
                   lambda vm, x: vm["main"](tvm.runtime.tensor(x)).numpy(),
                   [xs[0], xs[1][:, :1], xs[2], xs[3]], 2)


def test_a_member_that_never_launches_is_reported_not_waited_for_forever(model):
    ex, xs = model
    joined = LaunchBatch(wait_s=1.0)
    stall = threading.Event()

    def idle():
        with joined.member():
            stall.wait(10)

    t = threading.Thread(target=idle)
    t.start()
    time.sleep(0.1)
    try:
        with joined.member():
            with pytest.raises(Exception, match="waited 1 s for the other threads"):
                relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xs[0]))
    finally:
        stall.set()
        t.join()


def test_evaluate_in_batches_reports_what_single_runs_do(tmp_path):
    import onnx

    from dsa_tvm.evaluation import evaluate

    fp32 = get_model("small_cnn", quantized=False)
    onnx.save(fp32, tmp_path / "fp32.onnx")
    onnx.save(get_model("small_cnn", quantized=True), tmp_path / "int8.onnx")
    xs = np.concatenate([f["input"] for f in calibration_data(fp32, n=7, seed=21)])
    np.savez(tmp_path / "data.npz", input=xs)
    kw = dict(reference=tmp_path / "fp32.onnx", workers=1, show_progress=False)
    one = evaluate(tmp_path / "int8.onnx", tmp_path / "data.npz", **kw)
    three = evaluate(tmp_path / "int8.onnx", tmp_path / "data.npz", batch=3, **kw)
    assert three.batch == 3 and "batch 3" in str(three)
    for key in ("cosine_mean", "cosine_min", "top1_agreement", "top5_agreement", "worst"):
        assert getattr(three, key) == getattr(one, key), key
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="batch must be a whole number >= 1"):
            evaluate(tmp_path / "int8.onnx", tmp_path / "data.npz", batch=bad, **kw)


def test_member_threads_see_the_callers_context():
    """Compile options and device conditions are context variables: the member threads
    run in a copy of the caller's context, so they hold there too."""
    import contextvars

    var = contextvars.ContextVar("probe", default="unset")
    token = var.set("caller's")
    try:
        seen = run_joined(lambda: None, lambda vm, i: var.get(), [0, 1, 2], 3)
    finally:
        var.reset(token)
    assert seen == ["caller's"] * 3
