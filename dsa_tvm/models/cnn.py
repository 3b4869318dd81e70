"""Convolutional test networks: ResNet-18/50-, MobileNetV2-shaped, and a tiny demo CNN.

All are FP32 ONNX (opset 17) with deterministic He-normal weights. The input is
``input`` (1, 3, S, S), the output ``logits`` (1, num_classes).
"""

from __future__ import annotations

import onnx

from .graph import GraphBuilder

# residual branches end in a batch norm whose gamma is damped by this factor, so the
# sum x + branch(x) keeps activations O(1) through a deep stack (cf. Fixup / zero-gamma)
RES_SCALE = 0.5


def _stem(g: GraphBuilder, cout: int) -> str:
    y = g.relu(g.conv_bn("input", 3, cout, 7, 2, name="conv1"), "relu1")
    return g.maxpool(y, 3, 2, 1)


def _shortcut(g: GraphBuilder, x: str, cin: int, cout: int, stride: int, name: str) -> str:
    if stride == 1 and cin == cout:
        return x
    return g.conv_bn(x, cin, cout, 1, stride, name=f"{name}.downsample")


def _basic_block(g: GraphBuilder, x: str, cin: int, cout: int, stride: int, name: str) -> str:
    y = g.relu(g.conv_bn(x, cin, cout, 3, stride, name=f"{name}.conv1"), f"{name}.relu1")
    y = g.conv_bn(y, cout, cout, 3, 1, name=f"{name}.conv2", gamma_scale=RES_SCALE)
    s = _shortcut(g, x, cin, cout, stride, name)
    return g.relu(g.add(y, s, f"{name}.add"), f"{name}.relu2")


def _bottleneck(g: GraphBuilder, x: str, cin: int, cout: int, stride: int, name: str) -> str:
    mid = cout // 4
    y = g.relu(g.conv_bn(x, cin, mid, 1, 1, name=f"{name}.conv1"), f"{name}.relu1")
    y = g.relu(g.conv_bn(y, mid, mid, 3, stride, name=f"{name}.conv2"), f"{name}.relu2")
    y = g.conv_bn(y, mid, cout, 1, 1, name=f"{name}.conv3", gamma_scale=RES_SCALE)
    s = _shortcut(g, x, cin, cout, stride, name)
    return g.relu(g.add(y, s, f"{name}.add"), f"{name}.relu3")


def _resnet(name: str, bottleneck: bool, layers: tuple[int, ...], input_size: int, width: int,
            num_classes: int, seed: int, batchnorm: bool) -> onnx.ModelProto:
    g = GraphBuilder(name, seed, batchnorm)
    x = _stem(g, width)
    block, expansion = (_bottleneck, 4) if bottleneck else (_basic_block, 1)
    cin = width
    for stage, n in enumerate(layers):
        cout = width * 2 ** stage * expansion
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            x = block(g, x, cin, cout, stride, f"layer{stage + 1}.{i}")
            cin = cout
    y = g.classifier(x, cin, num_classes)
    return g.build([("input", (1, 3, input_size, input_size))], [(y, (1, num_classes))], "image",
                   doc=f"{name}: input {input_size}, width {width}, {num_classes} classes, seed {seed}")


def resnet18(input_size: int = 224, width: int = 64, num_classes: int = 1000, seed: int = 0,
             batchnorm: bool = False) -> onnx.ModelProto:
    """ResNet-18-shaped network: 7x7/2 stem, maxpool, 4 stages of 2 basic blocks, GAP, Gemm.

    ``width`` is the first stage's channel count (64 in the paper); ``batchnorm=True``
    keeps BatchNormalization nodes instead of folding them into the convs.
    """
    return _resnet("resnet18", False, (2, 2, 2, 2), input_size, width, num_classes, seed, batchnorm)


