"""Relay-style entry points for deploy scripts written for TVM <= 0.19 (which had ``tvm.relay``).

A thin facade over the Relax path, not a second compiler::

    from dsa_tvm import relay, graph_executor
    mod, params = relay.frontend.from_onnx(model, shape_dict)   # dsa_tvm.load_onnx + Relax import
    lib = relay.build(mod, target="dsa", params=params)         # tvm.compile(mod, target=...)
    m = graph_executor.GraphModule(lib["default"](tvm.cpu(0)))  # a relax.VirtualMachine inside
    m.set_input("input", x); m.run(); y = m.get_output(0).numpy()

``lib`` is a ``tvm.runtime.Executable`` (``dsa_tvm.compile_report(lib)`` works); weights
are constants in it, so ``params`` is empty. After ``lib.export_library(path)``, load with
:func:`load_module` to keep ``lib["default"](dev)`` (a module from
``tvm.runtime.load_module`` goes to ``GraphModule`` directly).
"""

from . import build_module, frontend
from .build_module import build, load_module
from .factory import GraphExecutorFactoryModule

__all__ = ["GraphExecutorFactoryModule", "build", "build_module", "frontend", "load_module"]
