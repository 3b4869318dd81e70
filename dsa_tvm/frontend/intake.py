"""``load_onnx``: an ONNX model as users have it, made ready for quantization and TVM's importer.

Other frameworks export at opset 11, with dynamic batch dimensions and shape
arithmetic (``Shape -> Slice -> Concat -> Reshape``) that TVM's ONNX importer cannot
read (``Reshape requires the input new shape to be Shape``, ``Node Identity cannot
handle ShapeExpr inputs``, ``shape_of expects a tensor input``). Intake, in order:
reads and validates the graph (naming the file, node or tensor at fault), rewrites
QOperator int8 ops into QDQ, unpacks weight-only int4 (``weight_only.py``), upgrades
opsets below 13 with ``onnx.version_converter``, fixes dynamic input dimensions from
``shapes``, simplifies with onnxslim, and checks on one seeded input that the result
computes what the original does. ``quantize``,
``compile``, ``run_model`` and the command line all take models through it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from . import fp32_check
from .qoperator import has_qoperator, to_qdq
from .validate import IntakeError, check_graph, read_model
from .weight_only import has_weight_only, unpack_weight_only

#: the opset intake upgrades to: the first with per-axis Quantize/DequantizeLinear
TARGET_OPSET = 13

#: onnxslim fusions intake leaves out. Conv+BatchNormalization: the quantizer folds batch
#: norms itself and lists them in its summary (TVM's importer reads BatchNormalization).
#: MatMul+Add -> Gemm (with Reshapes around 3-D inputs): the quantizer's outlier split and the
#: DSA's dense-with-bias pattern work on MatMul + Add; a Gemm between Reshapes hides them.
SKIP_FUSIONS = ("FusionConvBN", "FusionConvTransposeBN", "FusionGemm", "FusionGemmMul", "FusionGemmAdd")

Shapes = Mapping[str, "Iterable[int] | str"]


@dataclass
class Intake:
    """The model ready for import, what intake changed (``notes``), and the fixed input shapes."""

    model: onnx.ModelProto
    notes: list[str] = field(default_factory=list)
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    source: str = "the model"

    def __str__(self) -> str:
        return "\n".join(f"intake: {n}" for n in self.notes)


def load_onnx(model: "onnx.ModelProto | str | Path | Intake", shapes: Shapes | None = None,
              simplify: bool = True) -> Intake:
    """Read, validate, upgrade, fix shapes, simplify and check ``model`` (a path or a ModelProto).

    ``shapes``: fixed shapes for inputs with dynamic dimensions, e.g. ``{"x": (1, 3, 48, 320)}``
    (or ``"1x3x48x320"``); every input dimension must end up static. ``simplify=False`` skips
    onnxslim (and so the FP32 check, unless the opset was upgraded). Raises :class:`IntakeError`
    (a ``ValueError``) naming the cause, ``FileNotFoundError`` for a missing file.
    """
    if isinstance(model, Intake):
        if not shapes or all(tuple(_dims(v, k)) == model.input_shapes.get(k) for k, v in shapes.items()):
            return model
        model = model.model
    m, source = read_model(model)
    check_graph(m, source)
    notes: list[str] = []
    given = "the model as given"
    if has_qoperator(m):  # QLinearConv & co: TVM's importer reads only the QDQ form
        m, qnotes = to_qdq(m)
        notes.extend(qnotes)
        given = "the QDQ rewrite of the model"
    reference = m
    unpacked = has_weight_only(m)   # int4 per block: TVM reads neither MatMulNBits nor INT4
    if unpacked:
        m, wnotes = unpack_weight_only(m, source)
        notes.extend(wnotes)
    m, upgraded = _upgrade_opset(m, source, notes)
    fixed = _fix_shapes(m, shapes or {}, source, notes)
    final_shapes = _static_shapes(m, source)
    before = [n.op_type for n in m.graph.node]
    slimmed = _slim(m, source, notes) if simplify else m
    simplified = [n.op_type for n in slimmed.graph.node] != before
    if upgraded or fixed or simplified or unpacked:
        check_graph(slimmed, f"{source} (after intake)")
        _check_fp32((reference, given), m, slimmed, final_shapes, source, notes)
    else:
        what = "accepted as given" if given == "the model as given" else "nothing else changed"
        notes.append(f"{what} (opset >= 13, static shapes, nothing to simplify)")
    return Intake(slimmed, notes, final_shapes, source)


def parse_shape_args(specs: Iterable[str] | None) -> dict[str, tuple[int, ...]]:
    """``["x=1x3x48x320", ...]`` (the ``--shape`` option) -> ``{"x": (1, 3, 48, 320)}``."""
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs or ():
        name, sep, dims = spec.rpartition("=")
        if not sep or not name:
            raise IntakeError(f"--shape '{spec}': expected NAME=DIMS, e.g. x=1x3x48x320")
        out[name] = _dims(dims, name)
    return out


def _dims(value: "Iterable[int] | str", name: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in (value.lower().split("x") if isinstance(value, str) else value))
    except (TypeError, ValueError):
        raise IntakeError(f"shape for input '{name}': {value!r} is not a list of integers "
                          "(e.g. (1, 3, 48, 320) or '1x3x48x320')") from None
    if not dims or any(d <= 0 for d in dims):
        raise IntakeError(f"shape for input '{name}': {value!r} needs positive dimensions")
    return dims


def _default_opset(m: onnx.ModelProto) -> int | None:
    return next((int(o.version) for o in m.opset_import if o.domain in ("", "ai.onnx")), None)


def _upgrade_opset(m: onnx.ModelProto, source: str, notes: list[str]) -> tuple[onnx.ModelProto, bool]:
    v = _default_opset(m)
    newest = onnx.defs.onnx_opset_version()
    if v is not None and v > newest:
        raise IntakeError(f"{source}: opset {v} is newer than the installed onnx supports "
                          f"({newest}): upgrade onnx, or export the model at opset {newest} or lower")
    if v is None or v >= TARGET_OPSET:
        return m, False
    from onnx import version_converter

    try:
        up = version_converter.convert_version(m, TARGET_OPSET)
    except Exception as e:  # noqa: BLE001 - the converter raises RuntimeError with a C++ assertion
        text = str(e)
        reason = text[text.find("No Adapter"):].splitlines()[0] if "No Adapter" in text else text.strip()
        raise IntakeError(f"{source}: opset {v} cannot be upgraded to {TARGET_OPSET} by "
                          f"onnx.version_converter ({reason.replace('$', '')}): export the model at "
                          f"opset {TARGET_OPSET} or newer") from e
    notes.append(f"opset {v} upgraded to {TARGET_OPSET} with onnx.version_converter (per-channel "
                 "int8 weights need QuantizeLinear/DequantizeLinear with an axis, opset 13)")
    return up, True


def _graph_inputs(m: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in m.graph.initializer}
    return [vi for vi in m.graph.input if vi.name not in inits]


def _shape_text(vi: onnx.ValueInfoProto) -> str:
    dims = vi.type.tensor_type.shape.dim
    return "(" + ", ".join(str(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0
                           else (d.dim_param or "?") for d in dims) + ")"


def _fix_shapes(m: onnx.ModelProto, shapes: Shapes, source: str, notes: list[str]) -> bool:
    """Write ``shapes`` into the graph inputs; True if any dimension changed."""
    inputs = {vi.name: vi for vi in _graph_inputs(m)}
    changed = []
    for name, value in shapes.items():
        if name not in inputs:
            raise IntakeError(f"shapes names '{name}', which is not an input of {source} "
                              f"(inputs: {', '.join(inputs) or 'none'})")
        dims = _dims(value, name)
        vi = inputs[name]
        have = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and len(have) != len(dims):
            raise IntakeError(f"shape {dims} for input '{name}' has rank {len(dims)}; the model's "
                              f"input is {_shape_text(vi)}, rank {len(have)}")
        for i, (d, want) in enumerate(zip(have, dims)):
            if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != want:
                raise IntakeError(f"shape {dims} for input '{name}': dimension {i} is fixed to "
                                  f"{d.dim_value} in the model ({_shape_text(vi)})")
        old = _shape_text(vi)
        shape = vi.type.tensor_type.shape
        shape.Clear()
        for want in dims:
            shape.dim.add().dim_value = want
        if old != _shape_text(vi):
            changed.append(f"'{name}' {old} -> {_shape_text(vi)}")
    if changed:
        # shapes inferred from the dynamic input are stale now; inference (onnxslim) redoes them
        del m.graph.value_info[:]
        for o in m.graph.output:
            for d in o.type.tensor_type.shape.dim:
                if not d.HasField("dim_value"):
                    d.Clear()
        notes.append("fixed input shapes: " + ", ".join(changed))
    return bool(changed)


def _static_shapes(m: onnx.ModelProto, source: str) -> dict[str, tuple[int, ...]]:
    out = {}
    for vi in _graph_inputs(m):
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            raise IntakeError(f"{source}: input '{vi.name}' declares no shape: give it one with "
                              f"shapes={{'{vi.name}': (...)}} or --shape {vi.name}=AxBx...")
        dims = list(tt.shape.dim)
        open_ = [i for i, d in enumerate(dims) if not (d.HasField("dim_value") and d.dim_value > 0)]
        if open_:
            # a template to fill in: the batch as 1, every other open dimension by its index
            fill = [str(d.dim_value) if i not in open_ else "1" if i == 0 else f"d{i}"
                    for i, d in enumerate(dims)]
            todo = [f for i, f in enumerate(fill) if i in open_ and f != "1"]
            raise IntakeError(
                f"{source}: input '{vi.name}' {_shape_text(vi)} has dynamic dimension"
                f"{'s' if len(open_) > 1 else ''} {', '.join(map(str, open_))}; the DSA compiles for "
                f"fixed shapes: fix {'them' if len(open_) > 1 else 'it'} with "
                f"shapes={{'{vi.name}': ({', '.join(fill)})}} or --shape {vi.name}={'x'.join(fill)}"
                + (f" ({', '.join(todo)}: the sizes to compile for)" if todo else ""))
        out[vi.name] = tuple(int(d.dim_value) for d in dims)
    return out


def _slim(m: onnx.ModelProto, source: str, notes: list[str]) -> onnx.ModelProto:
    import onnxslim

    copy = onnx.ModelProto()
    copy.CopyFrom(m)
    try:
        out = onnxslim.slim(copy, skip_fusion_patterns=list(SKIP_FUSIONS))
    except Exception as e:  # noqa: BLE001 - a simplifier failure leaves the graph as exported
        notes.append(f"onnxslim could not simplify the graph ({type(e).__name__}: {e}); left as is")
        return m
    before, after = Counter(n.op_type for n in m.graph.node), Counter(n.op_type for n in out.graph.node)
    if before == after:  # nothing folded or fused: keep the user's graph exactly
        return m
    consts = before.pop("Constant", 0) - after.pop("Constant", 0)
    gone = ", ".join(f"{k} x{v}" for k, v in sorted((before - after).items()))
    new = ", ".join(f"{k} x{v}" for k, v in sorted((after - before).items()))
    notes.append(f"onnxslim: {len(m.graph.node)} -> {len(out.graph.node)} nodes (shape arithmetic "
                 f"and constants folded, fusions applied): removed {gone or 'none'}"
                 + (f"; added {new}" if new else "")
                 + (f"; {consts} Constant nodes became initializers" if consts > 0 else ""))
    return out


def _check_fp32(reference: tuple[onnx.ModelProto, str], upgraded: onnx.ModelProto,
                result: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], source: str,
                notes: list[str]) -> None:
    """Compare ``result`` with the model as given (else the upgraded one) on one seeded input."""
    feed = fp32_check.seeded_feed(result, shapes)
    names = [o.name for o in result.graph.output]
    ref, why, against = None, None, reference[1]
    for cand, label in (reference, (upgraded, "the opset-upgraded model")):
        try:
            ref, against = fp32_check.run(cand, feed), label
            break
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
            why = why or f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    if ref is None:
        raise IntakeError(f"{source}: onnxruntime cannot run the model ({why}), so intake cannot check "
                          "that its changes keep the outputs: fix the model, or pass simplify=False")
    try:
        got = fp32_check.run(result, feed)
    except Exception as e:  # noqa: BLE001
        raise IntakeError(f"{source}: the graph intake produced does not run on onnxruntime "
                          f"({type(e).__name__}: {e}); pass simplify=False to use the graph as is") from e
    diff, problem = fp32_check.compare(ref, got, names)
    rule = f"tolerance {fp32_check.RTOL:g} x max(1, max |output|)"
    if problem:
        raise IntakeError(f"{source}: after intake, {problem} against {against} on a seeded input "
                          f"(onnxruntime, optimizations off, {rule}); pass simplify=False to use the "
                          "graph as is")
    notes.append(f"outputs checked against {against} on one seeded input (onnxruntime, "
                 f"optimizations off): max |diff| {diff:.3g}, {rule}")


def add_shape_arg(parser) -> None:
    """The ``--shape NAME=AxBx...`` option (repeatable) of ``run``, ``quantize`` and ``tune``."""
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS",
                        help="fix a dynamic input's shape, e.g. --shape x=1x3x48x320 (repeat per input)")
