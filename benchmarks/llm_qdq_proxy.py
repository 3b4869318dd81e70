"""The W8A8 steps' QDQ graphs in onnxruntime: a fast proxy of the DSA's accuracy (issue 14).

``bench_llm.py --parts accuracy`` runs every step on the simulator (10-20 min a scheme).
This runs the same quantized steps (same calibration, same grids, the sink token in FP32
on the host) in onnxruntime with graph optimizations off, in 4-6 minutes, scored as the
bench scores the DSA: teacher-forced agreement over its 8 prompts (32 tokens each after
FP32's own continuation) and perplexity over its 256 tokens of ``pydoc_data``. Float
arithmetic between the grids (softmax, norms, the rounding of requantization) is not the
DSA's integer arithmetic, so it tracks the DSA's numbers without equalling them; what it
is for is comparing schemes: keeping nodes FP32 (``--fp32 REGEX``) or widening tensors
(``--wide-extra NAME``) asks what a grid costs.

Over 256 tokens two schemes can differ by a point of perplexity by chance, so the text
is also scored token by token against FP32 on the same windows: the mean NLL increase
(log of the perplexity ratio) with its standard error over tokens, and the mean KL
divergence of the next-token distributions (KL(FP32 || quantized), which every position
informs, not only the text's own next token). ``--ppl-tokens 2048`` tells schemes apart
that 256 tokens cannot.

    python benchmarks/llm_qdq_proxy.py                                  # the default W8A8
    python benchmarks/llm_qdq_proxy.py --narrow --smooth none           # int8 residual stream
    python benchmarks/llm_qdq_proxy.py --fp32 'down_proj/MatMul'         # down_proj in FP32
    python benchmarks/llm_qdq_proxy.py --ppl-tokens 2048 --no-tf          # a steadier score
    python benchmarks/llm_qdq_proxy.py --narrow-down --per-token down_proj/MatMul
                                          # down_proj's input int8 per token, not int16
    python benchmarks/llm_qdq_proxy.py --wide-inputs proj/MatMul          # every linear input int16
    python benchmarks/llm_qdq_proxy.py --wide-outputs 'up_proj/MatMul$'   # up_proj's output int16
    python benchmarks/llm_qdq_proxy.py --ppl-tokens 2048 --no-tf --window 2048 --dsa-down-planes
                                          # down_proj as the DSA's byte planes compute it
"""

from __future__ import annotations

import argparse
import re
import time

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
from bench_llm import NARROW, PROMPTS, add_narrow_flags, narrow_options, pydoc_text

from dsa_tvm.layers.group_grid import group_grid
from dsa_tvm.llm.feeds import step_feeds
from dsa_tvm.llm.model import QUANT_WEIGHT_BITS, SMOOTH, CompiledLLM
from dsa_tvm.llm.records import StepRecord
from dsa_tvm.llm.scoring import log_probs, paired_score
from dsa_tvm.llm.smooth import FOLDS
from dsa_tvm.llm.source import load_source
from dsa_tvm.quant.qparams import quantize_weight, weight_qparams

BUCKETS = dict(prefill_buckets=(16,), context_buckets=(128, 512))


