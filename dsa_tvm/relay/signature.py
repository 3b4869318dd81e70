"""The input/output signature a graph executor needs, carried inside the executable.

A Relax executable keeps its parameter names but not their shapes or dtypes, and a
module loaded from a file has no IRModule to ask. So that ``set_input`` can check an
array (and name the model's inputs by their ONNX names) in any process,
:func:`attach` adds a Relax function :data:`FUNCTION` returning the signature as JSON,
like ``dsa_compile_id`` carries the compile id; it survives ``export_library`` /
``load_module``. :func:`read` asks a ``VirtualMachine`` for it and falls back to the
VM's parameter names for executables built without it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: the Relax function of a ``relay.build`` executable that returns its signature as JSON
FUNCTION = "dsa_relay_signature"

#: attribute of ``main`` that ``relay.frontend.from_onnx`` sets: the graph inputs' ONNX names
#: (TVM's importer renames e.g. ``input.1`` to ``input_1``; old scripts use the ONNX name)
ONNX_NAMES_ATTR = "onnx_input_names"


@dataclass(frozen=True)
class InputSpec:
    """One parameter of ``main``: its Relax name, its ONNX name, shape (None: any) and dtype."""

    name: str
    onnx_name: str = ""
    shape: tuple[int | None, ...] | None = None
    dtype: str | None = None

    @property
    def label(self) -> str:
        """How errors name it: the ONNX name users wrote, with the Relax one if it differs."""
        if self.onnx_name and self.onnx_name != self.name:
            return f"'{self.onnx_name}' (Relax '{self.name}')"
        return f"'{self.name}'"

    def describe(self) -> str:
        shape = "any shape" if self.shape is None else \
            "(" + ", ".join("?" if d is None else str(d) for d in self.shape) + ")"
        return f"{self.dtype or 'any dtype'} {shape}"


@dataclass(frozen=True)
class Signature:
    """The inputs of ``main`` in call order, and how many tensors it returns (None: unknown)."""

    inputs: tuple[InputSpec, ...]
    num_outputs: int | None


def _type_spec(ty: Any) -> tuple[tuple[int | None, ...] | None, str | None]:
    from tvm import relax, tirx

    if not isinstance(ty, relax.TensorType):
        return None, None
    dtype = str(ty.dtype) if ty.dtype is not None else None
    if ty.shape is None or not hasattr(ty.shape, "values"):
        return (None,) * ty.ndim if ty.ndim >= 0 else None, dtype
    return tuple(int(d.value) if isinstance(d, tirx.IntImm) else None for d in ty.shape.values), dtype


def _count_outputs(ty: Any) -> int:
    from tvm import relax

    if isinstance(ty, relax.TupleType):
        return sum(_count_outputs(f) for f in ty.fields)
    return 1


def of_function(func: Any) -> Signature:
    """The signature of a Relax function (``mod["main"]`` before it is compiled)."""
    attrs = func.attrs if func.attrs is not None else {}
    onnx_names = [str(n) for n in attrs[ONNX_NAMES_ATTR]] if ONNX_NAMES_ATTR in attrs else []
    inputs = []
    for i, param in enumerate(func.params):
        shape, dtype = _type_spec(param.ty)
        onnx_name = onnx_names[i] if i < len(onnx_names) else ""
        inputs.append(InputSpec(str(param.name), onnx_name, shape, dtype))
    return Signature(tuple(inputs), _count_outputs(func.ret_ty))


def attach(mod: Any) -> Any:
    """A copy of ``mod`` with :data:`FUNCTION` returning the signature of its ``main``."""
    from tvm import relax

    sig = of_function(mod["main"])
    text = json.dumps({"inputs": [[s.name, s.onnx_name, None if s.shape is None else list(s.shape),
                                   s.dtype] for s in sig.inputs],
                       "num_outputs": sig.num_outputs})
    out = mod.clone()
    out[FUNCTION] = relax.Function([], relax.expr.String(text)).with_attr("global_symbol", FUNCTION)
    return out


def read(vm: Any) -> Signature:
    """The signature of a ``relax.VirtualMachine``'s ``main``: the embedded one, else the
    parameter names the VM keeps (no shapes or dtypes to check against)."""
    try:
        fn = vm[FUNCTION]
    except AttributeError:
        return _names_only(vm)
    data = json.loads(str(fn()))
    inputs = tuple(InputSpec(name, onnx_name, None if shape is None else tuple(shape), dtype)
                   for name, onnx_name, shape, dtype in data["inputs"])
    return Signature(inputs, data["num_outputs"])


def _names_only(vm: Any) -> Signature:
    try:
        arity = int(vm._get_function_arity("main"))
    except Exception as e:  # noqa: BLE001 - TVM raises its own error types for a missing function
        raise ValueError("this executable has no Relax function 'main' to run: a graph executor "
                         "needs the module relay.build or tvm.compile made from a model") from e
    names = [str(vm._get_function_param_name("main", i)) for i in range(arity)]
    return Signature(tuple(InputSpec(n) for n in names), None)
