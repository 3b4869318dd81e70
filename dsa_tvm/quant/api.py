"""``quantize``: FP32 model + calibration data -> int8 QDQ model the DSA offloads.

Steps: name layers, fold batch norms, plan (``plan.py``), calibrate the planned tensors
(``calibrate.py`` + ``observers.py``), turn ranges into scales (shared per scale group,
``qparams.py``), write QuantizeLinear/DequantizeLinear (``insert.py``). Models that are
already QDQ pass through untouched.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from ..frontend.intake import Intake, Shapes, load_onnx
from ..frontend.onnx_graph import Graph, constants_to_initializers, is_qdq, name_nodes, with_shapes
from .calibrate import calibrate
from .checks import check_keep_fp32, check_percentile
from .data import as_feeds, check_num_batches, check_preprocess
from .fold import fold_batch_norms, fold_channel_scales
from .insert import bias_scale_floors, insert_qdq
from .norm_stream import norm_stream
from .observers import METHODS
from .outliers import split_candidates, split_outliers
from .plan import Plan, fp32_reasons, make_plan
from .qparams import ActQuant, activation_qparams, weight_qmax


@dataclass(frozen=True)
class QuantOptions:
    method: str = "minmax"
    per_channel: bool = True
    symmetric_activations: bool = False
    keep_fp32: frozenset[str] = frozenset()
    quantize_adds: bool = True
    percentile: float = 99.999
    bias_correction: bool = True
    split_outliers: bool = True
    quantize_norms: bool = False
    weight_bits: int = 8      # 4: int4 weight codes (W4A8), 8: int8
    wide_tensors: frozenset[str] = frozenset()   # activations quantized to int16
    weight_group: int = 0     # > 0: MatMul weights per group of that many input rows
    wide_weights: frozenset[str] = frozenset()   # grouped MatMuls whose grid takes 8 bits
    keep_grids: bool = True   # MatMul weights already on a per-group grid stay as they are


@dataclass
class QuantizedModel:
    """The QDQ model and everything needed to explain or redo it without recalibrating."""

    model: onnx.ModelProto                 # QDQ int8 (or the input, when it already was QDQ)
    fp32: onnx.ModelProto                  # the FP32 reference the QDQ model was made from (BN folded)
    options: QuantOptions
    plan: Plan | None = None
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # tensor -> observed range
    qparams: dict[str, ActQuant] = field(default_factory=dict)           # group root -> int8 qparams
    folded_bn: list[str] = field(default_factory=list)
    passthrough: bool = False
    input_means: dict[str, np.ndarray] = field(default_factory=dict)     # anchor input -> channel means
    side_path: list[str] = field(default_factory=list)                   # FP32 outlier nodes
    intake: list[str] = field(default_factory=list)                      # what intake changed

    def requantize(self, keep_fp32: Iterable[str]) -> QuantizedModel:
        """The same calibration with other layers kept in FP32 (no new calibration run)."""
        if self.passthrough:
            raise ValueError("the model arrived quantized (QDQ); there is nothing to requantize")
        keep = frozenset(keep_fp32)
        check_keep_fp32(keep, (n.name for n in self.fp32.graph.node), self.folded_bn)
        opts = replace(self.options, keep_fp32=keep)
        out = _build(self.fp32, opts, self.ranges, self.folded_bn, self.input_means, self.side_path)
        out.intake = list(self.intake)
        return out

    def to_relax(self):
        """The QDQ model imported into Relax (weights as constants, as the DSA patterns need)."""
        from tvm.relax.frontend.onnx import from_onnx

        return from_onnx(self.model, keep_params_in_input=False)

    def save(self, path: str | Path) -> Path:
        onnx.save(self.model, str(path))
        return Path(path)

    @property
    def quantized_layers(self) -> list[str]:
        return [] if self.plan is None else list(self.plan.anchors)

    @property
    def kept_grids(self) -> list[str]:
        """Weighted MatMuls whose float weight the QDQ model keeps on its per-group grid
        (``keep_grids``; ``weight_group`` rounds the rest onto one)."""
        if self.plan is None or self.options.weight_group:
            return []
        floats = {t.name for t in self.model.graph.initializer
                  if t.data_type == onnx.TensorProto.FLOAT}
        names = set(self.plan.anchors)
        return [n.name for n in self.model.graph.node if n.name in names
                and n.op_type == "MatMul" and n.input[1] in floats]

    def _weights_kind(self) -> str:
        if self.options.weight_group:
            return f"per-{self.options.weight_group}-row-group (MatMul, 1x1 Conv)"
        return "per-channel" if self.options.per_channel else "per-tensor"

    def summary(self) -> str:
        lines = [f"intake: {n}" for n in self.intake]
        if self.passthrough:
            return "\n".join(lines + ["model is already quantized (QDQ): passed through, not re-quantized"])
        p = self.plan
        lines += [f"quantized {len(p.anchors)} weighted layers and {len(p.followers)} other ops "
                 f"({self.options.method}, {self._weights_kind()} "
                 f"int{self.options.weight_bits} weights, "
                 f"{'symmetric' if self.options.symmetric_activations else 'asymmetric'} "
                 f"activations); {len(p.tensors)} activation tensors in "
                 f"{len(p.group_members())} scale groups"]
        if self.folded_bn:
            lines.append(f"folded {len(self.folded_bn)} batch norms and per-channel scales into "
                         f"the layers before them")
        kept = self.kept_grids
        if kept:
            lines.append(f"kept {len(kept)} MatMul weights on their own per-group grid (as "
                         f"shipped; the DSA's grouped dense): {', '.join(kept[:4])}"
                         f"{', ...' if len(kept) > 4 else ''}")
        if self.side_path:
            lines.append(f"split outlier channels off into {len(self.side_path)} FP32 side-path nodes")
        for name, why in sorted(p.kept_fp32.items()):
            if name in self.side_path:
                continue
            lines.append(f"  FP32: {name}: {why}")
        by_reason: dict[tuple[str, str], list[str]] = {}
        for name, (op, why) in fp32_reasons(Graph(self.fp32), p, self.options.quantize_adds).items():
            if name not in self.side_path:
                by_reason.setdefault((op, why), []).append(name)
        for (op, why), names in sorted(by_reason.items()):
            lines.append(f"  FP32: {op} x{len(names)} ({', '.join(names)}): {why}")
        return "\n".join(lines)


def prepare(model: onnx.ModelProto | str | Path | Intake, shapes: Shapes | None = None
            ) -> tuple[onnx.ModelProto, list[str]]:
    """A named, shape-inferred FP32 copy: through intake (opset >= 13, static shapes, constants
    and shape arithmetic folded, zero Pads folded into convolutions by onnxslim), then batch
    norms and per-channel constant scales (layer scale) folded into the layer before them."""
    return _prepare(load_onnx(model, shapes).model)


def _prepare(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    name_nodes(m)
    folded = fold_batch_norms(m) + fold_channel_scales(m)
    return with_shapes(m), folded


def input_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...] | None]:
    g = Graph(model)
    return {n: g.shape(n) for n in g.inputs}


def input_dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    out = {}
    for vi in model.graph.input:
        et = vi.type.tensor_type.elem_type
        out[vi.name] = onnx.helper.tensor_dtype_to_np_dtype(et) if et else np.float32
    return out


def quantize_onnx(model: onnx.ModelProto | str | Path | Intake, calibration_data, method: str = "minmax",
                  per_channel: bool = True, symmetric_activations: bool = False,
                  keep_fp32: Iterable[str] = (), num_batches: int | None = None,
                  preprocess: str | Callable[[np.ndarray], np.ndarray] = "imagenet",
                  quantize_adds: bool = True, percentile: float = 99.999, bias_correction: bool = True,
                  split_outliers: bool = True, show_progress: bool = True,
                  verbose: bool = False, shapes: Shapes | None = None,
                  quantize_norms: bool = False, weight_bits: int = 8,
                  wide_tensors: Iterable[str] = (), weight_group: int = 0,
                  wide_weights: Iterable[str] = (), keep_grids: bool = True,
                  wide_norms: bool = False) -> QuantizedModel:
    """Post-training int8 quantization of an FP32 ONNX model into QDQ form.

    ``calibration_data``: feeds, arrays, an ``.npz`` or a folder of images (see
    :func:`dsa_tvm.quant.data.as_feeds`; images use ``preprocess``). ``method``: minmax,
    percentile, entropy (KL) or mse. Weights: symmetric int8, per output channel unless
    ``per_channel=False``. Activations: asymmetric int8 unless ``symmetric_activations``.
    ``keep_fp32``: node names to leave in FP32. ``num_batches``: use only the first n.
    ``bias_correction``: fold the mean output shift of rounded weights into the biases.
    ``split_outliers``: move outlier channels of dense layers to FP32 side paths (``outliers.py``).
    ``quantize_norms``: Softmax, LayerNormalization and RMSNorm chains int8 in and out, for a
    DSA with ``[norm]`` units (``dsa_tvm.layers.intnorm``); default off: FP32 on the CPU.
    ``weight_bits``: 8, or 4 for W4A8 (per-channel symmetric codes in [-7, 7], kept as int8
    in the QDQ model; a part with ``dram.int4_weights`` stores them two a byte).
    ``wide_tensors``: activations to quantize to symmetric int16 instead (a decoder's
    residual stream: the DSA adds int16 codes, its norms read them, a dense writes them);
    the model is upgraded to opset 21 for their int16 Q/DQ, and each one is kept quantized
    even where no int8 op reads it.
    ``weight_group``: MatMul weights, and pointwise Conv weights (1x1, stride 1, no
    padding, groups 1, whole groups of input channels), on a ``weight_bits``-bit grid per
    group of that many input rows, from each group's minimum to its maximum (GGUF Q4_1's
    ``d * q + min``), left as float32 on the grid (QDQ's int8 codes cannot carry an
    offset per group); the DSA's grouped dense finds the grid again (a conv's with its
    bias corrected for the grid's rounding). ``wide_weights``: MatMul or Conv node names
    whose groups take 8 bits (an LLM's head). Other weighted layers stay per channel.
    ``keep_grids``: a MatMul weight that already lies on such a grid (a weight-only int4
    model: onnxruntime's MatMulNBits or blocked DequantizeLinear, unpacked by intake) stays
    exactly as shipped, whatever ``weight_bits`` says; ``False`` re-rounds it like any other.
    ``wide_norms`` (with ``quantize_norms``): every norm's input and output, and the inputs
    of the residual Add that makes its input, int16 (:mod:`.norm_stream`; a post-norm BERT's
    residual stream, whose outlier features one int8 grid cannot hold).
    ``shapes``: fixed shapes for dynamic inputs, e.g. ``{"x": (1, 3, 48, 320)}``; the model goes
    through :func:`dsa_tvm.load_onnx` first (any opset it can upgrade; notes in ``summary()``).
    """
    if method not in METHODS:
        raise ValueError(f"unknown calibration method '{method}' (choose from {', '.join(METHODS)})")
    check_num_batches(num_batches)
    check_preprocess(preprocess)
    check_percentile(percentile)
    weight_qmax(weight_bits)  # refuses any other width, naming the choices
    if isinstance(weight_group, bool) or not isinstance(weight_group, int) or weight_group < 0:
        raise ValueError(f"weight_group must be a whole number of input rows (0: per channel), "
                         f"got {weight_group!r}")
    if wide_norms and not quantize_norms:
        raise ValueError("wide_norms widens the norms' tensors for the [norm] units: pass "
                         "quantize_norms=True with it (CLI: --quantize-norms --wide-norms)")
    taken = load_onnx(model, shapes)
    src = taken.model
    opts = QuantOptions(method, per_channel, symmetric_activations, frozenset(keep_fp32),
                        quantize_adds, percentile, bias_correction, split_outliers,
                        quantize_norms, weight_bits,
                        frozenset({wide_tensors} if isinstance(wide_tensors, str)
                                  else wide_tensors),   # one name is one tensor
                        weight_group, frozenset({wide_weights} if isinstance(wide_weights, str)
                                                else wide_weights), bool(keep_grids))
    if is_qdq(src):  # intake has rewritten a QOperator model into QDQ already
        if verbose:
            print("dsa-tvm quantize: model is already quantized (QDQ); passing it through",
                  file=sys.stderr)
        return QuantizedModel(src, src, opts, passthrough=True, intake=list(taken.notes))
    fp32, folded = _prepare(src)
    check_keep_fp32(opts.keep_fp32, (n.name for n in fp32.graph.node), folded)
    feeds = as_feeds(calibration_data, input_shapes(fp32), preprocess, num_batches, input_dtypes(fp32))
    side: list[str] = []
    if split_outliers:
        fp32, side = _split_outliers(fp32, feeds, show_progress)
    if wide_norms:
        opts = replace(opts, wide_tensors=opts.wide_tensors | norm_stream(Graph(fp32)))
    unknown = sorted(opts.wide_tensors - {t for n in fp32.graph.node for t in n.output}
                     - {i.name for i in fp32.graph.input})
    if unknown:
        raise ValueError(f"wide_tensors names no tensor of the model: {unknown[:5]}")
    unknown = sorted(opts.wide_weights - {n.name for n in fp32.graph.node
                                          if n.op_type in ("MatMul", "Conv")})
    if unknown:
        raise ValueError(f"wide_weights names no MatMul or Conv node of the model: "
                         f"{unknown[:5]}")
    g = Graph(fp32)
    plan = make_plan(g, opts.keep_fp32 | set(side), None, quantize_adds,
                     quantize_norms=quantize_norms, wide=opts.wide_tensors)
    if not plan.tensors:
        raise ValueError("nothing to quantize: the model has no Conv/Gemm/MatMul with constant weights "
                         f"(kept in FP32: {dict(plan.kept_fp32)})")
    extra = {"percentile": percentile} if method == "percentile" else {}
    mean_axes = {a.node.input[0]: 1 if a.node.op_type in ("Conv", "ConvTranspose") else -1
                 for a in plan.anchors.values()}
    observe = sorted({plan.pre_act[t][0] if t in plan.pre_act else t for t in plan.tensors})
    softmax_in = frozenset(f.inputs[0] for f in plan.followers if f.node.op_type == "Softmax")
    observers, chans = calibrate(fp32, feeds, observe, method, show_progress,
                                 mean_axes if bias_correction else None, softmax_in, **extra)
    ranges = {}
    for t in plan.tensors:
        if t in plan.pre_act:   # clamp the pre-activation range to the activation's bounds
            pre, blo, bhi = plan.pre_act[t]
            lo, hi = observers[pre].range()
            lo, hi = max(lo, blo), min(hi, bhi)
            ranges[t] = (lo, max(lo, hi))
        else:
            ranges[t] = observers[t].range()
    out = _build(fp32, opts, ranges, folded, {t: c.mean() for t, c in chans.items()}, side)
    out.intake = list(taken.notes)
    return out


def quantize_with_ranges(model: onnx.ModelProto | str | Path | Intake,
                         calibrated: QuantizedModel) -> QuantizedModel:
    """``model`` quantized with the ranges of an earlier calibration of a graph with the
    same tensor names (another static-shape bucket of one network: the LLM's prefill and
    decode steps), so a tensor crossing between the graphs (a KV cache) has the same int8
    grid in each. ``calibrated`` must come from :func:`quantize_onnx` without outlier
    side paths (they depend on the graph's data)."""
    if calibrated.side_path:
        raise ValueError("ranges from a calibration with split outliers cannot be reused: "
                         "calibrate with split_outliers=False")
    taken = load_onnx(model)
    fp32, folded = _prepare(taken.model)
    out = _build(fp32, calibrated.options, calibrated.ranges, folded, {}, [])
    out.intake = list(taken.notes)
    return out


def _split_outliers(fp32: onnx.ModelProto, feeds, show_progress: bool
                    ) -> tuple[onnx.ModelProto, list[str]]:
    """A first calibration pass over the dense layers' inputs and outputs, then the split."""
    g = Graph(fp32)
    cands = split_candidates(g)
    if not cands:
        return fp32, []
    axes = {}
    for mm, add in cands:
        axes[mm.input[0]] = -1
        axes[(add or mm).output[0]] = -1
    _, chans = calibrate(fp32, feeds, [], "minmax", show_progress, axes)
    side = split_outliers(fp32, {t: c.absmax for t, c in chans.items()})
    return (with_shapes(fp32), side) if side else (fp32, [])


#: a softmax's int8 output (``quantize_norms``): probabilities 0..255/256 in steps of 1/256,
#: whatever the calibration saw (the [norm] units' natural grid; a calibrated max below 1
#: would clip a sharper row at run time)
SOFTMAX_OUT = ActQuant(1 / 256, -128)
#: a softmax's int16 output (a wide tensor, NORM's ``out_wide``): probabilities in steps of
#: 1 / (127 * 256), zero point 0, so 1.0 is code 32512 and the byte planes that read it
#: (P @ V's int16 operand, ``relay_passes.kinds.matmul_planes``) never saturate
SOFTMAX_OUT_WIDE = ActQuant(1 / (127 * 256), 0, 16)
def attention_operands(g: onnx.GraphProto) -> set[str]:
    """Second inputs of every MatMul of two activations (attention's K^T of Q @ K^T and V
    of P @ V): they get zero point 0, which lets the DSA compute the product from operands
    made on the device (the first operand's zero point is corrected with column sums of
    the second; the second's would need row sums of the first for every row)."""
    consts = {i.name for i in g.initializer} | {
        n.output[0] for n in g.node if n.op_type == "Constant"}
    return {n.input[1] for n in g.node if n.op_type == "MatMul"
            and not consts.intersection(n.input)}


#: int16 QuantizeLinear/DequantizeLinear need opset 21
WIDE_OPSET = 21


def with_opset(model: onnx.ModelProto, version: int,
               fix: str = "quantize without wide_tensors") -> onnx.ModelProto:
    """``model`` at opset ``version`` or newer (onnx.version_converter); ``fix``: the way
    around, for the error when it cannot."""
    have = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if have >= version:
        return model
    from onnx import version_converter

    try:
        out = version_converter.convert_version(model, version)
    except Exception as e:  # noqa: BLE001 - the converter raises RuntimeError from C++
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"int16 (wide) tensors need opset {version}, and onnx.version_"
                         f"converter cannot upgrade this model from opset {have} ({first}): "
                         f"export it at opset {version}, or {fix}"
                         ) from e
    del out.graph.value_info[:]
    # the axes it moves into Constant inputs become initializers the planner reads
    return with_shapes(constants_to_initializers(out))


def _build(fp32: onnx.ModelProto, opts: QuantOptions, ranges: dict[str, tuple[float, float]],
           folded: list[str], means: dict[str, np.ndarray], side: list[str]) -> QuantizedModel:
    if opts.wide_tensors:
        fp32 = with_opset(fp32, WIDE_OPSET)
    g = Graph(fp32)
    plan = make_plan(g, opts.keep_fp32 | set(side), set(ranges), opts.quantize_adds,
                     quantize_norms=opts.quantize_norms, wide=opts.wide_tensors)
    for name in side:
        plan.kept_fp32[name] = "FP32 side path of split outlier channels"
    means = means if opts.bias_correction else None
    floors = bias_scale_floors(fp32, plan, opts.per_channel, means, opts.weight_bits)
    qparams: dict[str, ActQuant] = {}
    softmax_out = {n.output[0] for n in fp32.graph.node if n.op_type == "Softmax"}
    operands = attention_operands(fp32.graph)
    for root, members in plan.group_members().items():
        lo = min(ranges[t][0] for t in members if t in ranges)
        hi = max(ranges[t][1] for t in members if t in ranges)
        floor = max((floors.get(t, 0.0) for t in members), default=0.0)
        symmetric = opts.symmetric_activations or bool(operands.intersection(members))
        bits = 16 if opts.wide_tensors.intersection(members) else 8
        qparams[root] = activation_qparams(lo, hi, symmetric, floor, bits)
        if opts.quantize_norms and softmax_out.intersection(members):
            qparams[root] = SOFTMAX_OUT_WIDE if bits == 16 else SOFTMAX_OUT
    qmodel = insert_qdq(fp32, plan, qparams, opts.per_channel, means, opts.weight_bits,
                        opts.weight_group, opts.wide_weights, opts.keep_grids)
    return QuantizedModel(qmodel, fp32, opts, plan, dict(ranges), qparams, list(folded),
                          input_means=means or {}, side_path=list(side))


def quantize(model, calibration_data=None, **options):
    """``dsa_tvm.quantize``: int8 QDQ Relax module for ``tvm.compile(..., target="dsa")``.

    ``model``: an FP32 ONNX model (path or ModelProto, any opset intake can upgrade; option
    ``shapes`` fixes dynamic inputs), quantized with :func:`quantize_onnx` (options as there)
    and imported into Relax; an FP32 Relax
    module (``dsa_tvm.quant.relax_quantize.quantize_relax``: the same observers and scales,
    calibrated on an LLVM build of the module; options ``method``, ``per_channel``,
    ``symmetric_activations``, ``keep_fp32``, ``num_batches``, ``preprocess``); or a
    Relax module that is already QDQ, returned unchanged.
    """
    import tvm

    if isinstance(model, tvm.IRModule):
        from dsa_tvm.quant.relax_quantize import has_qdq

        if has_qdq(model):
            if options.get("verbose", True):
                print("dsa_tvm.quantize: module is already quantized (QDQ); passing it through",
                      file=sys.stderr)
            return model
        return _quantize_relax_module(model, calibration_data, **options)
    taken = load_onnx(model, options.pop("shapes", None))
    if calibration_data is None and not is_qdq(taken.model):
        raise ValueError("calibration_data is required to quantize an FP32 model")
    return quantize_onnx(taken, calibration_data, **options).to_relax()


def relax_input_shapes(mod) -> dict[str, tuple[int, ...]]:
    """``main``'s parameters by name with their static shapes."""
    return {p.name: tuple(int(d) for d in p.ty.shape) for p in mod["main"].params}


def relax_input_dtypes(mod) -> dict[str, np.dtype]:
    """``main``'s parameters by name with their dtypes: calibration feeds keep them (token
    ids stay int64; a float32 copy is refused by the VM)."""
    return {p.name: np.dtype(str(p.ty.dtype)) for p in mod["main"].params}


def _quantize_relax_module(mod, calibration_data, method: str = "minmax", per_channel: bool = True,
                           symmetric_activations: bool = False, keep_fp32: Iterable[str] = (),
                           num_batches: int | None = None, preprocess="imagenet",
                           show_progress: bool = True, verbose: bool = True, **observer_options):
    from dsa_tvm.quant.relax_quantize import quantize_relax

    if calibration_data is None:
        raise ValueError("calibration_data is required to quantize an FP32 model")
    if method not in METHODS:
        raise ValueError(f"unknown calibration method '{method}' (one of {', '.join(METHODS)})")
    feeds = as_feeds(calibration_data, relax_input_shapes(mod), preprocess, limit=num_batches,
                     dtypes=relax_input_dtypes(mod))
    qmod, plan = quantize_relax(mod, feeds, method, per_channel, symmetric_activations,
                                frozenset(keep_fp32), show_progress, **observer_options)
    if verbose:
        print(f"dsa_tvm.quantize: {len(plan.chains)} layers quantized ({method}), "
              f"{len(plan.kept_fp32)} kept in FP32", file=sys.stderr)
        for (op, why), names in plan.fp32.items():
            shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
            print(f"  FP32: {op} x{len(names)} ({shown}): {why}", file=sys.stderr)
    return qmod