class QdqProxy(CompiledLLM):
    """A CompiledLLM whose quantized steps run in onnxruntime instead of on the DSA."""

    def __init__(self, *args, fp32: tuple[str, ...] = (), wide_extra: tuple[str, ...] = (),
                 per_token: tuple[str, ...] = (), input_patterns: tuple[str, ...] = (),
                 wide_outputs: tuple[str, ...] = (), down_planes: bool = False,
                 method: str = "minmax", weight_groups: int = 0, weight_min: bool = False,
                 head_bits: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.method = method
        self.fp32_patterns, self.wide_extra, self.per_token = fp32, wide_extra, per_token
        # (not ``wide_inputs``: CompiledLLM's flag of that name widens every linear input)
        self.input_patterns, self.wide_outputs = input_patterns, wide_outputs
        self.down_planes = down_planes
        self.weight_groups, self.weight_min = weight_groups, weight_min
        self.head_bits = head_bits
        self._sessions: dict[tuple[int, int], ort.InferenceSession] = {}

    def quantize_options(self, step):
        opts = super().quantize_options(step)
        keep = {n.name for n in step.graph.node
                if any(re.search(p, n.name) for p in self.fp32_patterns)}
        if self.fp32_patterns and not keep:
            raise SystemExit(f"--fp32 matches no node: {self.fp32_patterns}")
        if keep:
            print(f"[{len(keep)} nodes kept FP32]", flush=True)
        made = {o for n in step.graph.node for o in n.output}
        missing = [t for t in self.wide_extra if t not in made]
        if missing:
            raise SystemExit(f"--wide-extra names no tensor of the step: {missing}")
        inputs = {n.input[0] for n in step.graph.node
                  if any(re.search(p, n.name) for p in self.input_patterns)}
        if self.input_patterns and not inputs:
            raise SystemExit(f"--wide-inputs matches no node: {self.input_patterns}")
        outputs = {o for n in step.graph.node if any(re.search(p, n.name)
                                                      for p in self.wide_outputs)
                   for o in n.output} | {i.name for i in step.graph.input if any(
                       re.search(p, i.name) for p in self.wide_outputs)}
        if self.wide_outputs and not outputs:
            raise SystemExit(f"--wide-outputs matches no node: {self.wide_outputs}")
        return {**opts, "keep_fp32": keep, "method": self.method,
                "wide_tensors": (set(opts["wide_tensors"]) | set(self.wide_extra) | inputs
                                 | outputs)}

    def run_step(self, ids, kv, kind="decode"):
        if self.quant == "fp32" or kv.length == 0:      # the sink: FP32 on the host
            return super().run_step(ids, kv, kind)
        n, start = len(ids), kv.length
        shape = self.step_shape(n, start)
        if shape not in self._sessions:
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.intra_op_num_threads = 1
            quantized = self._quantize(*shape)
            model = per_token_inputs(quantized.model, self.per_token)
            if self.down_planes:
                model = dsa_down_planes(model)
            if self.weight_groups:   # the FP32 graph the QDQ one was made from
                model = grouped_weights(model, quantized.fp32, self.weight_groups,
                                        QUANT_WEIGHT_BITS[self.quant], self.weight_min,
                                        self.head_bits)
            self._sessions[shape] = ort.InferenceSession(model.SerializeToString(), so)
        feeds = step_feeds(self.hf, self.arch, ids, start, shape[0], shape[1], kv)
        outs = dict(zip(self.arch.output_names(), self._sessions[shape].run(
            None, {k: feeds[k] for k in self.arch.input_names(shape[1])})))
        kv.append(outs, n)
        return outs["logits"][0, :n], StepRecord(kind, n, shape, start)


def group_quantized(w: np.ndarray, group: int, bits: int, with_min: bool) -> np.ndarray:
    """``w`` (in, out), a MatMul's constant weight, rounded on ``bits``-bit grids of its own
    per ``group`` consecutive input rows of each output column: symmetric (scale
    ``max|w| / (2^(bits-1) - 1)``) or, ``with_min``, from the group's minimum in
    ``2^bits - 1`` steps to its maximum (GGUF Q4_1's form: ``w = d * q + min``; a grid
    the group is already on is kept, as ``layers.group_grid`` does for the DSA)."""
    if group < 1:
        raise ValueError(f"a weight group must hold at least one input row, got {group}")
    if with_min:                   # the grid the DSA's grouped dense runs (layers.group_grid)
        return group_grid(w.T, group, bits).values().T.astype(w.dtype)
    out = np.empty_like(w)
    for a in range(0, w.shape[0], group):  # the DSA's symmetric rule, per column of the group
        g = w[a:a + group].astype(np.float64)
        d = weight_qparams(g, 1, bits)
        out[a:a + group] = quantize_weight(g, d, 1, bits) * d
    return out


def grouped_weights(model: onnx.ModelProto, fp32: onnx.ModelProto, group: int, bits: int,
                    with_min: bool, head_bits: int | None = None) -> onnx.ModelProto:
    """``model`` with every MatMul whose weight is a dequantized constant reading instead
    ``fp32``'s weight (the same-named node's) rounded per group of input rows
    (:func:`group_quantized`): what an array with per-group weight scales computes. The
    head (the MatMul making ``logits``) at ``head_bits`` if given. ``model`` (a fresh
    quantization of one bucket) is rewritten in place and returned."""
    g = model.graph
    dq = {n.output[0]: n for n in g.node if n.op_type == "DequantizeLinear"}
    consts = {i.name: i for i in g.initializer}
    fp32_consts = {i.name: i for i in fp32.graph.initializer}
    weights = {n.name: onnx.numpy_helper.to_array(fp32_consts[n.input[1]])
               for n in fp32.graph.node if n.op_type == "MatMul" and n.input[1] in fp32_consts}
    head = {n.name for n in fp32.graph.node if "logits" in n.output}
    dead, new = set(), []
    for n in g.node:
        w = dq.get(n.input[1]) if n.op_type == "MatMul" and len(n.input) > 1 else None
        if w is None or w.input[0] not in consts or n.name not in weights:
            continue
        name = f"{n.name}/grouped_weight"
        codes = consts[w.input[0]]
        if tuple(codes.dims) != weights[n.name].shape:
            raise SystemExit(f"{n.name}: quantized weight {tuple(codes.dims)} is not the FP32 "
                             f"weight's {weights[n.name].shape}")
        new.append(onnx.numpy_helper.from_array(
            group_quantized(weights[n.name], group, head_bits if head_bits and n.name in head
                            else bits, with_min).astype(np.float32), name))
        dead.add(n.input[1])
        n.input[1] = name
    if not new:
        raise SystemExit("--weight-groups found no MatMul with a quantized constant weight")
    print(f"[{len(new)} MatMul weights rounded per group of {group}]", flush=True)
    still_read = {i for n in g.node for i in n.input}
    keep = [n for n in g.node if not (n.output[0] in dead and n.output[0] not in still_read)]
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(new)
    return model


def per_token_inputs(model: onnx.ModelProto, patterns: tuple[str, ...]) -> onnx.ModelProto:
    """``model`` with the int8 input grid of every node matching ``patterns`` replaced by
    a dynamic one per row (symmetric, scale = the row's absolute maximum / 127): what a
    row-maximum unit with a per-row requantize would compute."""
    if not patterns:
        return model
    g = model.graph
    readers = [n for n in g.node if any(re.search(p, n.name) for p in patterns)]
    dq = {o: n for n in g.node if n.op_type == "DequantizeLinear" for o in n.output}
    wanted = {n.input[0] for n in readers if n.input[0] in dq}
    if not wanted:
        raise SystemExit(f"--per-token matches no node with a quantized input: {patterns}")
    keep, extra = [], []
    for n in g.node:
        if n.op_type == "DequantizeLinear" and n.output[0] in wanted:
            x = next(m for m in g.node if m.output and m.output[0] == n.input[0]).input[0]
            t, h = n.output[0], onnx.helper
            extra += [h.make_node("Abs", [x], [f"{t}/pt_abs"]),
                      h.make_node("ReduceMax", [f"{t}/pt_abs", "pt_axes"], [f"{t}/pt_max"]),
                      h.make_node("Max", [f"{t}/pt_max", "pt_eps"], [f"{t}/pt_m"]),
                      h.make_node("Div", [f"{t}/pt_m", "pt_127"], [f"{t}/pt_s"]),
                      h.make_node("Div", [x, f"{t}/pt_s"], [f"{t}/pt_x"]),
                      h.make_node("Round", [f"{t}/pt_x"], [f"{t}/pt_r"]),
                      h.make_node("Mul", [f"{t}/pt_r", f"{t}/pt_s"], [t])]
            continue
        keep.append(n)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(keep + extra)
    out.graph.initializer.extend([onnx.numpy_helper.from_array(np.float32(1e-12), "pt_eps"),
                                  onnx.numpy_helper.from_array(np.float32(127.0), "pt_127"),
                                  onnx.numpy_helper.from_array(np.array([-1]), "pt_axes")])
    order = onnx.helper.make_graph(_topological(out.graph), out.graph.name, out.graph.input,
                                   out.graph.output, out.graph.initializer)
    out.graph.CopyFrom(order)
    return out


def dsa_down_planes(model: onnx.ModelProto, lo_shift: int | None = None) -> onnx.ModelProto:
    """``model`` with every int16-input down_proj MatMul computed as the DSA's byte planes
    do (``relay_passes/kinds/dense_planes.py``): ``x = 256 hi + lo``, the lo plane's sums
    rounded to ``2**s`` product units (``2**(8 - s) acc_hi + round(acc_lo / 2**s)``, ``s``
    the layer's ``plane_lo_shift``; 0 is the exact product) before the requantize; the
    output's own Q/DQ follows. (ONNX's Round breaks ties to even where the DSA rounds
    half up: a tie is one joined unit's half.) ``lo_shift`` forces one ``s`` everywhere
    (8: the join's first form)."""
    from onnx import helper as h

    from relay_passes.kinds.dense_planes import plane_lo_shift

    g = model.graph
    init = {i.name: onnx.numpy_helper.to_array(i) for i in g.initializer}
    made = {o: n for n in g.node for o in n.output}
    out, extra, consts = [], [], []
    for n in g.node:
        dqx, dqw = made.get(n.input[0]) if n.input else None, made.get(n.input[-1])
        if not (n.op_type == "MatMul" and "down_proj" in n.name and dqx is not None
                and dqx.op_type == "DequantizeLinear" and init[dqx.input[2]].dtype == np.int16):
            out.append(n)
            continue
        s_x = float(init[dqx.input[1]])
        s_w = init[dqw.input[1]].astype(np.float64).reshape(-1)
        s = plane_lo_shift(init[dqw.input[0]].T, np.zeros(1)) if lo_shift is None else lo_shift
        t = n.name
        c = {f"{t}/c_{k}": np.asarray(v, np.float32) for k, v in
             (("sx", s_x), ("256", 256.0), ("lo", -128.0), ("hi", 127.0),
              ("unit", (1 << s) * s_w), ("sxu", s_x * (1 << s) * s_w))}
        consts += [onnx.numpy_helper.from_array(v, k) for k, v in c.items()]

        def k(nm: str, t: str = t) -> str:
            return f"{t}/c_{nm}"

        extra += [h.make_node("Div", [n.input[0], k("sx")], [f"{t}/xc"]),
                  h.make_node("Div", [f"{t}/xc", k("256")], [f"{t}/xh"]),
                  h.make_node("Round", [f"{t}/xh"], [f"{t}/xr"]),
                  h.make_node("Clip", [f"{t}/xr", k("lo"), k("hi")], [f"{t}/hi"]),
                  h.make_node("Mul", [f"{t}/hi", k("256")], [f"{t}/h256"]),
                  h.make_node("Sub", [f"{t}/xc", f"{t}/h256"], [f"{t}/l0"]),
                  h.make_node("Clip", [f"{t}/l0", k("lo"), k("hi")], [f"{t}/lo"]),
                  # 256 sum(hi W) in units of 2^s s_w: the joined grid's own
                  h.make_node("MatMul", [f"{t}/hi", n.input[1]], [f"{t}/mhi"]),
                  h.make_node("Div", [f"{t}/mhi", k("unit")], [f"{t}/qhi"]),
                  h.make_node("Mul", [f"{t}/qhi", k("256")], [f"{t}/ahi"]),
                  h.make_node("MatMul", [f"{t}/lo", n.input[1]], [f"{t}/mlo"]),
                  h.make_node("Div", [f"{t}/mlo", k("unit")], [f"{t}/qlo"]),
                  h.make_node("Round", [f"{t}/qlo"], [f"{t}/alo"]),
                  h.make_node("Add", [f"{t}/ahi", f"{t}/alo"], [f"{t}/acc"]),
                  h.make_node("Mul", [f"{t}/acc", k("sxu")], [n.output[0]])]
    if not extra:
        raise SystemExit("--dsa-down-planes: no int16-input down_proj MatMul in the step")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.initializer.extend(consts)
    order = onnx.helper.make_graph(_topological_nodes(out + extra, m.graph), m.graph.name,
                                   m.graph.input, m.graph.output, m.graph.initializer)
    m.graph.CopyFrom(order)
    return m


def _topological_nodes(nodes: list, g) -> list:
    """``nodes`` in an order where every input is made (by them, or as ``g``'s input or
    initializer) before it is read."""
    made = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    left, done = list(nodes), []
    while left:
        ready = [n for n in left if all(i in made for i in n.input)]
        if not ready:
            raise SystemExit("a graph rewrite left a cycle")
        for n in ready:
            made.update(n.output)
        done += ready
        left = [n for n in left if n not in ready]
    return done


def _topological(g) -> list:
    """The graph's nodes in an order where every input is made before it is read."""
    return _topological_nodes(list(g.node), g)


def regexes(text: str) -> tuple[str, ...]:
    """A comma-separated list of regexes (argparse type): each must compile."""
    out = tuple(filter(None, text.split(",")))
    for r in out:
        try:
            re.compile(r)
        except re.error as e:
            raise argparse.ArgumentTypeError(f"{r!r} is not a regex ({e}); separate "
                                             f"several with commas") from None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quant", default="w8a8", choices=("w8a8", "w4a8", "w4g32"))
    ap.add_argument("--smooth", default=None, help="SmoothQuant's alpha, or 'none' "
                    "(default: the library's, dsa_tvm.llm.model.SMOOTH)")
    ap.add_argument("--smooth-folds", default=None, help="comma-separated, of "
                    f"{', '.join(FOLDS)} (default: the library's)")
    add_narrow_flags(ap, tuple(NARROW))
    ap.add_argument("--fp32", default="", type=regexes, help="comma-separated regexes of node names "
                    "kept FP32 (e.g. 'down_proj/MatMul,attend/')")
    ap.add_argument("--wide-extra", default="", help="comma-separated tensors also int16")
    ap.add_argument("--ppl-tokens", type=int, default=256)
    ap.add_argument("--wide-inputs", default="", type=regexes, help="comma-separated regexes of nodes "
                    "whose first input is also int16 (e.g. 'down_proj/MatMul')")
    ap.add_argument("--wide-outputs", default="", type=regexes, help="comma-separated regexes of node "
                    "(or graph input) names whose outputs are also int16 (e.g. "
                    "'k_proj/MatMul$,rope_k/,^k[0-9]+$' for K and its cache)")
    ap.add_argument("--per-token", default="", type=regexes, help="comma-separated regexes of nodes "
                    "whose int8 input grid becomes per row (e.g. 'down_proj/MatMul')")
    ap.add_argument("--no-tf", action="store_true", help="skip the teacher-forced prompts")
    ap.add_argument("--dsa-down-planes", action="store_true", help="down_proj's int16 input "
                    "as the DSA's byte planes compute it (the lo plane's sums rounded to 256 "
                    "product units in the join), not the exact product")
    ap.add_argument("--method", default="minmax", help="the activation calibration "
                    "method (minmax, the DSA's; percentile, entropy, mse)")
    ap.add_argument("--gptq", choices=("on", "off"), default=None, help="the linear "
                    "layers' weights rounded by GPTQ (dsa_tvm.llm.gptq) or to nearest "
                    "(default: the library's, GPTQ for w4a8)")
    ap.add_argument("--weight-groups", type=int, default=0, metavar="G", help="the linear "
                    "layers' and the head's weights rounded per group of G input rows "
                    "(the weight bits of --quant; 0: per output channel, the DSA's)")
    ap.add_argument("--weight-min", action="store_true", help="with --weight-groups: each "
                    "group from its minimum to its maximum (GGUF Q4_1's form), not symmetric")
    ap.add_argument("--head-bits", type=int, choices=(4, 8), default=None, help="with "
                    "--weight-groups: the head's (the logits') weight bits (default: --quant's)")
    ap.add_argument("--smooth-group", type=int, default=None, metavar="G", help="one "
                    "smoothing factor per run of G input channels (with --weight-groups G "
                    "--weight-min a Q4_1 weight stays on its grid; default: the library's, "
                    "32 for w4g32, else 1)")
    ap.add_argument("--window", type=int, default=512, help="tokens a perplexity window "
                    "holds (the largest context bucket; bench_llm.py scores in 2048)")
    a = ap.parse_args()
    if a.weight_groups < 0:
        ap.error(f"--weight-groups must be >= 0 (0: per output channel), got {a.weight_groups}")
    if (a.weight_min or a.head_bits) and not a.weight_groups:
        ap.error("--weight-min and --head-bits round per group: give --weight-groups G too")
    smooth = SMOOTH if a.smooth is None else None if a.smooth == "none" else float(a.smooth)
    folds = {} if a.smooth_folds is None else {"smooth_folds": tuple(a.smooth_folds.split(","))}
    src = load_source("smollm2")
    buckets = {**BUCKETS, "context_buckets": tuple(sorted({128, a.window}))}
    ref = CompiledLLM(src, quant="fp32", **buckets)
    m = QdqProxy(src, quant=a.quant, smooth=smooth, **narrow_options(a, tuple(NARROW)),
                 fp32=a.fp32,
                 wide_extra=tuple(filter(None, a.wide_extra.split(","))),
                 per_token=a.per_token,
                 input_patterns=a.wide_inputs,
                 wide_outputs=a.wide_outputs,
                 down_planes=a.dsa_down_planes, method=a.method,
                 weight_groups=a.weight_groups, weight_min=a.weight_min,
                 smooth_group=a.smooth_group, head_bits=a.head_bits,
                 gptq=None if a.gptq is None else a.gptq == "on", **folds, **buckets)
    t0 = time.perf_counter()
    tf = [] if a.no_tf else [m.teacher_forced(p, ref.generate(p, 32).ids) for p in PROMPTS]
    ids = src.encode(pydoc_text())[:a.ppl_tokens]
    want, targets = log_probs(ref, ids)
    r = paired_score(log_probs(m, ids)[0], want, targets)
    grids = " ".join(f"{label} {'int16' if getattr(m, option) else 'int8'}"
                     for option, label, _, _ in NARROW.values())
    print(f"{a.quant} {grids} "
          f"smooth {smooth} "
          f"folds {m.smooth_folds} fp32 {','.join(a.fp32) or '-'} wide+ {a.wide_extra or '-'} "
          f"wide inputs {','.join(a.wide_inputs) or '-'} wide outputs {','.join(a.wide_outputs) or '-'} "
          f"per-token {','.join(a.per_token) or '-'} method {a.method}"
          f"{' dsa-down-planes' if a.dsa_down_planes else ''}{' gptq' if m.gptq else ''}"
          + (f" weights per group of {a.weight_groups}{' with min' if a.weight_min else ''}"
             if a.weight_groups else "")
          + (f" smoothing per {m.smooth_group} channels" if m.smooth_group > 1 else "")
          + (f" head {a.head_bits}-bit" if a.head_bits else "")
          + f": {r}"
          + (f", teacher-forced {np.mean(tf):.1%}" if tf else "")
          + f" [{time.perf_counter() - t0:.0f} s]")

if __name__ == "__main__":
    main()
