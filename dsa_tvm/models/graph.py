"""A small helper for writing ONNX graphs by hand with deterministic random weights."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
MS_DOMAIN = "com.microsoft"

# metadata key the builders set so calibration_data() knows what inputs look like
INPUT_KIND_KEY = "dsa_tvm.input_kind"


class GraphBuilder:
    """Accumulates nodes and initializers; every weight comes from one seeded generator.

    Conv layers are followed by batch norm, either folded into the conv's weight and
    bias (``batchnorm=False``) or kept as a ``BatchNormalization`` node; both spellings
    compute the same function for the same seed.
    """

    def __init__(self, name: str, seed: int = 0, batchnorm: bool = False):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.batchnorm = batchnorm
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.domains: set[str] = set()
        self.value_info: list[onnx.ValueInfoProto] = []
        self._used: Counter[str] = Counter()
        self._shared: dict[str, str] = {}
        # estimated (mean, variance) of each activation tensor, Gaussian model (graph inputs:
        # (0, 1)); conv_bn sizes its He-normal weights from it, as batch norm would rescale
        self.moments: dict[str, tuple[float, float]] = {}

    # ------------------------------------------------------------------ names, tensors, nodes

    def fresh(self, hint: str) -> str:
        """A unique tensor/node name starting with ``hint``."""
        n = self._used[hint]
        self._used[hint] += 1
        return hint if n == 0 else f"{hint}_{n}"

    def const(self, hint: str, value: np.ndarray) -> str:
        """Add an initializer (float arrays are stored as float32) and return its name."""
        arr = np.asarray(value)
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float32)
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def shared(self, name: str, value: np.ndarray) -> str:
        """An initializer created once under ``name`` and reused by every later call."""
        if name not in self._shared:
            self._shared[name] = self.const(name, value)
        return self._shared[name]

    def op(self, op_type: str, inputs: Sequence[str], name: str | None = None,
           domain: str | None = None, out: str | None = None, **attrs) -> str:
        """Append one single-output node; returns its output tensor name (the node's
        name unless ``out`` names it)."""
        node_name = self.fresh(name or op_type.lower())
        out = out or node_name
        node = helper.make_node(op_type, list(inputs), [out], name=node_name, **attrs)
        if domain:
            node.domain = domain
            self.domains.add(domain)
        self.nodes.append(node)
        return out

    def annotate(self, name: str, shape: Sequence[int]) -> None:
        """Record a float32 tensor's shape (needed after contrib ops ONNX cannot infer)."""
        self.value_info.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))

    # ------------------------------------------------------------------ layers

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
                name: str = "conv", gamma_scale: float = 1.0) -> str:
        """Conv followed by batch norm (folded or a node); no activation.

        Weights are He-normal, N(0, gain / fan_in), with the gain taken from the input's
        estimated second moment (gain 2 for the output of a ReLU of a unit-variance
        tensor), so every conv output has variance ~1 like a batch-normalized one.
        ``gamma_scale`` scales the batch-norm gamma (used to damp residual branches).
        """
        fan_in = cin // group * k * k
        mu, var = self.moments.get(x, (0.0, 1.0))
        gain = 1.0 / (var + mu * mu)
        w = self.rng.normal(0.0, np.sqrt(gain / fan_in), (cout, cin // group, k, k))
        gamma = self.rng.uniform(0.8, 1.2, cout) * gamma_scale
        beta = self.rng.normal(0.0, 0.1, cout) * gamma_scale
        bn_mean = self.rng.normal(0.0, 0.1, cout)
        bn_var = self.rng.uniform(0.8, 1.25, cout)
        eps = 1e-5
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
                     group=group, dilations=[1, 1])
        if self.batchnorm:
            wn = self.const(f"{name}.weight", w)
            y = self.op("Conv", [x, wn], name=name, **attrs)
            params = [self.const(f"{name}.bn.{p}", v)
                      for p, v in (("scale", gamma), ("bias", beta), ("mean", bn_mean), ("var", bn_var))]
            out = self.op("BatchNormalization", [y, *params], name=f"{name}.bn", epsilon=eps)
        else:
            s = gamma / np.sqrt(bn_var + eps)
            wn = self.const(f"{name}.weight", w * s[:, None, None, None])
            bn = self.const(f"{name}.bias", beta - bn_mean * s)
            out = self.op("Conv", [x, wn, bn], name=name, **attrs)
        self.moments[out] = (0.0, gamma_scale ** 2)
        return out

    def relu(self, x: str, name: str) -> str:
        """Relu (moments of a rectified Gaussian)."""
        out = self.op("Relu", [x], name=name)
        self.moments[out] = rectified_moments(*self.moments.get(x, (0.0, 1.0)))
        return out

    def add(self, a: str, b: str, name: str) -> str:
        """Elementwise (residual) Add of independent tensors: means and variances add."""
        out = self.op("Add", [a, b], name=name)
        (ma, va), (mb, vb) = self.moments.get(a, (0.0, 1.0)), self.moments.get(b, (0.0, 1.0))
        self.moments[out] = (ma + mb, va + vb)
        return out

    def maxpool(self, x: str, k: int, stride: int, pad: int, name: str = "maxpool") -> str:
        """MaxPool; the max over a (spatially correlated) window raises the mean (~ +1 sigma)."""
        out = self.op("MaxPool", [x], name=name, kernel_shape=[k, k], strides=[stride, stride],
                      pads=[pad] * 4)
        mu, var = self.moments.get(x, (0.0, 1.0))
        self.moments[out] = (mu + np.sqrt(var), var)
        return out

    def relu6(self, x: str, name: str) -> str:
        """ReLU6 spelled as opset-11+ Clip(x, 0, 6)."""
        lo = self.shared("clip.min", np.array(0.0, np.float32))
        hi = self.shared("clip.max", np.array(6.0, np.float32))
        out = self.op("Clip", [x, lo, hi], name=name)
        self.moments[out] = rectified_moments(*self.moments.get(x, (0.0, 1.0)))
        return out

    def classifier(self, x: str, channels: int, num_classes: int, name: str = "fc",
                   out: str = "logits") -> str:
        """GlobalAveragePool -> Flatten -> Gemm(transB=1), weights N(0, 1 / (fan_in E[x^2]))."""
        p = self.op("GlobalAveragePool", [x], name="avgpool")
        f = self.op("Flatten", [p], name="flatten", axis=1)
        mu, var = self.moments.get(x, (0.0, 1.0))
        std = 1 / np.sqrt(channels * (mu * mu + var))
        w = self.const(f"{name}.weight", self.rng.normal(0, std, (num_classes, channels)))
        b = self.const(f"{name}.bias", self.rng.normal(0, 0.01, num_classes))
        return self.op("Gemm", [f, w, b], name=name, out=out, transB=1)

    def linear(self, x: str, fan_in: int, fan_out: int, name: str, std: float | None = None) -> str:
        """MatMul with a (fan_in, fan_out) weight followed by a bias Add (the BERT export form)."""
        std = 1 / np.sqrt(fan_in) if std is None else std
        w = self.const(f"{name}.weight", self.rng.normal(0, std, (fan_in, fan_out)))
        b = self.const(f"{name}.bias", self.rng.normal(0, 0.02, fan_out))
        y = self.op("MatMul", [x, w], name=f"{name}.matmul")
        return self.op("Add", [y, b], name=f"{name}.add")

    # ------------------------------------------------------------------ model

    def build(self, inputs: Sequence[tuple[str, Sequence[int]]], outputs: Sequence[tuple[str, Sequence[int]]],
              input_kind: str, doc: str = "") -> onnx.ModelProto:
        """Wrap everything into an opset-17, IR-version-8 model and check it."""
        graph = helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs],
            initializer=self.initializers, value_info=self.value_info)
        opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, 1) for d in sorted(self.domains)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="dsa_tvm.models",
                                  doc_string=doc)
        model.ir_version = IR_VERSION
        helper.set_model_props(model, {INPUT_KIND_KEY: input_kind})
        onnx.checker.check_model(model)
        return model


def rectified_moments(mu: float, var: float) -> tuple[float, float]:
    """(mean, variance) of relu(X) for X ~ N(mu, var)."""
    sd = math.sqrt(max(var, 1e-12))
    a = mu / sd
    cdf = 0.5 * (1 + math.erf(a / math.sqrt(2)))
    pdf = math.exp(-a * a / 2) / math.sqrt(2 * math.pi)
    mean = mu * cdf + sd * pdf
    m2 = (mu * mu + var) * cdf + mu * sd * pdf
    return mean, max(m2 - mean * mean, 1e-12)


def input_kind(model: onnx.ModelProto) -> str | None:
    """The input kind ("image", "tokens") a builder recorded, if any."""
    for p in model.metadata_props:
        if p.key == INPUT_KIND_KEY:
            return p.value
    return None
