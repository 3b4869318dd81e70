"""Weight-only low-bit models (int4 per block of input rows) made readable by TVM's importer.

onnxruntime's weight-only quantizer (``MatMulNBitsQuantizer``, what Olive and
onnxruntime-genai ship) writes one of two forms, and TVM 0.27 imports neither:
``com.microsoft.MatMulNBits`` (packed codes, "operator not supported") and, with
``quant_format=QDQ``, a ``DequantizeLinear`` with ``block_size`` over INT4/UINT4
initializers (it reads 4-bit tensors as one byte a value: "size mismatch"). Intake
rewrites both into what the rest of the stack takes:

- a constant weight dequantized per block (MatMulNBits, a blocked DequantizeLinear)
  becomes its float32 values: still on their grid (a scale and an offset per block of
  input rows), which the quantizer keeps and the DSA's grouped dense finds again
  (``layers.group_grid.find_grid``), so the shipped int4 weights run as shipped;
- a 4-bit DequantizeLinear without blocks (per tensor or per axis) keeps its codes,
  widened to 8-bit integers (the same values; TVM reads those);
- ``com.microsoft.GatherBlockQuantized`` (an int4 embedding table, what the quantizer
  writes when Gather is included) becomes its float32 table and a Gather.

Values are computed as onnxruntime computes them, ``(q - zero_point) * scale`` in float32,
and intake's seeded check runs the rewritten graph against the user's on onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .onnx_graph import drop_unused_initializers
from .validate import IntakeError

MS_DOMAIN = "com.microsoft"
_FOUR_BIT = {TensorProto.INT4: np.int8, TensorProto.UINT4: np.uint8}
_KEPT = " (quantizing keeps the grid: the DSA's grouped dense)"


def _is_nbits(n: onnx.NodeProto) -> bool:
    return n.op_type == "MatMulNBits" and n.domain == MS_DOMAIN


def _is_gather_block(n: onnx.NodeProto) -> bool:
    return n.op_type == "GatherBlockQuantized" and n.domain == MS_DOMAIN


def _attr(n: onnx.NodeProto, name: str, default=None):
    return next((helper.get_attribute_value(a) for a in n.attribute if a.name == name), default)


def _four_bit(t: TensorProto | None) -> bool:
    return t is not None and t.data_type in _FOUR_BIT


def has_weight_only(model: onnx.ModelProto) -> bool:
    """True if ``model`` has a MatMulNBits, a GatherBlockQuantized, a blocked
    DequantizeLinear or 4-bit codes."""
    inits = {t.name: t for t in model.graph.initializer}
    return any(_is_nbits(n) or _is_gather_block(n) or (n.op_type == "DequantizeLinear"
                                and (_attr(n, "block_size", 0) or _four_bit(inits.get(n.input[0]))))
               for n in model.graph.node)


def unpack_weight_only(model: onnx.ModelProto, source: str) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` with MatMulNBits and blocked or 4-bit DequantizeLinear rewritten
    (the module docstring), and one note per kind of rewrite. Raises :class:`IntakeError`
    naming the node when its codes are not constants or its attributes are inconsistent."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    counts: dict[str, list[str]] = {}
    nodes: list[onnx.NodeProto] = []
    for n in out.graph.node:
        label = n.name or n.output[0]
        if _is_nbits(n):
            nodes.extend(_nbits(n, inits, out, source))
            counts.setdefault(f"MatMulNBits ({_attr(n, 'bits', 4)}-bit, blocks of "
                              f"{_attr(n, 'block_size')} input rows) unpacked to a MatMul with its "
                              f"float32 weight on the same grid{_KEPT}", []).append(label)
        elif _is_gather_block(n):
            nodes.append(_gather_block(n, inits, out, source))
            counts.setdefault("GatherBlockQuantized (an int4 table, blocks of "
                              f"{_attr(n, 'block_size', 128)}) folded to a float32 table and "
                              "a Gather", []).append(label)
        elif n.op_type == "DequantizeLinear" and _attr(n, "block_size", 0):
            _fold_blocked(n, inits, out, source)
            counts.setdefault(f"blocked DequantizeLinear (blocks of {_attr(n, 'block_size')}) "
                              f"folded to its float32 values on the same grid{_KEPT}",
                              []).append(label)
        elif n.op_type == "DequantizeLinear" and _four_bit(inits.get(n.input[0])):
            _widen(n, inits, out)
            nodes.append(n)
            counts.setdefault("4-bit DequantizeLinear codes widened to 8-bit integers "
                              "(the same values)", []).append(label)
        else:
            nodes.append(n)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    drop_unused_initializers(out)
    if not any(n.domain == MS_DOMAIN for n in out.graph.node):
        keep = [o for o in out.opset_import if o.domain != MS_DOMAIN]
        del out.opset_import[:]
        out.opset_import.extend(keep)
    notes = [f"{what}: {len(names)} node(s) ({', '.join(names[:3])}"
             f"{', ...' if len(names) > 3 else ''})" for what, names in counts.items()]
    return out, notes


# ----------------------------------------------------------------------------- MatMulNBits
def _const(n: onnx.NodeProto, k: int, inits: dict, source: str, what: str,
           optional: bool = False) -> np.ndarray | None:
    name = n.input[k] if len(n.input) > k else ""
    if not name:
        if optional:
            return None
        raise IntakeError(f"{source}: {n.op_type} '{n.name}' has no {what} (input {k})")
    if name not in inits:
        raise IntakeError(f"{source}: {n.op_type} '{n.name}': its {what} '{name}' is computed, "
                          f"not a constant; intake unpacks constant weights only (fold it with "
                          f"onnxslim or export the weights as initializers)")
    return numpy_helper.to_array(inits[name])


def _unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """``count`` codes per row from bytes holding ``8 // bits`` each, lowest bits first."""
    per = 8 // bits
    b = packed.astype(np.uint8).reshape(packed.shape[0], -1)
    codes = np.stack([(b >> (bits * i)) & ((1 << bits) - 1) for i in range(per)], axis=-1)
    return codes.reshape(b.shape[0], -1)[:, :count].astype(np.int32)


