"""Post-training quantization of an FP32 Relax module into the QDQ form the DSA offloads.

``quantize_relax(mod, feeds)``: canonicalize (Clip as ``R.clip``, constants
folded), plan the chains (:mod:`.relax_plan`), calibrate by running an LLVM
build of ``main`` that also returns every planned tensor, and rewrite ``main``:

* weights -> ``dequantize(int8 const, per-channel scales, axis)``;
* biases -> ``dequantize(int32 const, s_x * s_w)`` (added into the accumulator);
* every planned tensor -> ``dequantize(quantize(t))`` with its group's qparams.

Observers, scales and rounding are ``dsa_tvm.quant``'s (the same the ONNX path uses).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from relay_passes.canonicalize import canonicalize_clip

from .bias_correction import conv_shift, dense_shift
from .calibrate import check_finite, progress
from .checks import check_keep_fp32
from .observers import ChannelMeanObserver, make_observer
from .qparams import (
    ActQuant,
    activation_qparams,
    bias_input_scale_floor,
    bias_qparams,
    bias_weight_scale_floor,
    quantize_bias,
    quantize_weight,
    weight_qparams,
    widen,
)
from .relax_plan import Chain, Plan, anchor_names, make_plan


def prepare_fp32(mod: tvm.IRModule) -> tvm.IRModule:
    """Batch norms folded into the convs before them (or decomposed into per-channel
    constant ops the plan folds), Clip as ``R.clip``/``R.nn.relu``, constants folded."""
    mod = relax.transform.FoldBatchnormToConv2D()(mod)
    mod = relax.transform.DecomposeOpsForInference()(mod)
    mod = relax.transform.FoldConstant()(mod)
    mod = canonicalize_clip(mod)
    mod = relax.transform.FoldConstant()(mod)
    mod = relax.transform.CanonicalizeBindings()(mod)
    mod = relax.transform.DeadCodeElimination()(mod)
    out = tvm.IRModule(dict(mod.functions))
    out["main"] = _UniqueNames(mod).visit_expr(mod["main"])
    return out


@mutator
class _UniqueNames(PyExprMutator):
    """Bindings renamed so every tensor of main has its own name (calibration finds the
    tensors it records by name; importers may repeat ONNX names)."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.seen = {p.name for p in mod["main"].params}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:  # noqa: N802
        value = self.visit_expr(binding.value)
        name = base = binding.var.name
        i = 1
        while name in self.seen:
            name, i = f"{base}_{i}", i + 1
        self.seen.add(name)
        emit = (self.builder_.emit if isinstance(binding.var, relax.DataflowVar)
                else self.builder_.emit_output)
        self.set_var_remap(binding.var, emit(value, name_hint=name))


def has_qdq(mod: tvm.IRModule) -> bool:
    """Whether any Relax function of ``mod`` already quantizes or dequantizes."""
    found = []

    def visit(e) -> None:
        if isinstance(e, relax.Call) and getattr(e.op, "name", "") in ("relax.quantize",
                                                                        "relax.dequantize"):
            found.append(e)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return bool(found)


# ----------------------------------------------------------------------------- calibration
def _observing_module(mod: tvm.IRModule, names: list[str]) -> tvm.IRModule:
    """``main`` returning the tensors ``names`` (by var name) instead of its output."""
    nd = relax.transform.ToNonDataflow()(mod)
    f = nd["main"]
    by_name = {b.var.name: b.var for blk in f.body.blocks for b in blk.bindings}
    by_name.update({p.name: p for p in f.params})
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ValueError(f"calibration: tensors {missing[:5]} are not bound in main")
    body = relax.BlockBuilder().normalize(
        relax.SeqExpr(f.body.blocks, relax.Tuple([by_name[n] for n in names])))
    out = tvm.IRModule(dict(nd.functions))
    out["main"] = relax.Function(f.params, body, attrs=f.attrs)
    return relax.transform.Normalize()(out)


