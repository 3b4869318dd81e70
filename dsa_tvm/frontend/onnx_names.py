"""Keep each ONNX node's name on the Relax ops it becomes, so reports can name it.

TVM 0.27's ``from_onnx`` drops node names: converters return nested expressions
that the BlockBuilder flattens into anonymous ``lv`` bindings without spans, so a
HardSwish left on the CPU shows up as four unrelated ops (add, clip, divide,
multiply). :func:`install` wraps the importer's per-node conversion: every call a
converter returns is rebuilt with a ``Span`` whose source name is the ONNX node
name (inner calls bound first, so the flattening keeps them). Spans do not take
part in structural equality or codegen; the graph is otherwise unchanged.
"""

from __future__ import annotations

_installed = False


def node_name(expr) -> str:
    """The ONNX node an expression came from ("" when unknown)."""
    span = getattr(expr, "span", None)
    src = getattr(span, "source_name", None) if span is not None else None
    return str(src.name) if src is not None else ""


def named(bb, call, name: str):
    """``call`` normalized by ``bb`` and stamped with ONNX node ``name`` (for rewrites that
    replace an imported op by new ones: the report keeps naming the node)."""
    import tvm
    from tvm import relax

    n = bb.normalize(call)
    if not name or not isinstance(n, relax.Call):
        return n
    span = tvm.ir.Span(tvm.ir.SourceName(name), 0, 0, 0, 0)
    return relax.Call(n.op, n.args, n.attrs, n.ty_args, span, ret_ty=n.ty)


def install() -> None:
    """Wrap ``ONNXGraphImporter._convert_operator`` once (idempotent)."""
    global _installed
    if _installed:
        return
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as frontend

    importer = getattr(frontend, "ONNXGraphImporter", None)
    if importer is None or not hasattr(frontend, "_get_convert_map"):
        return  # another TVM: names stay unknown, nothing else changes
    original = importer._convert_operator

    def convert(self, op_name, inputs, attrs, opset):
        converters = frontend._get_convert_map()
        name = attrs.get("tvm_custom", {}).get("name") if isinstance(attrs, dict) else None
        if op_name not in converters or not name:
            return original(self, op_name, inputs, attrs, opset)
        sym = converters[op_name].get_converter(opset)(self.bb, inputs, attrs,
                                                       [self._nodes, self._params])
        if not isinstance(sym, relax.Call):
            return self.bb.normalize(sym) if isinstance(sym, relax.Expr) else sym
        span = tvm.ir.Span(tvm.ir.SourceName(str(name)), 0, 0, 0, 0)

        def stamp(e, root: bool = False):
            if not isinstance(e, relax.Call) or e.span is not None:
                return e
            n = self.bb.normalize(relax.Call(e.op, [stamp(a) for a in e.args], e.attrs,
                                             e.ty_args))
            if isinstance(n, relax.Call):  # rebuilt typed, so normalizing keeps the span
                n = relax.Call(n.op, n.args, n.attrs, n.ty_args, span, ret_ty=n.ty)
            return n if root else self.bb.emit(n)

        try:
            return self.bb.normalize(stamp(sym, root=True))
        except Exception:  # noqa: BLE001 - names are a courtesy: never break an import
            return self.bb.normalize(sym)

    importer._convert_operator = convert
    _installed = True
