"""Each layer's attributed cycles split by what claimed them (dsa_tvm.sim.attribution):
the compute engine, only DMA transfers (DRAM wait), or nothing (token wait)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.isa.instructions import Engine
from dsa_tvm.sim.attribution import attribute

from .harness import random_layers, schedule_of


def test_loads_are_dram_wait_and_idle_cycles_token_wait():
    # layer 0: load [0, 10), compute [10, 30); layer 1: load [20, 40) (under layer 0's
    # compute until 30), idle [40, 50), compute [50, 60), store [60, 70)
    s = schedule_of([0, 10, 20, 50, 60], [10, 30, 40, 60, 70],
                  [Engine.LOAD, Engine.COMPUTE, Engine.LOAD, Engine.COMPUTE, Engine.STORE])
    a = attribute(s, [(0, 1), (2, 4)])
    split = [(t.on_compute, t.dram_wait, t.token_wait) for t in a.layers]
    assert split == [(20, 10, 0), (10, 20, 10)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.integers(1, 80), st.sampled_from(list(Engine))),
                min_size=1, max_size=40),
       st.integers(1, 6), st.randoms(use_true_random=False))
def test_the_split_adds_up_to_each_layers_cycles(instrs, n_layers, rnd):
    sched, ranges = random_layers(instrs, n_layers, rnd)
    a = attribute(sched, ranges)
    for t in a.layers:
        assert t.on_compute + t.dram_wait + t.token_wait == t.cycles
        assert min(t.on_compute, t.dram_wait, t.token_wait) >= 0
        assert t.on_compute <= t.compute  # only while one of its instructions computes
    busy = set().union(*(range(s, e) for s, e in zip(sched.start.tolist(), sched.end.tolist())))
    idle = sched.cycles - len(busy)
    assert sum(t.token_wait for t in a.layers) == idle
