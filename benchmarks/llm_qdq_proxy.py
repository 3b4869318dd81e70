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

    python benchmarks/llm_qdq_proxy.py                                  # the default W8A8
    python benchmarks/llm_qdq_proxy.py --narrow --smooth none           # int8 residual stream
    python benchmarks/llm_qdq_proxy.py --fp32 'down_proj/MatMul'         # down_proj in FP32
"""

from __future__ import annotations

import argparse
import re
import time

import numpy as np
import onnxruntime as ort
from bench_llm import PROMPTS, pydoc_text

from dsa_tvm.llm.feeds import step_feeds
from dsa_tvm.llm.model import SMOOTH, CompiledLLM, StepRecord
from dsa_tvm.llm.smooth import FOLDS
from dsa_tvm.llm.source import load_source

BUCKETS = dict(prefill_buckets=(16,), context_buckets=(128, 512))


class QdqProxy(CompiledLLM):
    """A CompiledLLM whose quantized steps run in onnxruntime instead of on the DSA."""

    def __init__(self, *args, fp32: tuple[str, ...] = (), wide_extra: tuple[str, ...] = (),
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.fp32_patterns, self.wide_extra = fp32, wide_extra
        self._sessions: dict[tuple[int, int], ort.InferenceSession] = {}

    def quantize_options(self, step):
        opts = super().quantize_options(step)
        keep = {n.name for n in step.graph.node
                if any(re.search(p, n.name) for p in self.fp32_patterns)}
        made = {o for n in step.graph.node for o in n.output}
        missing = [t for t in self.wide_extra if t not in made]
        if missing:
            raise SystemExit(f"--wide-extra names no tensor of the step: {missing}")
        return {**opts, "keep_fp32": keep,
                "wide_tensors": set(opts["wide_tensors"]) | set(self.wide_extra)}

    def run_step(self, ids, kv, kind="decode"):
        if self.quant == "fp32" or kv.length == 0:      # the sink: FP32 on the host
            return super().run_step(ids, kv, kind)
        n, start = len(ids), kv.length
        shape = self.step_shape(n, start)
        if shape not in self._sessions:
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.intra_op_num_threads = 1
            self._sessions[shape] = ort.InferenceSession(
                self._quantize(*shape).model.SerializeToString(), so)
        feeds = step_feeds(self.hf, self.arch, ids, start, shape[0], shape[1], kv)
        outs = dict(zip(self.arch.output_names(), self._sessions[shape].run(
            None, {k: feeds[k] for k in self.arch.input_names(shape[1])})))
        kv.append(outs, n)
        return outs["logits"][0, :n], StepRecord(kind, n, shape, start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quant", default="w8a8", choices=("w8a8", "w4a8"))
    ap.add_argument("--smooth", default=None, help="SmoothQuant's alpha, or 'none' "
                    "(default: the library's, dsa_tvm.llm.model.SMOOTH)")
    ap.add_argument("--smooth-folds", default=None, help="comma-separated, of "
                    f"{', '.join(FOLDS)} (default: the library's)")
    ap.add_argument("--narrow", action="store_true", help="the residual stream on int8 grids")
    ap.add_argument("--fp32", default="", help="comma-separated regexes of node names "
                    "kept FP32 (e.g. 'down_proj/MatMul,attend/')")
    ap.add_argument("--wide-extra", default="", help="comma-separated tensors also int16")
    ap.add_argument("--ppl-tokens", type=int, default=256)
    a = ap.parse_args()
    smooth = SMOOTH if a.smooth is None else None if a.smooth == "none" else float(a.smooth)
    folds = {} if a.smooth_folds is None else {"smooth_folds": tuple(a.smooth_folds.split(","))}
    src = load_source("smollm2")
    ref = CompiledLLM(src, quant="fp32", **BUCKETS)
    m = QdqProxy(src, quant=a.quant, smooth=smooth, wide_residual=not a.narrow,
                 fp32=tuple(filter(None, a.fp32.split(","))),
                 wide_extra=tuple(filter(None, a.wide_extra.split(","))), **folds, **BUCKETS)
    t0 = time.perf_counter()
    tf = [m.teacher_forced(p, ref.generate(p, 32).ids) for p in PROMPTS]
    ppl = m.perplexity(src.encode(pydoc_text())[:a.ppl_tokens])
    base = ref.perplexity(src.encode(pydoc_text())[:a.ppl_tokens])
    print(f"{a.quant} residual {'int8' if a.narrow else 'int16'} smooth {smooth} "
          f"folds {m.smooth_folds} fp32 {a.fp32 or '-'} wide+ {a.wide_extra or '-'}: "
          f"perplexity {ppl:.3f} ({ppl / base - 1:+.1%} against FP32 {base:.3f}), "
          f"teacher-forced {np.mean(tf):.1%} [{time.perf_counter() - t0:.0f} s]")


if __name__ == "__main__":
    main()
