"""An ONNX model -> the FP32 ``torch.fx`` module ``prepare`` rewrites (onnx2torch).

QAT trains a PyTorch module; an ONNX model becomes one through onnx2torch, whose
``convert`` builds an ``fx.GraphModule`` of ``torch.nn`` layers (Conv2d, Linear, ReLU6,
BatchNorm2d) and its own modules for the other ops. :mod:`.onnx_fold` then evaluates
the shape arithmetic exporters write (the pads of EfficientNet's "same" convolutions),
so :mod:`.graph` sees constant pads, shapes and weights.

**The torchvision shim.** onnx2torch imports torchvision at import time, for two
converters only (``node_converters/nms.py``: NonMaxSuppression, ``roialign.py``:
RoiAlign). PyPI's torchvision wheels are CUDA builds that cannot load against the CPU
torch pinned here (``operator torchvision::nms does not exist``). When torchvision
cannot be imported, exactly those two modules are registered as empty placeholders
before onnx2torch is imported: the two ops lose their converters (a model with them gets
onnx2torch's own "converter not implemented", turned into a :class:`QatError` naming the
op), and nothing else changes. With a working torchvision the shim is not used.
"""

from __future__ import annotations

import keyword
import re
import sys
import types
from pathlib import Path
from typing import Any

import onnx
import torch
from google.protobuf.message import DecodeError
from torch import fx

from ..frontend.onnx_graph import constants_to_initializers
from .errors import QatError

INSTALL = "pip install --no-deps onnx2torch==1.5.15"
# onnx2torch's converters that import torchvision, and the ops they convert
TORCHVISION_CONVERTERS = {"onnx2torch.node_converters.nms": "NonMaxSuppression",
                          "onnx2torch.node_converters.roialign": "RoiAlign"}
_NOT_IMPLEMENTED = re.compile(r"operation_type='([^']*)', version=(\d+)")


def _torchvision_loads() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or a CUDA build failing to register its ops
        return False
    return True


def onnx2torch() -> types.ModuleType:
    """onnx2torch, imported with the torchvision shim when torchvision cannot load."""
    if "onnx2torch" not in sys.modules and not _torchvision_loads():
        for name in TORCHVISION_CONVERTERS:
            sys.modules.setdefault(name, types.ModuleType(name))
    try:
        import onnx2torch as o2t
    except ModuleNotFoundError as e:
        if e.name != "onnx2torch":
            raise
        raise QatError(f"QAT from ONNX converts the model with onnx2torch, which is not "
                       f"installed; install it without its dependencies (they would pull a "
                       f"CUDA build of torch and torchvision): {INSTALL}") from None
    return o2t


def load(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    """The ONNX model, read from ``model`` when it is a path; a file that is not one is
    a QatError naming it."""
    if isinstance(model, onnx.ModelProto):
        return model
    path = Path(model)
    if not path.is_file():
        raise QatError(f"'{path}' is not a file; pass an ONNX model's path or an "
                       f"onnx.ModelProto")
    try:
        loaded = onnx.load(str(path))
    except (DecodeError, RuntimeWarning, ValueError, OSError) as e:
        why = str(e).splitlines()[0] if str(e) else "protobuf cannot parse it"
        raise QatError(f"'{path}' is not an ONNX model ({why}); pass an .onnx file, or a "
                       f"torch module") from None
    if not loaded.graph.node:
        raise QatError(f"'{path}' holds no ONNX graph (no nodes); pass an .onnx file, or a "
                       f"torch module")
    return loaded


def _placeholder_names(model: onnx.ModelProto) -> bool:
    """Whether the graph inputs can name fx placeholders (then the export keeps them)."""
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    return all(n.isidentifier() and not keyword.iskeyword(n) for n in names)


def _unsupported(e: Exception) -> str:
    m = _NOT_IMPLEMENTED.search(str(e))
    if m is None:
        return f"onnx2torch cannot convert it: {str(e).splitlines()[0]}"
    op, version = m.groups()
    if op in TORCHVISION_CONVERTERS.values() and not _torchvision_loads():
        return (f"onnx2torch converts {op} with torchvision, which does not load against "
                f"this torch; QAT cannot take a model with {op}: cut the model before it "
                f"(run {op} on the host), or install a torchvision built for this torch")
    return (f"onnx2torch has no converter for {op} (opset {version}); replace {op} in the "
            f"model, or write the network as a torch module and prepare that")


def convert(model: onnx.ModelProto | str | Path) -> fx.GraphModule:
    """The FP32 PyTorch module of an ONNX model (an ``onnx.ModelProto`` or an ``.onnx``
    path), constants folded. It is the teacher of distillation: its outputs are the ONNX
    model's (onnxruntime) to float rounding."""
    from .onnx_fold import batch_flatten, fold_constants, inline_sequential, matmul_bias

    proto = constants_to_initializers(load(model))
    o2t = onnx2torch()
    try:
        gm = o2t.convert(proto, save_input_names=_placeholder_names(proto))
    except NotImplementedError as e:
        raise QatError(f"the ONNX model cannot become a torch module: {_unsupported(e)}") \
            from None
    except Exception as e:  # noqa: BLE001 - the converter fails in many ways, all "not convertible"
        raise QatError(f"onnx2torch cannot convert the ONNX model ({type(e).__name__}: "
                       f"{str(e).splitlines()[0] if str(e) else ''}); check it with "
                       f"onnx.checker.check_model") from None
    gm.eval()   # before any run: a batch norm in training mode would move its statistics
    inline_sequential(gm)
    fold_constants(gm)
    matmul_bias(gm)
    example = static_example(proto)
    if example is not None:
        batch_flatten(gm, example)
    # the inputs' static shapes (None: an open dimension), e.g. for an image side
    gm.onnx_input_shapes = None if example is None else [tuple(x.shape) for x in example]
    return gm.eval()


def static_example(model: onnx.ModelProto) -> tuple[torch.Tensor, ...] | None:
    """Zero inputs of the graph's static input shapes (float32), None if a dimension is
    open or an input is not float."""
    inits = {i.name for i in model.graph.initializer}
    out = []
    for i in model.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]
        if t.elem_type != onnx.TensorProto.FLOAT or not all(dims):
            return None
        out.append(torch.zeros(dims))
    return tuple(out) or None


def is_converted(module: Any) -> bool:
    """A module onnx2torch built: ``prepare`` takes its graph as it is (tracing its modules
    again would inline onnx2torch's own, whose forward reads tensor values)."""
    return isinstance(module, fx.GraphModule) and any(
        type(m).__module__.startswith("onnx2torch.") for m in module.modules())
