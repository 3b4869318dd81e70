"""An ONNX backend (``onnx.backend.base.Backend``) that compiles with TVM for the DSA.

The convention every ONNX backend follows, so ``onnx.backend.test.BackendTest``
and users' harnesses run against it::

    from dsa_tvm import onnx_backend as backend
    rep = backend.prepare(model, device="CPU", hardware="edge")
    outputs = rep.run([x])                      # or backend.run_model(model, [x])

``prepare`` options: ``target`` ("dsa", the default, or "llvm": TVM's plain CPU
build of the same import), ``hardware`` (preset name, TOML file or
``HardwareConfig``; implies the dsa target), ``shapes`` (input name -> shape, for
symbolic dimensions the DSA should see static), ``quantize`` (calibration data:
the FP32 model is quantized to int8 QDQ with :func:`dsa_tvm.quant.quantize_onnx`
first), ``intake`` (True: take the model through :func:`dsa_tvm.load_onnx` first:
opset upgrade, fixed ``shapes``, onnxslim, the FP32 check; off by default so the ONNX
node suite tests the importer on each op as written). The compile report of the last
``prepare`` is ``rep.compile_report``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
from onnx.backend.base import Backend, BackendRep

import dsa_tvm

from .frontend.intake import load_onnx
from .quant import quantize_onnx
from .target import is_dsa

DEVICES = ("CPU",)  # DSA regions run on the bundled simulator, launched from the host


def import_onnx(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None):
    """The Relax module of ``model`` (weights as constants, as the DSA patterns need).

    The one place the backend imports a model: swap in another intake here."""
    from tvm.relax.frontend.onnx import from_onnx

    return from_onnx(model, shape_dict=dict(shapes) if shapes else None,
                     keep_params_in_input=False)


def graph_inputs(model: onnx.ModelProto) -> list[str]:
    """The inputs a caller feeds: graph inputs that are not initializers, in order."""
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _to_numpy(value: Any) -> Any:
    """A VM result as numpy: tensors to arrays, tuples (ONNX sequences) to lists."""
    import tvm

    if isinstance(value, tvm.runtime.Tensor):
        return value.numpy()
    if isinstance(value, tvm.runtime.ShapeTuple):
        return np.array(list(value), np.int64)
    if isinstance(value, (int, float, bool, np.generic)):
        return np.array(value)
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return [_to_numpy(v) for v in value]
    return value


def _to_vm(value: Any) -> Any:
    """A feed as the VM takes it: arrays to tensors, ONNX sequences (lists) to tuples of them."""
    import tvm

    if isinstance(value, (list, tuple)):
        return [_to_vm(v) for v in value]
    if isinstance(value, onnx.TensorProto):
        value = onnx.numpy_helper.to_array(value)
    return tvm.runtime.tensor(np.asarray(value).copy(order="C"))


class DsaBackendRep(BackendRep):
    """A compiled model: ``run(inputs)`` returns the outputs in graph order."""

    def __init__(self, executable, inputs: list[str], outputs: list[str], target: str,
                 compile_report=None):
        import tvm
        from tvm import relax

        self.vm = relax.VirtualMachine(executable, tvm.cpu())
        self.executable = executable
        self.inputs, self.outputs, self.target = inputs, outputs, target
        self.compile_report = compile_report

    def _feeds(self, inputs: Any) -> list[np.ndarray]:
        if isinstance(inputs, Mapping):
            missing = [n for n in self.inputs if n not in inputs]
            if missing:
                raise ValueError(f"missing inputs {missing}; the model takes {self.inputs}")
            return [inputs[n] for n in self.inputs]
        feeds = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
        if len(feeds) != len(self.inputs):
            raise ValueError(f"{len(feeds)} inputs given; the model takes {len(self.inputs)}: "
                             f"{self.inputs}")
        return feeds

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:  # noqa: ARG002

        args = [_to_vm(f) for f in self._feeds(inputs)]
        result = self.vm["main"](*args)
        if len(self.outputs) == 1:
            return (_to_numpy(result),)
        return tuple(_to_numpy(r) for r in result)


class DsaBackend(Backend):
    """ONNX backend: TVM's importer, ``tvm.compile`` for the DSA (or llvm), the Relax VM."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().split(":")[0] in DEVICES

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", target: Any = "dsa",
                hardware: Any = None, shapes: Mapping[str, Sequence[int]] | None = None,
                quantize: Any = None, quant_options: Mapping[str, Any] | None = None,
                intake: bool = False, **kwargs: Any) -> DsaBackendRep:
        """Import and compile ``model``; ``quant_options`` go to ``quantize_onnx``."""
        if kwargs:
            raise TypeError(f"unknown options {sorted(kwargs)}; the DSA backend takes target, "
                            "hardware, shapes, quantize, quant_options and intake")
        if not cls.supports_device(device):
            raise ValueError(f"device '{device}' is not supported: the DSA backend runs on "
                             f"{DEVICES} (DSA regions are simulated from the host)")
        if intake:
            model = load_onnx(model, shapes).model
        if quantize is not None:  # quantize_onnx takes the model through intake itself
            opts = {"show_progress": False, "shapes": shapes, **(quant_options or {})}
            model = quantize_onnx(model, quantize, **opts).model
        return compile_module(import_onnx(model, shapes), model, _target(target, hardware))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)


def compile_module(mod, model: onnx.ModelProto, tgt) -> DsaBackendRep:
    """``tvm.compile`` an imported ``model`` for ``tgt`` (a Target) into a runnable rep."""
    import tvm



    ex = tvm.compile(mod, target=tgt)
    name = "dsa" if is_dsa(tgt) else str(tgt.kind.name)
    rep = DsaBackendRep(ex, graph_inputs(model), [o.name for o in model.graph.output], name)
    if is_dsa(tgt):
        rep.compile_report = dsa_tvm.compile_report(rep.vm)  # this executable's, whatever else compiles
    return rep


def _target(target: Any, hardware: Any):
    """A ``tvm.target.Target``: the DSA with ``hardware``, or what ``target`` names."""
    import tvm


    if hardware is not None:
        if target not in ("dsa", None):
            raise ValueError(f"hardware={hardware!r} describes a DSA, but target={target!r}; "
                             "drop one of them")
        return dsa_tvm.target(hardware)
    if target in ("dsa", None):
        return dsa_tvm.target()
    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


prepare = DsaBackend.prepare
run_model = DsaBackend.run_model
run_node = DsaBackend.run_node
supports_device = DsaBackend.supports_device
