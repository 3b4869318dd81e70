"""Constant folding of an onnx2torch graph, so :mod:`.graph` reads constants as constants.

Exporters write shape arithmetic into the graph: EfficientNet's "same" padding is
``Constant -> ConstantOfShape -> Concat -> Reshape -> Slice -> Transpose -> Cast -> Pad``,
and onnx2torch keeps every step as a module (``OnnxConstant``, ``OnnxPadDynamic``, ...).
Every node whose inputs are all constants is evaluated here once and its value becomes a
buffer read by ``get_attr``; a ``Pad`` whose pads are then constant becomes onnx2torch's
``OnnxPadStatic`` (pads as attributes, the form ``graph.zero_pad`` reads and the
export writes as a constant ``Pad``). Values are computed by the modules themselves, so
the folded graph computes what the converted one computed, bit for bit.

Two rewrites put exporters' forms into the ones ``prepare`` mirrors: ``MatMul`` + a
constant bias becomes ``nn.Linear`` (:func:`matmul_bias`), and a ``Reshape`` to a
constant ``[N, -1]`` at the exported batch N becomes ``nn.Flatten(1)``
(:func:`batch_flatten`; a model exported at batch 1 then calibrates and trains on
batches).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import fx


def _called(gm: fx.GraphModule, n: fx.Node) -> torch.nn.Module | None:
    """The module a ``call_module`` node calls (looked up now: the passes replace some)."""
    return gm.get_submodule(str(n.target)) if n.op == "call_module" else None


def _tidy(gm: fx.GraphModule) -> None:
    """Drop the nodes and submodules a rewrite left unused, and regenerate the code."""
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()


def _fetch(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _evaluate(gm: fx.GraphModule, n: fx.Node, consts: dict[fx.Node, Any]) -> Any:
    args = fx.node.map_arg(n.args, lambda a: consts[a])
    kwargs = fx.node.map_arg(n.kwargs, lambda a: consts[a])
    if n.op == "call_module":
        return gm.get_submodule(str(n.target))(*args, **kwargs)
    if n.op == "call_function":
        return n.target(*args, **kwargs)
    return getattr(args[0], str(n.target))(*args[1:], **kwargs)


def constants(gm: fx.GraphModule) -> dict[fx.Node, Any]:
    """The value of every node that reads no graph input (a node that fails to evaluate
    on its constants is left to run)."""
    consts: dict[fx.Node, Any] = {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnx2torch's Slice warns of a torch deprecation
        for n in gm.graph.nodes:
            if n.op == "get_attr":
                consts[n] = _fetch(gm, str(n.target))
            elif n.op in ("call_module", "call_function", "call_method") and \
                    all(a in consts for a in n.all_input_nodes):
                try:
                    consts[n] = _evaluate(gm, n, consts)
                except Exception:  # noqa: BLE001 - left as it is; it runs as converted
                    continue
    return consts


def _static_pads(gm: fx.GraphModule, consts: dict[fx.Node, Any]) -> None:
    """``OnnxPadDynamic(x, pads[, value])`` with constant pads and value -> ``OnnxPadStatic``."""
    from onnx2torch.node_converters.pad import OnnxPadDynamic, OnnxPadStatic, _onnx_padding_to_torch

    for n in gm.graph.nodes:
        m = _called(gm, n)
        if not isinstance(m, OnnxPadDynamic) or m.mode != "constant" or n.kwargs or \
                len(n.args) < 2 or not all(a in consts for a in n.args[1:]):
            continue
        value = consts[n.args[2]] if len(n.args) > 2 else 0.0
        if value is None or (isinstance(value, torch.Tensor) and value.numel() != 1):
            continue
        pads = _onnx_padding_to_torch([int(p) for p in consts[n.args[1]].tolist()])
        static = OnnxPadStatic(pads=pads, mode="constant", constant_value=float(value))
        gm.add_submodule(str(n.target), static)
        n.args = (n.args[0],)


def fold_constants(gm: fx.GraphModule) -> int:
    """Fold ``gm`` in place; returns how many values became buffers."""
    consts = constants(gm)
    _static_pads(gm, consts)
    folded = 0
    for n in list(gm.graph.nodes):
        value = consts.get(n)
        if n.op == "get_attr" or not isinstance(value, torch.Tensor) or \
                all(u in consts for u in n.users):
            continue
        name = f"folded_{folded}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, value.detach().clone())
        with gm.graph.inserting_before(n):
            n.replace_all_uses_with(gm.graph.get_attr(name))
        folded += 1
    _tidy(gm)
    return folded


def batch_flatten(gm: fx.GraphModule, example: tuple[torch.Tensor, ...]) -> int:
    """``Reshape(x, [N, -1])`` with N the batch an exporter wrote as a constant (a classifier's
    flatten, exported at batch N) -> ``nn.Flatten(1)``, so calibration and training can run
    other batch sizes; ``example``: the model inputs at that batch. Returns the count."""
    from torch.fx.passes.shape_prop import ShapeProp

    ShapeProp(gm).propagate(*example)
    count = 0
    for n in gm.graph.nodes:
        m = _called(gm, n)
        if type(m).__name__ != "OnnxReshape" or len(n.args) != 2 or \
                n.args[1].op != "get_attr" or "tensor_meta" not in n.args[0].meta:
            continue
        shape = [int(d) for d in _fetch(gm, str(n.args[1].target)).tolist()]
        dims = list(n.args[0].meta["tensor_meta"].shape)
        rest = 1
        for d in dims[1:]:
            rest *= int(d)
        if len(shape) == 2 and len(dims) >= 2 and shape[0] == dims[0] == example[0].shape[0] \
                and shape[1] in (-1, rest):
            gm.add_submodule(str(n.target), torch.nn.Flatten(1))
            n.args = (n.args[0],)
            count += 1
    _tidy(gm)
    return count


def matmul_bias(gm: fx.GraphModule) -> int:
    """``MatMul(x, W) + b`` with W a constant (K, N) and b a constant (N,) -> ``nn.Linear``
    (what exporters write for a linear layer on a 3-D input, and onnx.helper graphs for any
    layer), so the bias is the layer's int32 bias, not an FP32 add after it. Returns the
    count."""
    count = 0
    for n in list(gm.graph.nodes):
        m = _called(gm, n)
        if type(m).__name__ != "OnnxMatMul" or len(n.args) != 2 or n.args[1].op != "get_attr" \
                or len(n.users) != 1:
            continue
        w = _fetch(gm, str(n.args[1].target))
        (add,) = n.users
        a = _called(gm, add)
        if w.dim() != 2 or type(a).__name__ != "OnnxBinaryMathOperation" or \
                a.math_op_function is not torch.add or a.broadcast == 1 or len(add.args) != 2:
            continue
        other = add.args[1] if add.args[0] is n else add.args[0]
        b = _fetch(gm, str(other.target)) if other.op == "get_attr" else None
        if b is None or b.shape != (w.shape[1],) or add.kwargs:
            continue
        lin = torch.nn.Linear(w.shape[0], w.shape[1])
        with torch.no_grad():
            lin.weight.copy_(w.t())
            lin.bias.copy_(b)
        gm.add_submodule(str(n.target), lin)
        n.args = (n.args[0],)
        add.replace_all_uses_with(n)
        gm.graph.erase_node(add)
        count += 1
    _tidy(gm)
    return count


def inline_sequential(gm: fx.GraphModule) -> int:
    """A call of an ``nn.Sequential`` -> one call per child, in order. onnx2torch writes a
    convolution with asymmetric pads as ``Sequential(OnnxPadStatic, Conv2d)``; inlined, the
    pad folds into the convolution as a ``ZeroPad2d`` does. Returns the count."""
    count = 0
    for n in list(gm.graph.nodes):
        m = _called(gm, n)
        if not isinstance(m, torch.nn.Sequential) or len(n.args) != 1 or n.kwargs or not len(m):
            continue
        x = n.args[0]
        with gm.graph.inserting_before(n):
            for name, _ in m.named_children():
                x = gm.graph.call_module(f"{n.target}.{name}", (x,))
        n.replace_all_uses_with(x)
        gm.graph.erase_node(n)
        count += 1
    gm.recompile()
    return count
