"""Error of the integer softmax / LayerNorm / RMSNorm (dsa_tvm.layers.intnorm) against FP32.

Runs the bundled BERT-style encoder block (dsa_tvm.models.transformer) with a small
numpy interpreter of its ONNX graph, three ways: FP32; every Softmax and
LayerNormalization with int8 input and output (the quantizer's plan: input scale
max|x|/127, softmax output 1/256 with zero point -128, norm output max|y|/127 from a
calibration batch) but computed in float ("QDQ, float kernel": what the CPU does when
these ops stay there); and the same int8 codes through the integer kernels ("QDQ,
integer kernel": what the [norm] unit computes). ``--norm rms`` swaps every
LayerNormalization for RMSNorm (Llama style) in all three. Prints the output cosine
of each against FP32 and the drop the integer kernels add.

    PYTHONPATH=$PWD python benchmarks/bench_intnorm.py [--norm ln|rms] [--seq 128]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper
from scipy.special import erf

from dsa_tvm.layers import intnorm as inn
from dsa_tvm.models.transformer import transformer_encoder

Kernel = Callable[[str, np.ndarray, dict], np.ndarray]


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _float_norm(x, gamma, beta, eps, rms):
    if rms:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gamma
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * gamma + beta


def run(model: onnx.ModelProto, x: np.ndarray, kernel: Kernel, rms: bool) -> np.ndarray:
    """Evaluate the encoder graph (float64); ``kernel(name, input, info)`` computes each
    Softmax / LayerNormalization (``info``: gamma, beta, eps, rms)."""
    env = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    env["x"] = x
    for nd in model.graph.node:
        a = [env[i] for i in nd.input]
        op = nd.op_type
        if op == "MatMul":
            y = a[0] @ a[1]
        elif op in ("Add", "Mul", "Div"):
            y = {"Add": np.add, "Mul": np.multiply, "Div": np.divide}[op](a[0], a[1])
        elif op == "Reshape":
            y = a[0].reshape(a[1].astype(np.int64))
        elif op == "Transpose":
            y = a[0].transpose(_attr(nd, "perm"))
        elif op == "Erf":
            y = erf(a[0])
        elif op == "Softmax":
            y = kernel("softmax", a[0], {})
        elif op == "LayerNormalization":
            y = kernel("norm", a[0], {"gamma": a[1], "beta": a[2], "rms": rms,
                                      "eps": float(_attr(nd, "epsilon", 1e-5))})
        else:
            raise NotImplementedError(op)
        env[nd.output[0]] = y
    return env[model.graph.output[0].name]


def fp32(kind: str, x: np.ndarray, info: dict) -> np.ndarray:
    if kind == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return _float_norm(x, info["gamma"], info["beta"], info["eps"], info["rms"])


class Quantized:
    """Softmax / norms on int8 codes; scales from the first (calibration) pass."""

    def __init__(self, integer: bool):
        self.integer, self.calib, self.scales, self.i = integer, True, [], 0

    def __call__(self, kind: str, x: np.ndarray, info: dict) -> np.ndarray:
        if self.calib:
            y = fp32(kind, x, info)
            s_out = 1 / 256 if kind == "softmax" else np.abs(y).max() / 127
            self.scales.append((np.abs(x).max() / 127, s_out))
            return y
        s_in, s_out = self.scales[self.i]
        self.i += 1
        q = np.clip(np.round(x / s_in), -128, 127).astype(np.int8)
        zp_out = -128 if kind == "softmax" else 0
        if self.integer and kind == "softmax":
            yq = inn.int_softmax(q, 0, inn.softmax_params(s_in, s_out, zp_out))
        elif self.integer:
            n = x.shape[-1]
            p = inn.norm_params(n, s_in, info["eps"], info["gamma"],
                                None if info["rms"] else info["beta"], s_out, zp_out,
                                not info["rms"])
            yq = inn.int_norm(q, 0, p)
        else:
            y = fp32(kind, q.astype(np.float64) * s_in, info)
            yq = np.clip(np.round(y / s_out) + zp_out, -128, 127)
        return (yq.astype(np.float64) - zp_out) * s_out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel(), b.ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def measure(norm: str = "ln", seq: int = 128, seed: int = 0) -> dict[str, float]:
    """Cosines vs FP32 of the QDQ'd softmax/norms with float and with integer kernels."""
    model = transformer_encoder(seq_len=seq, seed=seed)
    rng = np.random.default_rng(seed + 100)
    calib, x = (rng.normal(0, 1, (1, seq, 384)) for _ in range(2))
    rms = norm == "rms"
    ref = run(model, x, fp32, rms)
    out = {}
    for name, integer in (("qdq_float_kernel", False), ("qdq_integer_kernel", True)):
        k = Quantized(integer)
        run(model, calib, k, rms)
        k.calib = False
        out[name] = cosine(run(model, x, k, rms), ref)
    out["drop"] = out["qdq_float_kernel"] - out["qdq_integer_kernel"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--norm", choices=("ln", "rms", "both"), default="both")
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    goal = 0.001
    print(f"{'block':18s} {'cos QDQ float':>14s} {'cos QDQ int':>12s} {'drop':>10s}  goal drop <= {goal}")
    ok = True
    for norm in (("ln", "rms") if args.norm == "both" else (args.norm,)):
        r = measure(norm, args.seq)
        ok &= r["drop"] <= goal
        label = "BERT (LayerNorm)" if norm == "ln" else "Llama-ish (RMSNorm)"
        print(f"{label:18s} {r['qdq_float_kernel']:14.6f} {r['qdq_integer_kernel']:12.6f} "
              f"{r['drop']:10.2e}  {'met' if r['drop'] <= goal else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
