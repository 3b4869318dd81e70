"""``graph_executor`` as old deploy scripts import it (``from tvm.contrib import graph_executor``
in TVM <= 0.19): ``GraphModule`` over a Relax VM, see :mod:`dsa_tvm.relay.graph_module`."""

from .relay.graph_module import GraphModule

__all__ = ["GraphModule"]
