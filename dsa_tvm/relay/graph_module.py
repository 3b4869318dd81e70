"""``graph_executor.GraphModule`` of TVM <= 0.19 over a ``relax.VirtualMachine``.

Old deploy scripts set inputs one by one, run, and read outputs by index; a Relax VM
calls ``main`` with all inputs at once and returns a tensor or a tuple. This class keeps
the inputs until ``run`` calls ``main`` with them in parameter order, and flattens the
result. Errors name the cause and the fix (unknown input, input not set, wrong shape or
dtype, output index out of range) instead of TVM's. ``m.vm`` is the VM, for
``dsa_tvm.run_report(m.vm)`` / ``dsa_tvm.compile_report(m.vm)``. Like the VM it is not
thread-safe: one GraphModule per thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
import tvm_ffi

from . import signature
from .factory import GraphExecutorFactoryModule
from .signature import InputSpec


class GraphModule:
    """``GraphModule(lib["default"](dev))``: set_input, run, get_output on the Relax VM.

    ``module`` may also be the factory, a ``tvm.compile`` result, a module from
    ``tvm.runtime.load_module`` or a ``relax.VirtualMachine`` (``device`` defaults to
    ``tvm.cpu(0)`` where one is needed)."""

    def __init__(self, module: Any, device: Any = None) -> None:
        self.vm = _as_vm(module, device)
        self.signature = signature.read(self.vm)
        self._values: dict[int, Any] = {}
        self._outputs: list[Any] | None = None

    # inputs

    def set_input(self, key: "int | str | None" = None, value: Any = None, **params: Any) -> None:
        """Set input ``key`` (name or index) to ``value`` (numpy array or ``tvm.runtime.Tensor``),
        and every ``name=value`` in ``params``."""
        if key is not None:
            if value is None:
                raise ValueError(f"set_input({key!r}) needs a value: set_input({key!r}, array)")
            self._set(key, value)
        for name, val in params.items():
            self._set(name, val)

    def _set(self, key: "int | str", value: Any) -> None:
        index = self.get_input_index(key)
        self._values[index] = _to_tensor(self.signature.inputs[index], value)

    def get_input_index(self, key: "int | str") -> int:
        """The position of input ``key`` (ONNX or Relax name, or index) in ``main``."""
        inputs = self.signature.inputs
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if 0 <= key < len(inputs):
                return int(key)
            raise ValueError(f"input index {key} is out of range: the model has {len(inputs)} "
                             f"input(s), {self._names()}")
        for i, spec in enumerate(inputs):
            if key in (spec.name, spec.onnx_name):
                return i
        raise ValueError(f"the model has no input {key!r}; its inputs are {self._names()}")

    def _names(self) -> str:
        return ", ".join(s.label for s in self.signature.inputs) or "none"

    def get_num_inputs(self) -> int:
        return len(self.signature.inputs)

    def get_input(self, index: "int | str", out: Any = None):
        """The tensor set for input ``index`` (copied into ``out`` if given)."""
        i = self.get_input_index(index)
        if i not in self._values:
            raise ValueError(f"input {self.signature.inputs[i].label} has not been set: "
                             f"call set_input first")
        return _copy_out(self._values[i], out)

    def get_input_info(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(shapes, dtypes)`` by input name (ONNX names where the model had them)."""
        named = [(s.onnx_name or s.name, s) for s in self.signature.inputs]
        return {n: s.shape for n, s in named}, {n: s.dtype for n, s in named}

    # running

    def run(self, **inputs: Any) -> None:
        """Set ``inputs`` (by name), then run ``main`` on all inputs set so far."""
        if inputs:
            self.set_input(**inputs)
        out = self.vm["main"](*self._arguments("run()"))
        self._outputs = _flatten(out)

    def _arguments(self, what: str) -> list[Any]:
        missing = [s for i, s in enumerate(self.signature.inputs) if i not in self._values]
        if missing:
            labels = ", ".join(s.label for s in missing)
            first = missing[0].onnx_name or missing[0].name
            raise ValueError(f"{what}: input(s) {labels} not set; call set_input({first!r}, array) "
                             f"for each first (the model's inputs: {self._names()})")
        return [self._values[i] for i in range(len(self.signature.inputs))]

    def get_num_outputs(self) -> int:
        if self.signature.num_outputs is not None:
            return self.signature.num_outputs
        if self._outputs is not None:
            return len(self._outputs)
        raise ValueError("the number of outputs is known after the first run() for an executable "
                         "built without relay.build")

    def get_output(self, index: int, out: Any = None):
        """Output ``index`` of the last run, a ``tvm.runtime.Tensor`` (copied into ``out`` if given)."""
        if self._outputs is None:
            raise ValueError("no outputs yet: call run() before get_output()")
        n = len(self._outputs)
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < n:
            raise ValueError(f"output index {index!r} is out of range: the model has {n} output(s), "
                             f"indices 0..{n - 1}")
        return _copy_out(self._outputs[int(index)], out)

    def benchmark(self, device: Any = None, func_name: str = "run", repeat: int = 5, number: int = 5,
                  min_repeat_ms: int | None = None, end_to_end: bool = False, **inputs: Any):
        """Wall-clock time of ``main`` (``tvm.runtime.module.BenchmarkResult``). For DSA regions
        this times the simulator; the simulated cycles are in ``dsa_tvm.run_report(m.vm)``.
        ``end_to_end`` is accepted and ignored: inputs are host tensors either way."""
        if func_name != "run":
            raise ValueError(f"benchmark times run(); func_name={func_name!r} is not supported")
        if inputs:
            self.set_input(**inputs)
        args = self._arguments("benchmark()")
        dev = device if device is not None else tvm.cpu()
        timer = self.vm.time_evaluator("main", dev, number=number, repeat=repeat,
                                       min_repeat_ms=min_repeat_ms or 0)
        return timer(*args)

    def __getitem__(self, key: str):
        """A function of the VM, as the old module's ``m["run"]`` was one of the executor."""
        return self.vm[key]


