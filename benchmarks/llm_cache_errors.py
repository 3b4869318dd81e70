"""Layer by layer: the keys and values each layer writes to the KV cache, the DSA against
the QDQ proxy against FP32's step model, over one window of ``pydoc_data.topics`` (issue 14).

Every layer's K and V are a function of the residual stream entering it, so the cache is
a probe of each layer's input that needs no tensor names: where the DSA's error departs
from the proxy's (same calibration, same grids, float arithmetic between them) is where
an integer stage loses something. Relative rms error per layer and position band:

    python benchmarks/llm_cache_errors.py                 # 2,048 tokens, about 25 min
    python benchmarks/llm_cache_errors.py --tokens 256    # a quick look
    python benchmarks/llm_cache_errors.py --dsa-down-planes   # the proxy with the DSA's
                                                              # down_proj planes

Memory: the DSA and the proxy run one after the other (about 12 GB at 2,048 tokens).
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np
from bench_llm import pydoc_text
from llm_qdq_proxy import QdqProxy

from dsa_tvm.llm.feeds import step_feeds
from dsa_tvm.llm.model import CompiledLLM
from dsa_tvm.llm.source import load_source
from dsa_tvm.llm.step import run_step_fp32


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.sqrt(((got - want) ** 2).mean() / max((want ** 2).mean(), 1e-30)))


def bands(tokens: int) -> list[tuple[int, int]]:
    """Position bands (the sink, position 0, runs in FP32 on the host and is left out)."""
    edges = [1] + [e for e in (128, 512, 1024) if e < tokens] + [tokens]
    return list(zip(edges[:-1], edges[1:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--dsa-down-planes", action="store_true",
                    help="the proxy computes down_proj as the DSA's byte planes do")
    a = ap.parse_args()
    src = load_source("smollm2")
    ids = src.encode(pydoc_text())[:a.tokens]
    buckets = dict(prefill_buckets=(16,),
                   context_buckets=tuple(b for b in (128, 512, 2048) if b < a.tokens)
                   + (max(a.tokens, 128),))
    t0 = time.perf_counter()
    dsa = CompiledLLM(src, quant="w8a8", **buckets)
    caches = {"dsa": dsa.new_cache()}
    dsa.prefill(ids, caches["dsa"])
    print(f"DSA prefill of {len(ids)} tokens [{time.perf_counter() - t0:.0f} s]", flush=True)
    proxy = QdqProxy(src, quant="w8a8", down_planes=a.dsa_down_planes, **buckets)
    proxy._step_hf, proxy._calibrated = dsa.step_model, dsa._calibrated   # one calibration
    dsa._compiled.clear()
    gc.collect()
    caches["proxy"] = proxy.new_cache()
    proxy.prefill(ids, caches["proxy"])
    print(f"proxy [{time.perf_counter() - t0:.0f} s]", flush=True)
    feeds = step_feeds(dsa.hf, dsa.arch, ids, 0, len(ids), 0, None)
    outs = dict(zip(dsa.arch.output_names(),
                    run_step_fp32(dsa.step_model, len(ids), 0, feeds)))
    caches["fp32"] = dsa.new_cache()
    caches["fp32"].append(outs, len(ids))
    pairs = (("dsa", "fp32"), ("proxy", "fp32"), ("dsa", "proxy"))
    print("relative rms error per layer; columns per position band: "
          + ", ".join(f"{x} ~ {y}" for x, y in pairs))
    print("name " + " | ".join(f"{lo:>5}-{hi:<5}" + " " * 14 for lo, hi in bands(len(ids))))
    for name in caches["dsa"].tensors:
        cells = []
        for lo, hi in bands(len(ids)):
            cut = {k: c.tensors[name][:, :, lo:hi] for k, c in caches.items()}
            cells.append(" ".join(f"{relative_error(cut[x], cut[y]):.4f}" for x, y in pairs))
        print(f"{name:4s} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