def nbits_weight(n: onnx.NodeProto, inits: dict, source: str = "the model") -> np.ndarray:
    """A MatMulNBits node's weight as float32 [K, N] (what onnxruntime multiplies by)."""
    k_dim, n_dim = _attr(n, "K"), _attr(n, "N")
    bits, block = _attr(n, "bits", 4), _attr(n, "block_size")
    if not isinstance(k_dim, int) or not isinstance(n_dim, int) or k_dim < 1 or n_dim < 1:
        raise IntakeError(f"{source}: MatMulNBits '{n.name}': K={k_dim}, N={n_dim} (both are "
                          f"required positive attributes)")
    if bits not in (2, 4, 8) or not block or block < 16 or block & (block - 1):
        raise IntakeError(f"{source}: MatMulNBits '{n.name}': bits={bits}, block_size={block} "
                          f"(onnxruntime's are 2, 4 or 8 bits and a power-of-two block of at "
                          f"least 16)")
    blocks = -(-k_dim // block)
    packed = _const(n, 1, inits, source, "packed weight")
    if packed.size != n_dim * blocks * block * bits // 8:
        raise IntakeError(f"{source}: MatMulNBits '{n.name}': {packed.size} weight bytes, "
                          f"N={n_dim} x {blocks} blocks x {block * bits // 8} expected")
    q = _unpack_codes(packed.reshape(n_dim, -1), bits, blocks * block)[:, :k_dim]
    scales = _const(n, 2, inits, source, "scales").astype(np.float32)
    zp = _const(n, 3, inits, source, "zero points", optional=True)
    zp_size = (n_dim * blocks if zp is None or np.issubdtype(zp.dtype, np.floating)
               else n_dim * -(-blocks * bits // 8))
    for what, a, size in (("scales", scales, n_dim * blocks), ("zero points", zp, zp_size)):
        if a is not None and a.size != size:
            raise IntakeError(f"{source}: MatMulNBits '{n.name}': {a.size} {what}, {size} "
                              f"expected (N={n_dim} x {blocks} blocks of {block})")
    scales = scales.reshape(n_dim, blocks)
    if len(n.input) > 4 and n.input[4]:
        raise IntakeError(f"{source}: MatMulNBits '{n.name}' has a g_idx (GPTQ's act-order "
                          f"block map): not supported (onnxruntime's CPU kernel does not compute "
                          f"what its schema says for it); export without act-order "
                          f"(desc_act=False, no g_idx input)")
    group = np.arange(k_dim) // block
    if zp is None:
        zeros = np.full((n_dim, blocks), 1 << (bits - 1), np.float32)
    elif np.issubdtype(zp.dtype, np.floating):
        zeros = zp.astype(np.float32).reshape(n_dim, blocks)
    else:
        zeros = _unpack_codes(zp.reshape(n_dim, -1), bits, blocks).astype(np.float32)
    w = (q.astype(np.float32) - zeros[:, group]) * scales[:, group]
    return _finite(np.ascontiguousarray(w.T.astype(np.float32)), n, source)


def _finite(w: np.ndarray, n: onnx.NodeProto, source: str) -> np.ndarray:
    if not np.isfinite(w).all():
        raise IntakeError(f"{source}: {n.op_type} '{n.name}': {int((~np.isfinite(w)).sum())} of "
                          f"its {w.size} weights are NaN or infinite (its scales or zero points "
                          f"are): fix the quantized model")
    return w


def _nbits(n: onnx.NodeProto, inits: dict, model: onnx.ModelProto,
           source: str) -> list[onnx.NodeProto]:
    w = nbits_weight(n, inits, source)
    name = _new_init(model, inits, f"{n.name or n.output[0]}/W_unpacked", w)
    bias = _const(n, 5, inits, source, "bias", optional=True)
    mm = helper.make_node("MatMul", [n.input[0], name], [n.output[0]], name=n.name)
    if bias is None:
        return [mm]
    if bias.size != w.shape[1]:
        raise IntakeError(f"{source}: MatMulNBits '{n.name}': a bias of {bias.size} values "
                          f"for N={w.shape[1]}")
    mm.output[0] = f"{n.output[0]}/matmul"
    return [mm, helper.make_node("Add", [mm.output[0], n.input[5]], [n.output[0]],
                                 name=f"{n.name}/bias")]


# ----------------------------------------------------------------------------- DequantizeLinear
def _ints(t: TensorProto) -> np.ndarray:
    a = numpy_helper.to_array(t)
    return a.astype(_FOUR_BIT.get(t.data_type, a.dtype))


def _blocked_values(n: onnx.NodeProto, inits: dict, source: str, axis: int, block: int,
                    default_zero: int = 0, scale_input: int = 1) -> np.ndarray:
    """``(q - zero_point) * scale`` of node ``n``'s constant codes (input 0), one scale and
    zero point (inputs ``scale_input`` and the next) per ``block`` entries along ``axis``,
    float32."""
    _const(n, 0, inits, source, "codes")               # a constant, or a named error
    x = _ints(inits[n.input[0]]).astype(np.float32)
    scale = _const(n, scale_input, inits, source, "scale").astype(np.float32)
    zp = _const(n, scale_input + 1, inits, source, "zero point", optional=True)
    axis = axis + x.ndim if axis < 0 else axis
    expect = tuple(-(-d // block) if i == axis else d for i, d in enumerate(x.shape))
    if not 0 <= axis < x.ndim or scale.shape != expect:
        raise IntakeError(f"{source}: {n.op_type} '{n.name}': scale {scale.shape} for codes "
                          f"{x.shape} in blocks of {block} along axis {axis} ({expect} expected)")

    def spread(a: np.ndarray) -> np.ndarray:
        return np.repeat(a, block, axis=axis).take(range(x.shape[axis]), axis=axis)

    zeros = (np.float32(default_zero) if zp is None
             else spread(_ints(inits[n.input[scale_input + 1]]).astype(np.float32)))
    return _finite(((x - zeros) * spread(scale)).astype(np.float32), n, source)


def _fold_blocked(n: onnx.NodeProto, inits: dict, model: onnx.ModelProto, source: str) -> None:
    values = _blocked_values(n, inits, source, _attr(n, "axis", 1), _attr(n, "block_size"))
    model.graph.initializer.append(numpy_helper.from_array(values, n.output[0]))
    inits[n.output[0]] = model.graph.initializer[-1]


def _gather_block(n: onnx.NodeProto, inits: dict, model: onnx.ModelProto,
                  source: str) -> onnx.NodeProto:
    """GatherBlockQuantized (an int4 embedding table): the table dequantized, then a Gather."""
    block, bits = _attr(n, "block_size", 128), _attr(n, "bits", 4)
    codes = inits.get(n.input[0])
    if codes is None or not _four_bit(codes) or bits != 4:
        raise IntakeError(f"{source}: GatherBlockQuantized '{n.name}': intake unpacks INT4 / "
                          f"UINT4 tables held as constants (onnxruntime's quantizer writes "
                          f"those); this one is {'computed' if codes is None else 'packed'} "
                          f"(bits={bits})")
    # no zero points: the middle of the range for unsigned codes, 0 for signed ones
    unsigned = codes.data_type == TensorProto.UINT4
    values = _blocked_values(n, inits, source, _attr(n, "quantize_axis", 1), block,
                             8 if unsigned else 0, scale_input=2)
    name = _new_init(model, inits, f"{n.name or n.output[0]}/table", values)
    return helper.make_node("Gather", [name, n.input[1]], [n.output[0]], name=n.name,
                            axis=_attr(n, "gather_axis", 0))


def _widen(n: onnx.NodeProto, inits: dict, model: onnx.ModelProto) -> None:
    for k in (0, 2):
        if len(n.input) > k and n.input[k] in inits and _four_bit(inits[n.input[k]]):
            n.input[k] = _new_init(model, inits, f"{n.input[k]}/int8", _ints(inits[n.input[k]]))


def _new_init(model: onnx.ModelProto, inits: dict, name: str, value: np.ndarray) -> str:
    while name in inits:
        name += "_"
    model.graph.initializer.append(numpy_helper.from_array(value, name))
    inits[name] = model.graph.initializer[-1]
    return name