def _as_vm(module: Any, device: Any):
    from tvm import relax

    dev = device if device is not None else tvm.cpu()
    if isinstance(module, GraphModule):
        return module.vm
    if isinstance(module, relax.VirtualMachine):
        return module
    if isinstance(module, GraphExecutorFactoryModule):
        return module.create(dev)
    if isinstance(module, tvm.runtime.Module) and module.kind != "relax.VMExecutable":
        raise TypeError(f"GraphModule got a {module.kind!r} module, not a Relax executable: pass "
                        f"lib['default'](dev) of what relay.build returned, or a loaded module it exported")
    if isinstance(module, (tvm.runtime.Executable, tvm.runtime.Module)):
        return relax.VirtualMachine(module, dev)
    raise TypeError(f"GraphModule takes lib['default'](dev) of what relay.build returned (or a "
                    f"relax.VirtualMachine, an executable, a loaded module), got {type(module).__name__}")


def _to_tensor(spec: InputSpec, value: Any):
    """``value`` as a CPU tensor of ``spec``'s dtype and shape, or a ValueError saying which differs.

    A numpy array of another float dtype is cast, as the old ``set_input`` did (tutorials
    feed float64 from ``np.random``); any other dtype difference is an error."""
    if isinstance(value, tvm.runtime.Tensor):
        dtype, shape = str(value.dtype), tuple(int(d) for d in value.shape)
        _check(spec, dtype, shape, value)
        return value
    arr = np.asarray(value)
    if spec.dtype and str(arr.dtype) != spec.dtype and np.issubdtype(arr.dtype, np.floating) \
            and _is_float(spec.dtype):
        arr = arr.astype(spec.dtype)
    _check(spec, str(arr.dtype), arr.shape, value)
    return tvm.runtime.tensor(np.ascontiguousarray(arr))


def _is_float(dtype: str) -> bool:
    try:
        return np.issubdtype(np.dtype(dtype), np.floating)
    except TypeError:
        return False


def _check(spec: InputSpec, dtype: str, shape: tuple[int, ...], value: Any) -> None:
    shape_ok = spec.shape is None or (len(shape) == len(spec.shape)
                                      and all(w is None or w == g for w, g in zip(spec.shape, shape)))
    if (spec.dtype is None or dtype == spec.dtype) and shape_ok:
        return
    fix = [] if spec.dtype is None or dtype == spec.dtype else [f"x.astype({spec.dtype!r})"]
    if not shape_ok:
        fix.append(f"an array of shape {spec.describe().split(' ', 1)[1]}")
    raise ValueError(f"input {spec.label} expects {spec.describe()}, got {dtype} "
                     f"{tuple(shape)} ({type(value).__name__}): pass {' and '.join(fix)}")


def _flatten(out: Any) -> list[Any]:
    if isinstance(out, tvm.runtime.Tensor):
        return [out]
    if isinstance(out, (list, tuple, tvm_ffi.Array)):
        return [t for item in out for t in _flatten(item)]
    return [out]


def _copy_out(tensor: Any, out: Any):
    if out is None:
        return tensor
    out.copyfrom(tensor)
    return out
