"""Which node of a traced PyTorch graph is which DSA layer kind.

Small predicates over ``torch.fx`` nodes, kept apart from the rewrite that uses them
(:mod:`.prepare`), so the table of what QAT mirrors reads in one place.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

Modules = dict[str, nn.Module]

CONV_FUNCTIONS = (F.conv2d, torch.conv2d)
LINEAR_FUNCTIONS = (F.linear,)
ADD_FUNCTIONS = (operator.add, operator.iadd, torch.add)
MOVEMENT_MODULES = (nn.Flatten, nn.Identity)
MOVEMENT_FUNCTIONS = (torch.flatten, torch.reshape)
MOVEMENT_METHODS = ("view", "reshape", "flatten", "contiguous")
DROPOUT_MODULES = (nn.Dropout, nn.Dropout2d, nn.AlphaDropout)
DROPOUT_FUNCTIONS = (F.dropout, F.dropout2d)
MATMUL_FUNCTIONS = (torch.matmul, operator.matmul)
SOFTMAX_FUNCTIONS = (F.softmax, torch.softmax)
TRANSPOSE_FUNCTIONS = (torch.permute, torch.transpose)


def module(n: fx.Node, modules: Modules) -> nn.Module | None:
    return modules.get(n.target) if n.op == "call_module" else None


def onnx_op(n: fx.Node, modules: Modules) -> nn.Module | None:
    """The module of a node onnx2torch built with one of its own classes (``OnnxClip``,
    ``OnnxReshape``, ...: matched by class name, so this table needs no onnx2torch)."""
    m = module(n, modules)
    return m if m is not None and type(m).__module__.startswith("onnx2torch.") else None


def onnx_kind(n: fx.Node, modules: Modules) -> str:
    m = onnx_op(n, modules)
    return "" if m is None else type(m).__name__


def is_tensor(n: Any) -> bool:
    """A node whose value (recorded by shape propagation) is one tensor."""
    return isinstance(n, fx.Node) and "tensor_meta" in n.meta and \
        hasattr(n.meta["tensor_meta"], "shape")


def arg(n: fx.Node, i: int, name: str, default: Any = None) -> Any:
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(name, default)


def activation(n: fx.Node, modules: Modules) -> tuple[float, float] | None:
    """The clamp a ReLU / ReLU6 / Hardtanh / clamp node applies, or None if it is none."""
    m = module(n, modules)
    if isinstance(m, nn.ReLU6):
        return (0.0, 6.0)
    if isinstance(m, nn.ReLU):
        return (0.0, float("inf"))
    if isinstance(m, nn.Hardtanh):
        return (float(m.min_val), float(m.max_val))
    if onnx_kind(n, modules) == "OnnxClip":  # ONNX Clip other than ReLU / ReLU6
        lo, hi = m.min_val, m.max_val
        return (float("-inf") if lo is None else float(lo), float("inf") if hi is None
                else float(hi))
    if n.op == "call_function":
        if n.target in (F.relu, torch.relu):
            return (0.0, float("inf"))
        if n.target is F.relu6:
            return (0.0, 6.0)
        if n.target is F.hardtanh:
            return (float(arg(n, 1, "min_val", -1.0)), float(arg(n, 2, "max_val", 1.0)))
    if n.op == "call_method" and n.target == "relu":
        return (0.0, float("inf"))
    return None


def fusable_activation(n: fx.Node, modules: Modules) -> tuple[fx.Node, tuple[float, float]] | None:
    """``n``'s only reader when it is an activation the output stage can clamp (a range
    holding zero: the REQUANT clip works in codes)."""
    if len(n.users) != 1:
        return None
    (u,) = n.users
    act = activation(u, modules)
    if act is None or not act[0] <= 0.0 <= act[1] or u.args[0] is not n:
        return None
    return u, act


def conv_params(n: fx.Node, modules: Modules, attr: Callable[[fx.Node], Any]
                ) -> tuple[torch.Tensor, torch.Tensor | None, dict] | str | None:
    """(weight, bias, conv2d keyword arguments) of a 2-D convolution node; a reason string
    when it is one the DSA layer cannot take; None when it is no convolution."""
    m = module(n, modules)
    if isinstance(m, nn.Conv2d):
        if m.padding_mode != "zeros":
            return f"padding_mode={m.padding_mode!r} (only zero padding)"
        w, b = m.weight, m.bias
        kw = dict(stride=m.stride, padding=m.padding, dilation=m.dilation, groups=m.groups)
    elif n.op == "call_function" and n.target in CONV_FUNCTIONS:
        w, b = attr(arg(n, 1, "weight")), attr(arg(n, 2, "bias"))
        if not isinstance(w, torch.Tensor):
            return "its weight is computed, not a parameter"
        kw = dict(stride=arg(n, 3, "stride", 1), padding=arg(n, 4, "padding", 0),
                  dilation=arg(n, 5, "dilation", 1), groups=arg(n, 6, "groups", 1))
    else:
        return None
    if isinstance(kw["padding"], str):
        return f"padding={kw['padding']!r} (give explicit sizes)"
    groups, cout, cin_g = int(kw["groups"]), w.shape[0], w.shape[1]
    if groups != 1 and not (cin_g == 1 and cout == groups):
        return f"groups={groups} with {cin_g * groups}->{cout} channels (only 1 or depthwise)"
    return w, b, kw


def linear_params(n: fx.Node, modules: Modules, attr: Callable[[fx.Node], Any]
                  ) -> tuple[torch.Tensor, torch.Tensor | None] | str | None:
    m = module(n, modules)
    if isinstance(m, nn.Linear):
        return m.weight, m.bias
    if onnx_kind(n, modules) == "OnnxMatMul" and len(n.args) == 2:  # x @ W, W a constant
        w = attr(n.args[1])
        if isinstance(w, torch.Tensor) and w.dim() == 2:
            return w.t().contiguous(), None
        return None
    if n.op == "call_function" and n.target in LINEAR_FUNCTIONS:
        w, b = attr(arg(n, 1, "weight")), attr(arg(n, 2, "bias"))
        if not isinstance(w, torch.Tensor):
            return "its weight is computed, not a parameter"
        return w, b
    return None


def spatial_mean(n: fx.Node, modules: Modules) -> bool | None:
    """keepdim of a global average pool over H, W (AdaptiveAvgPool2d(1), mean over (2, 3)),
    None if ``n`` is none."""
    m = module(n, modules)
    if isinstance(m, nn.AdaptiveAvgPool2d):
        size = m.output_size
        return True if size in (1, (1, 1), [1, 1]) else None
    if onnx_kind(n, modules).startswith("OnnxGlobalAveragePool"):  # mean over H, W, keepdim
        rank = len(n.args[0].meta["tensor_meta"].shape) if is_tensor(n.args[0]) else 0
        return True if rank == 4 else None
    if n.op == "call_function" and n.target is F.adaptive_avg_pool2d:
        return True if arg(n, 1, "output_size") in (1, (1, 1), [1, 1]) else None
    if (n.op == "call_method" and n.target == "mean") or \
            (n.op == "call_function" and n.target is torch.mean):
        dims = arg(n, 1, "dim")
        rank = len(n.args[0].meta["tensor_meta"].shape) if is_tensor(n.args[0]) else 0
        if rank == 4 and isinstance(dims, (tuple, list)) and \
                sorted(int(d) % 4 for d in dims) == [2, 3]:
            return bool(arg(n, 2, "keepdim", False))
    return None


def is_movement(n: fx.Node, modules: Modules) -> bool:
    """An op that moves int8 values without changing them (zero padding included)."""
    m = module(n, modules)
    if isinstance(m, MOVEMENT_MODULES):
        return True
    if isinstance(m, nn.ZeroPad2d):
        return True
    if isinstance(m, nn.ConstantPad2d):
        return float(m.value) == 0.0
    kind = onnx_kind(n, modules)
    if kind in ("OnnxReshape", "OnnxFlatten"):
        return True
    if kind == "OnnxPadStatic":  # a constant Pad (qat.onnx_fold makes the exporters' so)
        return m.mode == "constant" and float(m.constant_value) == 0.0
    if n.op == "call_function":
        if n.target in MOVEMENT_FUNCTIONS:
            return True
        if n.target is F.pad:
            return arg(n, 2, "mode", "constant") == "constant" and not arg(n, 3, "value", 0)
    return n.op == "call_method" and n.target in MOVEMENT_METHODS


def zero_pad(n: fx.Node, modules: Modules) -> tuple[int, int, int, int] | None:
    """(left, right, top, bottom) of a zero padding of H, W; None if ``n`` is none."""
    m = module(n, modules)
    if isinstance(m, (nn.ZeroPad2d, nn.ConstantPad2d)) and float(m.value) == 0.0:
        return tuple(int(p) for p in m.padding)
    if n.op == "call_function" and n.target is F.pad and is_movement(n, modules):
        pad = [int(p) for p in arg(n, 1, "pad")]
        if len(pad) in (2, 4):
            return tuple(pad + [0, 0])[:4]
    if onnx_kind(n, modules) == "OnnxPadStatic" and is_movement(n, modules):
        pad = [int(p) for p in m.pads]  # torch order: W, H, then C, N; only W, H folds
        if len(pad) in (2, 4, 6, 8) and not any(pad[4:]):
            return tuple(pad + [0, 0])[:4]
    return None


def is_max_pool(n: fx.Node, modules: Modules) -> bool:
    """A max pool: the largest of some values on a grid is on the grid."""
    m = module(n, modules)
    if isinstance(m, nn.MaxPool2d):
        return not m.return_indices
    return n.op == "call_function" and n.target is F.max_pool2d and \
        not arg(n, 6, "return_indices", False)


def is_activation_matmul(n: fx.Node, modules: Modules | None = None) -> bool:
    """``a @ b`` of two computed tensors (attention's ``Q @ K^T``, ``P @ V``), as a
    function, method or ONNX's MatMul; a product with a parameter is a linear layer's
    business."""
    if len(n.args) != 2 or n.kwargs or not all(is_tensor(a) and a.op != "get_attr"
                                               for a in n.args):
        return False
    return (n.op == "call_function" and n.target in MATMUL_FUNCTIONS) or \
        (n.op == "call_method" and n.target == "matmul") or \
        onnx_kind(n, modules or {}) == "OnnxMatMul"


def is_last_axis_softmax(n: fx.Node, modules: Modules) -> bool:
    """A softmax over the last axis (the [norm] unit's row), as a module, function or
    method."""
    m = module(n, modules)
    if isinstance(m, nn.Softmax):
        dim = m.dim
    elif (n.op == "call_function" and n.target in SOFTMAX_FUNCTIONS) or \
            (n.op == "call_method" and n.target == "softmax"):
        dim = arg(n, 1, "dim")
        if n.kwargs.get("dtype") is not None:   # a cast the unit does not make
            return False
    else:
        return False
    src = n.args[0] if n.args else None
    if not isinstance(dim, int) or not is_tensor(src):
        return False
    rank = len(src.meta["tensor_meta"].shape)
    return dim % rank == rank - 1


def is_transpose(n: fx.Node, modules: Modules | None = None) -> bool:
    """A permute / transpose (function, method or ONNX's Transpose): int8 values moved,
    not changed."""
    return (n.op == "call_function" and n.target in TRANSPOSE_FUNCTIONS) or \
        (n.op == "call_method" and n.target in ("permute", "transpose")) or \
        onnx_kind(n, modules or {}) == "OnnxTranspose"


def is_dropout(n: fx.Node, modules: Modules) -> bool:
    m = module(n, modules)
    return isinstance(m, DROPOUT_MODULES) or (n.op == "call_function"
                                              and n.target in DROPOUT_FUNCTIONS)


def is_shape_arithmetic(n: fx.Node, modules: Modules) -> bool:
    """An onnx2torch op computing integers (``Shape -> Gather -> Concat`` of a dynamic
    reshape): no value a layer quantizes, so it is copied as it is, not reported FP32."""
    if onnx_op(n, modules) is None or not is_tensor(n):
        return False
    dtype = n.meta["tensor_meta"].dtype
    return not (dtype.is_floating_point or dtype.is_complex)


def is_add(n: fx.Node, modules: Modules | None = None) -> bool:
    """``a + b`` of two tensors (no scalar), as a function or ONNX's Add."""
    if len(n.args) != 2 or n.kwargs or not all(is_tensor(a) for a in n.args):
        return False
    if n.op == "call_function":
        return n.target in ADD_FUNCTIONS
    m = onnx_op(n, modules or {})
    return type(m).__name__ == "OnnxBinaryMathOperation" and m.math_op_function is torch.add \
        and m.broadcast != 1


def source_name(n: fx.Node) -> str:
    """The name a user knows a node by: the module path (``blocks.0.conv``) for a module
    call or a function reading a module's weight, else the traced node's name."""
    if n.op == "call_module":
        return str(n.target)
    w = arg(n, 1, "weight")
    if n.op == "call_function" and isinstance(w, fx.Node) and w.op == "get_attr":
        return str(w.target).rsplit(".", 1)[0]
    return n.name


def describe(n: fx.Node, modules: Modules) -> str:
    """What a node is, for the report: the module's class or the function's name."""
    m = module(n, modules)
    if m is not None:
        return type(m).__name__
    return getattr(n.target, "__name__", str(n.target))
