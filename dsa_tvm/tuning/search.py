"""The search pieces MetaSchedule needs for the DSA space: space generator, postprocessor,
mutator, search strategy.

* :func:`space` — a ``ScheduleFn`` whose function adds the knob sampling of
  ``tir_schedules.kinds.space`` to the task's compute. No schedule rules: the space is
  exactly the knobs.
* :class:`FitsPostproc` — rejects a sampled candidate whose tiles do not fit the
  scratchpads or the instruction fields, so the search discards it before it
  reaches the builder (the builder checks again and names the reason). It also
  drops candidates the analytic estimate puts beyond ``BUDGET`` times the
  default schedule's estimate: tiny tiles mean hundreds of thousands of
  instructions, minutes to lower and never fast (per-instruction fill/drain and
  DMA latency), so measuring them would spend the trial budget on nothing.
  And it drops a candidate of over ``LEAN_FLOOR`` instructions when another one
  is estimated no slower with at most ``1 / LEANER`` of its instructions
  (each room's ``instructions`` on ``tir_schedules.counts``): a tall, thin tile
  can need eight times the instructions of its wide, short twin for the same cycles, and lowering and
  timing a candidate costs time in proportion to its instructions; the leaner
  twin is measured instead. Smaller programs take well under a second to
  measure and are never dropped for this (the estimate misses what tuning is
  for, so the search keeps every setting it can afford).
* :class:`KnobMutator` — changes one decision of a trace: a tile size to a
  neighbouring or a random divisor of its loop, a boolean knob to its other
  value. (The stock mutators only touch decisions that feed particular
  primitives: unroll annotations, thread bindings, compute locations.)
"""

from __future__ import annotations

import random
from functools import lru_cache
from itertools import groupby

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.mutator import PyMutator
from tvm.s_tir.meta_schedule.postproc import PyPostproc

from .task import Task, task_of

#: candidates estimated slower than this many times the default's estimate are not measured
BUDGET = 3.0
#: a candidate is not measured when another one is estimated no slower and its program
#: is at least this many times smaller ...
LEANER = 2.0
#: ... and its own program has more instructions than this (about half a second to lower
#: and time)
LEAN_FLOOR = 4000


@lru_cache(maxsize=256)
def default_estimate(task: Task) -> float:
    from tir_schedules.kinds import kind_of

    return kind_of(task.shape).estimate(task.cfg, task.shape, task.default_knobs())


def _over_budget(task: Task, knobs) -> str | None:
    from tir_schedules.kinds import kind_of

    est = kind_of(task.shape).estimate(task.cfg, task.shape, knobs)
    if est > BUDGET * default_estimate(task):
        return (f"estimated {est:,.0f} cycles, over {BUDGET:g}x the default schedule's "
                f"{default_estimate(task):,.0f}")
    return None


@lru_cache(maxsize=64)
def _leaner_twins(task: Task) -> dict:
    """knobs -> (leaner knobs, their instructions, these knobs' instructions) for every
    fitting candidate within the budget that another such candidate beats in the
    ``LEANER`` sense and that is over ``LEAN_FLOOR`` (see the module docstring)."""
    from tir_schedules.kinds import kind_of

    kind = kind_of(task.shape)
    rows = sorted((kind.estimate(task.cfg, task.shape, k),
                   kind.instructions(task.cfg, task.shape, k), i, k)
                  for i, k in enumerate(within_budget(task)))
    out, best = {}, []
    # the leanest setting estimated no slower; settings of equal estimate compete too
    for _, same in groupby(rows, key=lambda row: row[0]):
        same = list(same)
        best = [min(best + same, key=lambda row: row[1])]
        for _, n, _, k in same:
            if n > LEAN_FLOOR and best[0][1] * LEANER <= n:
                out[k] = (best[0][3], best[0][1], n)
    return out


def reject_reason(task: Task, knobs) -> str | None:
    """None if the search should measure ``knobs``: they fit, are within the budget, and
    no leaner setting is estimated as fast."""
    from tir_schedules.kinds.space import check_knobs

    problem = check_knobs(task.cfg, task.shape, knobs) or _over_budget(task, knobs)
    if problem:
        return problem
    twin = _leaner_twins(task).get(knobs)
    if twin:
        return (f"{twin[2]:,} instructions, where {twin[0]} is estimated no slower with "
                f"{twin[1]:,}")
    return None


def searchable(task: Task) -> list:
    """The knob settings the search may measure (see :func:`reject_reason`)."""
    return [k for k in task.candidates() if reject_reason(task, k) is None]


def within_budget(task: Task) -> list:
    """The knob settings that fit and are within the budget, leaner twins or not (what
    the benchmark enumerates to judge the search, the ``LEANER`` rule included)."""
    return [k for k in task.candidates() if _over_budget(task, k) is None]


def _sample(sch) -> None:
    from tir_schedules.kinds.space import sample_knobs

    sample_knobs(sch, task_of(sch.mod).shape)


def space():
    """The DSA design space generator (knob sampling, the fit check, the knob mutator)."""
    from tvm.s_tir.meta_schedule.space_generator import ScheduleFn

    return ScheduleFn(_sample, sch_rules=[], postprocs=[FitsPostproc()],
                      mutator_probs={KnobMutator(): 1.0})


def strategy(population: int = 96):
    """Evolutionary search sized for DSA spaces (hundreds to a few thousand points)."""
    from tvm.s_tir.meta_schedule.search_strategy import EvolutionarySearch

    return EvolutionarySearch(population_size=population, init_measured_ratio=0.2,
                              init_min_unmeasured=min(50, population // 2),
                              genetic_num_iters=3, genetic_mutate_prob=0.85,
                              genetic_max_fail_count=10, eps_greedy=0.1)


@derived_object
class FitsPostproc(PyPostproc):
    """False (the candidate is dropped) when its knobs do not fit the hardware or are
    far beyond the default's estimate (see the module docstring)."""

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch) -> bool:
        from tir_schedules.kinds.space import knobs_from_mod

        task = task_of(sch.mod)
        return reject_reason(task, knobs_from_mod(sch.mod, task.shape)) is None

    def clone(self):
        return FitsPostproc()


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@derived_object
class KnobMutator(PyMutator):
    """Mutates one sampling decision of a DSA trace (see the module docstring)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.seed, self.calls = seed, 0

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, trace, rand_state=None):
        self.calls += 1
        rng = random.Random(hash((self.seed, int(rand_state or 0), self.calls)))
        sites = [(inst, dec) for inst, dec in trace.decisions.items()
                 if inst.kind.name in ("SamplePerfectTile", "SampleCategorical")]
        if not sites:
            return None
        inst, dec = rng.choice(sites)
        if inst.kind.name == "SampleCategorical":
            n = len(inst.attrs[0])
            new = (int(dec) + rng.randrange(1, n)) % n
        else:
            outer, inner = (int(v) for v in dec)
            divs = _divisors(outer * inner)
            if len(divs) < 2:
                return None
            i = divs.index(inner)
            if rng.random() < 0.5:   # a neighbouring tile size: local refinement
                j = i + rng.choice([-1, 1])
                j = min(max(j, 0), len(divs) - 1)
                if j == i:
                    j = 1 if i == 0 else i - 1
            else:                    # anywhere: escape a local optimum
                j = rng.choice([k for k in range(len(divs)) if k != i])
            new = [outer * inner // divs[j], divs[j]]
        return trace.with_decision(inst, new, remove_postproc=True)

    def clone(self):
        return KnobMutator(self.seed + 1)
