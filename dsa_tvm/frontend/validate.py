"""Reading and checking an ONNX model before anything else touches it.

A truncated download, a graph that reads a tensor nothing defines (a dropped
initializer) or a malformed node otherwise surface deep inside TVM's importer as
``KeyError: 'x_zero_point'`` or a protobuf traceback; here they name the file, the
node and the tensor.
"""

from __future__ import annotations

from pathlib import Path

import onnx


class IntakeError(ValueError):
    """A model intake cannot accept as given; the message names the cause and the fix."""


def read_model(model: onnx.ModelProto | str | Path) -> tuple[onnx.ModelProto, str]:
    """(a private copy of the model, a display name for messages)."""
    if isinstance(model, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        return m, m.graph.name or "the model"
    p = Path(str(model))
    if not p.exists():
        raise FileNotFoundError(f"no ONNX file '{p}'; check the path")
    if p.is_dir():
        raise IntakeError(f"'{p}' is a folder, not an ONNX file; pass the .onnx file itself")
    try:
        m = onnx.load(str(p))
    except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError, external data OSError, ...
        raise IntakeError(f"{p}: cannot be read as ONNX ({type(e).__name__}: {e}); the file is "
                          "truncated, corrupt or not an ONNX model: export or download it again") from e
    if not m.graph.node and not m.graph.output:
        raise IntakeError(f"{p}: holds no graph ({p.stat().st_size} bytes); the file is empty or "
                          "truncated: export or download it again")
    return m, p.name


def check_graph(model: onnx.ModelProto, source: str) -> None:
    """Every node input defined before use (named when not), then ``onnx.checker``."""
    _check_defined(model.graph, set(), source)
    try:  # exporters leave output shapes out; the checker wants them: check an inferred copy
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - an inference failure is not the checker's verdict
        inferred = model
    try:
        onnx.checker.check_model(inferred)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise IntakeError(f"{source}: not a valid ONNX model: {first}") from e


def _check_defined(graph: onnx.GraphProto, outer: set[str], source: str) -> None:
    known = set(outer) | {i.name for i in graph.input} | {i.name for i in graph.initializer}
    known |= {i.values.name for i in graph.sparse_initializer}
    for n in graph.node:
        for t in n.input:
            if t and t not in known:
                what = f"node '{n.name}' ({n.op_type})" if n.name else f"a {n.op_type} node"
                raise IntakeError(
                    f"{source}: {what} reads tensor '{t}', which no initializer, graph input or "
                    "earlier node defines (a missing initializer, or nodes out of order): "
                    "re-export the model")
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                _check_defined(sub, known, source)
        known.update(o for o in n.output if o)
    for o in graph.output:
        if o.name not in known:
            raise IntakeError(f"{source}: graph output '{o.name}' is produced by no node: re-export "
                              "the model")
