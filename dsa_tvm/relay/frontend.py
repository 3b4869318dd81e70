"""``relay.frontend.from_onnx`` as TVM <= 0.19 had it, importing into Relax.

The model goes through :func:`dsa_tvm.load_onnx` (validation, QOperator -> QDQ, opset
upgrade, fixed shapes, simplification), as every other entry point of dsa-tvm takes it,
then through TVM's Relax ONNX importer. With ``freeze_params=True`` (the old default)
the weights are constants in ``main``, which is what the DSA partitioner needs, and the
returned params dict is empty; ``relay.build(mod, params=params)`` accepts it unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..frontend.intake import Intake, Shapes, load_onnx
from .signature import ONNX_NAMES_ATTR


def from_onnx(model: Any, shape: Shapes | None = None, dtype: "str | Mapping[str, str]" = "float32",
              opset: int | None = None, freeze_params: bool = True,
              **unsupported: Any) -> tuple[Any, dict[str, Any]]:
    """``(tvm.IRModule, params)`` for an ONNX model (``onnx.ModelProto`` or path).

    ``shape``: the old ``shape_dict``, fixing dynamic input dimensions (static inputs need
    none). ``dtype``: input dtypes, as TVM's Relax importer takes them (the model's own
    dtypes win for a single string). ``freeze_params=False`` keeps the weights as
    parameters of ``main`` and returns them by name, for ``relay.build(..., params=params)``
    to bind again. Old options without a Relax counterpart raise TypeError.
    """
    if unsupported:
        raise TypeError(f"relay.frontend.from_onnx: {', '.join(sorted(unsupported))} "
                        "not supported by the Relax importer behind this facade")
    if not isinstance(model, (str, Path, Intake)) and not hasattr(model, "graph"):
        raise TypeError(f"relay.frontend.from_onnx takes an onnx.ModelProto or a path, "
                        f"got {type(model).__name__}")
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.onnx import from_onnx as relax_from_onnx

    taken = load_onnx(model, shape)
    mod = relax_from_onnx(taken.model, dtype_dict=dtype, opset=opset,
                          keep_params_in_input=not freeze_params)
    params: dict[str, Any] = {}
    if not freeze_params:
        mod, detached = detach_params(mod)
        main = mod["main"]
        weights = list(main.params)[int(main.attrs["num_input"]):]
        params = {str(v.name): t for v, t in zip(weights, detached.get("main", []))}
    inits = {i.name for i in taken.model.graph.initializer}
    names = [vi.name for vi in taken.model.graph.input if vi.name not in inits]
    mod["main"] = mod["main"].with_attr(ONNX_NAMES_ATTR, names)
    return mod, params