def resnet50(input_size: int = 224, width: int = 64, num_classes: int = 1000, seed: int = 0,
             batchnorm: bool = False) -> onnx.ModelProto:
    """ResNet-50-shaped network (v1.5: stride in the 3x3): bottleneck stages (3, 4, 6, 3)."""
    return _resnet("resnet50", True, (3, 4, 6, 3), input_size, width, num_classes, seed, batchnorm)


def make_divisible(v: float, divisor: int = 8) -> int:
    """Round a channel count to a multiple of ``divisor`` (never below 90% of ``v``)."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


# (expansion t, channels c, repeats n, first stride s), as in the MobileNetV2 paper
MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenet_v2(input_size: int = 224, width_mult: float = 1.0, num_classes: int = 1000, seed: int = 0,
                 batchnorm: bool = False) -> onnx.ModelProto:
    """MobileNetV2: inverted residuals with depthwise 3x3 (group = channels), ReLU6 as
    Clip(0, 6), linear bottlenecks and residual adds; 1x1 head conv, GAP, Gemm."""
    g = GraphBuilder("mobilenet_v2", seed, batchnorm)
    cin = make_divisible(32 * width_mult)
    x = g.relu6(g.conv_bn("input", 3, cin, 3, 2, name="features.0"), "features.0.relu6")
    idx = 1
    for t, c, n, s in MOBILENET_V2_SETTINGS:
        cout = make_divisible(c * width_mult)
        for i in range(n):
            stride = s if i == 0 else 1
            name = f"features.{idx}"
            residual = stride == 1 and cin == cout
            hidden = round(cin * t)
            y = x
            if t != 1:
                y = g.relu6(g.conv_bn(y, cin, hidden, 1, name=f"{name}.expand"), f"{name}.expand.relu6")
            y = g.relu6(g.conv_bn(y, hidden, hidden, 3, stride, group=hidden, name=f"{name}.dw"),
                        f"{name}.dw.relu6")
            y = g.conv_bn(y, hidden, cout, 1, name=f"{name}.project",
                          gamma_scale=RES_SCALE if residual else 1.0)
            x = g.add(x, y, f"{name}.add") if residual else y
            cin = cout
            idx += 1
    last = make_divisible(1280 * max(1.0, width_mult))
    x = g.relu6(g.conv_bn(x, cin, last, 1, name=f"features.{idx}"), f"features.{idx}.relu6")
    y = g.classifier(x, last, num_classes)
    return g.build([("input", (1, 3, input_size, input_size))], [(y, (1, num_classes))], "image",
                   doc=f"mobilenet_v2: input {input_size}, width_mult {width_mult}, seed {seed}")


def small_cnn(input_size: int = 32, width: int = 16, num_classes: int = 10, seed: int = 0,
              batchnorm: bool = False) -> onnx.ModelProto:
    """A tiny CNN touching every DSA-relevant op: 3x3 convs (one strided), a depthwise 3x3
    with ReLU6, a pointwise conv, a residual add, max pooling, GAP and a Gemm classifier."""
    g = GraphBuilder("small_cnn", seed, batchnorm)
    w = width
    x = g.relu(g.conv_bn("input", 3, w, 3, 1, name="conv1"), "relu1")
    x = g.relu(g.conv_bn(x, w, 2 * w, 3, 2, name="conv2"), "relu2")
    y = g.relu6(g.conv_bn(x, 2 * w, 2 * w, 3, 1, group=2 * w, name="dwconv"), "dwconv.relu6")
    y = g.conv_bn(y, 2 * w, 2 * w, 1, 1, name="pwconv", gamma_scale=RES_SCALE)
    x = g.relu(g.add(x, y, "add"), "relu3")
    x = g.maxpool(x, 2, 2, 0)
    x = g.relu(g.conv_bn(x, 2 * w, 4 * w, 3, 1, name="conv3"), "relu4")
    y = g.classifier(x, 4 * w, num_classes)
    return g.build([("input", (1, 3, input_size, input_size))], [(y, (1, num_classes))], "image",
                   doc=f"small_cnn: input {input_size}, width {width}, seed {seed}")
