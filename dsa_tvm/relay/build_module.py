"""``relay.build`` and loading a built module back, over ``tvm.compile``.

``build`` is ``tvm.compile(mod, target=...)`` after binding ``params`` and embedding the
input signature (:mod:`.signature`); the ambient ``tvm.transform.PassContext`` applies as
it does to ``tvm.compile``. For a DSA target the compile is the DSA compile (offload,
reports); for ``"llvm"`` it is the plain CPU build, so one script builds both.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import signature
from .factory import GraphExecutorFactoryModule
from .targets import resolve


def build(ir_mod: Any, target: Any = None, target_host: Any = None, *,
          params: Mapping[str, Any] | None = None,
          mod_name: str = "default") -> GraphExecutorFactoryModule:
    """Compile ``ir_mod`` (what ``relay.frontend.from_onnx`` returned) for ``target``.

    ``target``: ``"dsa"``, ``"dsa-edge"`` / ``"dsa-large"``, a ``dsa_tvm.HardwareConfig``
    or TOML path, ``"llvm"`` (flags as in ``"llvm -mcpu=..."`` are converted), a dict or a
    ``tvm.target.Target``. ``params`` (name -> array) are bound into ``main`` as
    constants first. Returns the factory: ``lib[mod_name](dev)``, ``lib.export_library``.
    """
    import tvm

    mod = _as_module(ir_mod)
    tgt = resolve(target, target_host)
    if params:
        mod = _bind(mod, params)
    executable = tvm.compile(signature.attach(mod), target=tgt)
    return GraphExecutorFactoryModule(executable, tgt, mod_name)


def _as_module(ir_mod: Any):
    import tvm
    from tvm import relax

    if isinstance(ir_mod, relax.Function):
        ir_mod = tvm.IRModule({"main": ir_mod})
    if not isinstance(ir_mod, tvm.IRModule):
        raise TypeError(f"relay.build takes the tvm.IRModule that relay.frontend.from_onnx returned, "
                        f"got {type(ir_mod).__name__}: import the model first with "
                        f"mod, params = relay.frontend.from_onnx(model, shape_dict)")
    if "main" not in [gv.name_hint for gv in ir_mod.get_global_vars()]:
        raise ValueError("relay.build needs a Relax function 'main' in the module (the model's entry)")
    return ir_mod


def _bind(mod: Any, params: Mapping[str, Any]):
    from tvm import relax

    names = [str(p.name) for p in mod["main"].params]
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ValueError(f"params name {', '.join(map(repr, unknown))}, which "
                         f"{'is not a parameter' if len(unknown) == 1 else 'are not parameters'} of "
                         f"main (its parameters: {', '.join(names) or 'none'}); pass the dict "
                         f"relay.frontend.from_onnx returned with this module")
    return relax.transform.BindParams("main", dict(params))(mod)


def load_module(path: "str | Path", mod_name: str = "default") -> GraphExecutorFactoryModule:
    """What ``lib.export_library(path)`` wrote, as the factory again (``lib[mod_name](dev)``).

    ``tvm.runtime.load_module(path)`` loads the same file, but TVM modules cannot be given a
    ``"default"`` function from Python: pass that module to ``GraphModule`` directly, or use
    this function and keep the old ``lib["default"](dev)`` line."""
    import tvm

    module = tvm.runtime.load_module(str(path))
    if module.kind != "relax.VMExecutable":
        raise ValueError(f"{path} holds a {module.kind!r} module, not a Relax executable: "
                         f"load what relay.build(...).export_library(path) wrote")
    return GraphExecutorFactoryModule(module, None, mod_name)
