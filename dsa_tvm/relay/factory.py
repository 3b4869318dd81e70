"""What ``relay.build`` returns: the old graph executor factory over a Relax executable.

It *is* a ``tvm.runtime.Executable`` (the class is plain Python), so everything that
takes what ``tvm.compile`` returns takes it too: ``relax.VirtualMachine(lib, dev)``,
``dsa_tvm.compile_report(lib)``, ``lib.export_library(path)``. ``lib["default"](dev)``
gives a ``relax.VirtualMachine`` on ``dev``, which ``graph_executor.GraphModule`` wraps.
There is no graph JSON and no separate params: one file holds code, weights and the
VM bytecode.
"""

from __future__ import annotations

from typing import Any

import tvm

from ..target import is_dsa
from .targets import runs_on_cpu


class GraphExecutorFactoryModule(tvm.runtime.Executable):
    """``relay.build``'s result: ``lib["default"](dev)``, ``export_library``, ``get_lib``."""

    def __init__(self, executable: Any, target: Any = None, mod_name: str = "default") -> None:
        module = executable.mod if isinstance(executable, tvm.runtime.Executable) else executable
        super().__init__(module)
        #: what ``tvm.compile`` returned (or ``load_module`` loaded): for ``compile_report``
        self.executable = executable
        #: the ``tvm.target.Target`` it was built for (None when loaded from a file)
        self.target = target
        self.libmod_name = mod_name

    def __getitem__(self, name: str):
        """``lib[mod_name]`` is the executor constructor; other names are the module's functions."""
        if name == self.libmod_name:
            return self.create
        try:
            return super().__getitem__(name)
        except AttributeError:
            raise AttributeError(f"the built module has no function {name!r}: the graph executor "
                                 f"is lib[{self.libmod_name!r}](dev)") from None

    def create(self, *devices: Any):
        """A ``relax.VirtualMachine`` of this executable on ``devices`` (``tvm.cpu()`` if none)."""
        from tvm import relax

        devs = list(devices) or [tvm.cpu()]
        for dev in devs:
            if not isinstance(dev, tvm.runtime.Device):
                raise TypeError(f"lib[{self.libmod_name!r}](dev) takes a device such as tvm.cpu(0), "
                                f"got {type(dev).__name__}")
            if self.target is not None and runs_on_cpu(self.target) \
                    and dev.dlpack_device_type() != tvm.cpu().dlpack_device_type():
                where = "the DSA, simulated from the host" if is_dsa(self.target) else "the CPU"
                raise ValueError(f"this module was built for {where} and runs on tvm.cpu(0), "
                                 f"not on {dev}: call lib[{self.libmod_name!r}](tvm.cpu(0))")
        return relax.VirtualMachine(self, devs[0] if len(devs) == 1 else devs)

    def get_lib(self) -> tvm.runtime.Module:
        """The runtime module: code, weights and VM bytecode in one (``export_library`` it)."""
        return self.mod

    def get_params(self) -> dict[str, Any]:
        """Always empty: the weights are constants inside the executable, not a side file."""
        return {}

    def get_graph_json(self) -> str:
        raise NotImplementedError(
            "a Relax executable has no graph JSON: lib.export_library(path) writes one file "
            "holding code, weights and the VM bytecode; load it with "
            "dsa_tvm.relay.load_module(path)")

    @property
    def graph_json(self) -> str:
        return self.get_graph_json()
