"""A scheduled layer in the form the TIR walker reads (``dsa_tvm.codegen.walker``)."""

from __future__ import annotations

from tvm import s_tir


def lower_for_walker(sch: s_tir.Schedule):
    """Compact every scratchpad buffer to its tile and place it under its tile loop."""
    import tvm

    mod = sch.mod
    for p in (tvm.s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
              tvm.s_tir.transform.ConvertBlocksToOpaque(),
              tvm.s_tir.transform.CompactBufferAllocation(),
              tvm.s_tir.transform.LowerMatchBuffer()):
        mod = p(mod)
    return mod["main"]
