"""A BERT-style (post-LayerNorm) transformer encoder block as FP32 ONNX, opset 17."""

from __future__ import annotations

import numpy as np
import onnx

from .graph import MS_DOMAIN, GraphBuilder

GELU_FORMS = ("erf", "contrib")


def _gelu(g: GraphBuilder, x: str, form: str, name: str, shape: tuple[int, ...]) -> str:
    """GELU as the exporter's opset-17 Erf subgraph x * 0.5 * (1 + erf(x / sqrt 2)), or as
    the onnxruntime contrib op ``com.microsoft.Gelu`` (the standard op needs opset 20)."""
    if form == "contrib":
        out = g.op("Gelu", [x], name=name, domain=MS_DOMAIN)
        g.annotate(out, shape)  # so shape inference (and ORT's quantizer) sees past it
        return out
    if form != "erf":
        raise ValueError(f"gelu must be one of {GELU_FORMS}, got {form!r}")
    d = g.op("Div", [x, g.shared("gelu.sqrt2", np.array(np.sqrt(2.0), np.float32))], name=f"{name}.div")
    e = g.op("Erf", [d], name=f"{name}.erf")
    a = g.op("Add", [e, g.shared("gelu.one", np.array(1.0, np.float32))], name=f"{name}.add")
    m = g.op("Mul", [x, a], name=f"{name}.mul")
    return g.op("Mul", [m, g.shared("gelu.half", np.array(0.5, np.float32))], name=f"{name}.mul_half")


def _layer_norm(g: GraphBuilder, x: str, hidden: int, eps: float, name: str, out: str | None = None) -> str:
    gamma = g.const(f"{name}.weight", g.rng.uniform(0.8, 1.2, hidden))
    beta = g.const(f"{name}.bias", g.rng.normal(0.0, 0.05, hidden))
    return g.op("LayerNormalization", [x, gamma, beta], name=name, out=out, axis=-1, epsilon=eps)


def transformer_encoder(seq_len: int = 128, hidden: int = 384, heads: int = 6, ffn: int = 1536,
                        seed: int = 0, gelu: str = "erf", eps: float = 1e-12) -> onnx.ModelProto:
    """One BERT encoder layer on ``x`` (1, seq_len, hidden) -> ``y`` (1, seq_len, hidden).

    Q/K/V MatMul+Add projections, Reshape/Transpose to heads (K straight to K^T),
    MatMul Q.K^T, scale by 1/sqrt(head_dim), Softmax, MatMul .V, output projection,
    residual Add, LayerNormalization, FFN MatMul+Add, GELU (see ``gelu``), MatMul+Add,
    residual Add, LayerNormalization. Weights are N(0, 1/fan_in) so activations stay O(1).
    """
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    g = GraphBuilder("transformer_encoder", seed)
    dh = hidden // heads
    x = "x"
    q, k, v = (g.linear(x, hidden, hidden, f"attn.{n}") for n in "qkv")
    to_heads = g.const("attn.heads_shape", np.array([1, seq_len, heads, dh], np.int64))
    qh = g.op("Transpose", [g.op("Reshape", [q, to_heads], name="attn.q.reshape")], name="attn.q.transpose",
              perm=[0, 2, 1, 3])
    kt = g.op("Transpose", [g.op("Reshape", [k, to_heads], name="attn.k.reshape")], name="attn.k.transpose",
              perm=[0, 2, 3, 1])
    vh = g.op("Transpose", [g.op("Reshape", [v, to_heads], name="attn.v.reshape")], name="attn.v.transpose",
              perm=[0, 2, 1, 3])
    s = g.op("MatMul", [qh, kt], name="attn.scores")
    s = g.op("Mul", [s, g.const("attn.scale", np.array(1 / np.sqrt(dh), np.float32))], name="attn.scale")
    p = g.op("Softmax", [s], name="attn.softmax", axis=-1)
    c = g.op("MatMul", [p, vh], name="attn.context")
    c = g.op("Transpose", [c], name="attn.context.transpose", perm=[0, 2, 1, 3])
    c = g.op("Reshape", [c, g.const("attn.merge_shape", np.array([1, seq_len, hidden], np.int64))],
             name="attn.context.reshape")
    o = g.linear(c, hidden, hidden, "attn.out")
    h = _layer_norm(g, g.op("Add", [o, x], name="attn.residual"), hidden, eps, "attn.layernorm")
    f = g.linear(h, hidden, ffn, "ffn.up")
    f = _gelu(g, f, gelu, "ffn.gelu", (1, seq_len, ffn))
    f = g.linear(f, ffn, hidden, "ffn.down")
    y = _layer_norm(g, g.op("Add", [f, h], name="ffn.residual"), hidden, eps, "ffn.layernorm", out="y")
    shape = (1, seq_len, hidden)
    return g.build([("x", shape)], [(y, shape)], "tokens",
                   doc=f"transformer_encoder: seq {seq_len}, hidden {hidden}, heads {heads}, ffn {ffn}, "
                       f"gelu {gelu}, seed {seed}")