def calibrate(mod: tvm.IRModule, plan: Plan, feeds: list[dict[str, np.ndarray]],
              method: str, show_progress: bool, symmetric: bool = False,
              **observer_options
              ) -> tuple[dict[relax.Var, ActQuant], dict[relax.Var, np.ndarray]]:
    """Run the FP32 graph on ``feeds``; each scale group's qparams (keyed by the group's
    root var) and, per conv/dense layer, its input's channel means (bias correction)."""
    groups: dict[relax.Var, list[relax.Var]] = {}
    for v in plan.points:
        groups.setdefault(plan.root(v), []).append(v)
    weighted = [c for c in plan.chains if c.weight is not None]
    watched = list(dict.fromkeys([plan.observed(v) for v in plan.points]
                                 + [c.inputs[0] for c in weighted]))
    names = [v.name for v in watched]
    if len(set(names)) != len(names):
        raise ValueError("calibration needs unique tensor names in main")
    ex = relax.build(_observing_module(mod, names), target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    params = [p.name for p in mod["main"].params]
    values: dict[str, object] = {n: make_observer(method, **observer_options) for n in names}
    means = {c.anchor: ChannelMeanObserver(1 if c.kind == "conv2d" else -1) for c in weighted}
    by_input: dict[str, list[relax.Var]] = {}
    for c in weighted:
        by_input.setdefault(c.inputs[0].name, []).append(c.anchor)
    for i, feed in enumerate(progress(feeds, len(feeds), f"calibrating ({method})", show_progress)):
        missing = [p for p in params if p not in feed]
        if missing:
            raise ValueError(f"calibration feed lacks inputs {missing}")
        outs = vm["main"](*[tvm.runtime.tensor(np.asarray(feed[p])) for p in params])
        for n, t in zip(names, outs):
            arr = np.asarray(t.numpy(), np.float32)
            check_finite(arr, n, i)
            values[n].update(arr)
            for anchor in by_input.get(n, ()):
                means[anchor].update(arr)
    qps: dict[relax.Var, ActQuant] = {}
    acts = {c.output: c.act for c in plan.chains if c.act is not None}
    for root, members in groups.items():
        lo, hi = np.inf, -np.inf
        for v in members:
            a, b = values[plan.observed(v).name].range()
            if v in acts:  # the fused activation clips what the observer saw
                a, b = max(a, acts[v][0]), min(b, acts[v][1])
            lo, hi = min(lo, a), max(hi, b)
        qps[root] = activation_qparams(lo, hi, symmetric=symmetric)
    return qps, {a: m.mean() for a, m in means.items()}


# ----------------------------------------------------------------------------- rewrite
def _dq_const(q: np.ndarray, scale: np.ndarray, zp_dtype: str, axis: int) -> relax.Expr:
    scale = np.asarray(scale, np.float32)
    zp = np.zeros(scale.shape, zp_dtype)
    return relax.op.dequantize(relax.const(q), relax.const(scale), relax.const(zp), axis,
                               "float32")


def chain_ints(c: Chain, per_channel: bool, means: dict[relax.Var, np.ndarray] | None,
               x_scale: float | None = None
               ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray | None]:
    """A weighted chain's weight scales (one per output channel), int8 weights, channel
    axis and the mean output shift their rounding causes (None without bias correction).
    Given the input scale, per-channel weight scales are raised where the int32 bias would
    not fit the accumulator's range (``qparams.bias_weight_scale_floor``)."""
    axis = 0 if c.kind == "conv2d" else 1
    w = c.weight.astype(np.float64)
    shape = [1] * w.ndim
    shape[axis] = -1
    if c.fold_scale is not None:  # a folded batch norm scales each output channel
        w = w * c.fold_scale.reshape(shape)
    scales = weight_qparams(w, axis if per_channel else None)
    if scales.size == 1:
        scales = np.repeat(scales, w.shape[axis])
    wq, shift = _weights_and_shift(c, w, scales, axis, means)
    if x_scale is not None and per_channel and (c.bias is not None or shift is not None):
        floor = bias_weight_scale_floor(_chain_bias(c, scales.size, shift), x_scale,
                                        w.size // w.shape[axis])
        if np.any(scales < floor):
            scales = np.maximum(scales, floor).astype(np.float32)
            wq, shift = _weights_and_shift(c, w, scales, axis, means)
    return scales, wq, axis, shift


def _weights_and_shift(c: Chain, w: np.ndarray, scales: np.ndarray, axis: int,
                       means: dict[relax.Var, np.ndarray] | None
                       ) -> tuple[np.ndarray, np.ndarray | None]:
    shape = [1] * w.ndim
    shape[axis] = -1
    wq = quantize_weight(w, scales, axis)
    shift = None
    if means is not None:
        dw = wq * scales.astype(np.float64).reshape(shape) - w
        m = means[c.anchor]
        shift = (conv_shift(dw, m, c.groups) if c.kind == "conv2d"
                 else dense_shift(dw, m, transposed=False))
    return wq, shift


def _chain_bias(c: Chain, channels: int, shift: np.ndarray | None) -> np.ndarray:
    """The float bias the chain's int32 bias encodes (the rounding's mean shift removed)."""
    return (np.zeros(channels) if c.bias is None else c.bias) - (0.0 if shift is None else shift)


def fit_biases(plan: Plan, qps: dict[relax.Var, ActQuant], per_channel: bool,
               means: dict[relax.Var, np.ndarray] | None, symmetric: bool
               ) -> dict[relax.Var, ActQuant]:
    """``qps`` with each input scale raised until every int32 bias reading it stays in the
    accumulator's range (``qparams.bias_input_scale_floor``). Only per-tensor weights need
    it: per-channel weight scales are raised instead (:func:`chain_ints`)."""
    out = dict(qps)
    for c in plan.chains:
        if c.weight is None or per_channel:
            continue
        scales, wq, axis, shift = chain_ints(c, per_channel, means)
        if c.bias is None and shift is None:
            continue
        bias = _chain_bias(c, scales.size, shift)
        root = plan.root(c.inputs[0])
        floor = bias_input_scale_floor(bias, scales, wq, axis)
        out[root] = widen(out[root], floor, symmetric)
    return out


@mutator
class _InsertQDQ(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, plan: Plan, qps: dict[relax.Var, ActQuant],
                 per_channel: bool, means: dict[relax.Var, np.ndarray] | None):
        super().__init__(mod)
        self.plan, self.qps, self.per_channel, self.means = plan, qps, per_channel, means
        self.shift: dict[relax.Var, np.ndarray] = {}
        self.points = set(plan.points)
        self.chains = {c.anchor: c for c in plan.chains}
        self.bias_of = {c.bias_var: c for c in plan.chains if c.bias_var is not None}
        self.folded = {v for c in plan.chains for v in c.folded}
        self.w_scales: dict[relax.Var, np.ndarray] = {}
        self.params = list(mod["main"].params)
        self.inputs_done = False

    def qp(self, v: relax.Var) -> ActQuant:
        return self.qps[self.plan.root(v)]

    def _qdq(self, value: relax.Expr, v: relax.Var) -> relax.Expr:
        qp = self.qp(v)
        s, z = relax.const(np.float32(qp.scale)), relax.const(np.int8(qp.zero_point))
        axis = 1 if len(v.ty.shape) > 1 else 0
        q = self.builder_.emit(relax.op.quantize(value, s, z, axis, "int8"), name_hint=f"{v.name}_q")
        return relax.op.dequantize(q, s, z, axis, "float32")

    def _weight(self, c: Chain) -> relax.Expr:
        scales, wq, axis, shift = chain_ints(c, self.per_channel, self.means,
                                             self.qp(c.inputs[0]).scale)
        self.w_scales[c.anchor] = scales
        if shift is not None:
            self.shift[c.anchor] = shift
        return self.builder_.emit(_dq_const(wq, scales, "int8", axis),
                                  name_hint=f"{c.anchor.name}_w")

    def _bias(self, c: Chain) -> relax.Expr:
        """``dequantize(int32 bias)`` shaped to broadcast along the output channels."""
        n = self.w_scales[c.anchor].size
        bias = _chain_bias(c, n, self.shift.get(c.anchor))
        s = bias_qparams(self.qp(c.inputs[0]).scale, self.w_scales[c.anchor], n)
        b = self.builder_.emit(_dq_const(quantize_bias(bias, s), s, "int32", 0),
                               name_hint=f"{c.anchor.name}_b")
        if c.kind == "dense":
            return b
        return self.builder_.emit(relax.op.reshape(b, [1, n, 1, 1]),
                                  name_hint=f"{c.anchor.name}_bias")

    def _quantize_inputs(self) -> None:
        """Graph inputs read by a chain: quantize -> dequantize before the first binding."""
        self.inputs_done = True
        for p in self.params:
            if p in self.points:
                self.set_var_remap(p, self.builder_.emit(
                    self._qdq(self.visit_expr(p), p), name_hint=f"{p.name}_dq"))

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:  # noqa: N802
        if not self.inputs_done:
            self._quantize_inputs()
        v = binding.var
        if v in self.folded:
            return  # absorbed into the weights and bias; only the next absorbed op read it
        value = self.visit_expr(binding.value)
        if v in self.chains and self.chains[v].weight is not None:
            c = self.chains[v]
            args = list(value.args)
            args[1] = self._weight(c)
            value = relax.Call(value.op, args, value.attrs, value.ty_args, value.span)
            if c.bias_var is None and c.anchor in self.shift:  # a bias to carry the correction
                value = relax.op.add(self.builder_.emit(value, name_hint=f"{v.name}_mm"),
                                     self._bias(c))
        elif v in self.bias_of:  # the chain's per-channel ops become one bias add
            c = self.bias_of[v]
            value = relax.op.add(self.visit_expr(c.anchor), self._bias(c))
        if v in self.points:
            inner = self.builder_.emit(value, name_hint=f"{v.name}_f")
            value = self._qdq(inner, v)
        new = (self.builder_.emit(value, name_hint=v.name) if isinstance(v, relax.DataflowVar)
               else self.builder_.emit_output(value, name_hint=v.name))
        self.set_var_remap(v, new)


# ----------------------------------------------------------------------------- API
def quantize_relax(mod: tvm.IRModule, feeds: list[dict[str, np.ndarray]], method: str = "minmax",
                   per_channel: bool = True, symmetric_activations: bool = False,
                   keep_fp32: frozenset[str] = frozenset(), show_progress: bool = False,
                   bias_correction: bool = True, **observer_options) -> tuple[tvm.IRModule, Plan]:
    """The QDQ int8 module of FP32 ``mod`` (``main`` with constant weights, as
    ``from_onnx(..., keep_params_in_input=False)`` gives) and the plan it followed."""
    if has_qdq(mod):
        raise ValueError("the module is already quantized (QDQ); pass it to tvm.compile as it is")
    if not feeds:
        raise ValueError("calibration needs at least one input batch")
    mod = prepare_fp32(mod)
    check_keep_fp32(keep_fp32, anchor_names(mod["main"]), what="conv2d/matmul/add/pool binding")
    plan = make_plan(mod["main"], frozenset(keep_fp32))
    if not plan.chains:
        raise ValueError("no layer of the module can be quantized for the DSA "
                         "(no conv2d, dense, matmul, add or pooling on float tensors)")
    qps, means = calibrate(mod, plan, feeds, method, show_progress,
                           symmetric=symmetric_activations, **observer_options)
    means = means if bias_correction else None
    qps = fit_biases(plan, qps, per_channel, means, symmetric_activations)
    out = tvm.IRModule(dict(mod.functions))
    out["main"] = _InsertQDQ(mod, plan, qps, per_channel, means).visit_expr(mod["main"])
    plan.fp32 = plan.fp32_ops(mod["main"])
    return relax.transform.Normalize()(out), plan
