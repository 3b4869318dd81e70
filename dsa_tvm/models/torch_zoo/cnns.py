"""The zoo's convolutional architectures in plain PyTorch (no torchvision: its only wheel
here is a CUDA build), shaped like the published networks, small inputs.

Each builder takes its size knobs and returns an ``nn.Module`` in eval mode whose
forward takes one ``(1, C, H, W)`` (or ``(1, C, L)``) float tensor and returns one
tensor. Weights are PyTorch's default init under the caller's seed; batch norms get
seeded random statistics so folding them is not a no-op.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
            act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    """Conv (no bias) + BatchNorm + activation, 'same' padding."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


def randomize_norms(model: nn.Module, gen: torch.Generator) -> nn.Module:
    """Seeded running statistics and affine parameters for every batch norm (fresh ones
    are the identity), then eval mode."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d):
            c = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(c, generator=gen) * 0.1)
    return model.eval()


# ----------------------------------------------------------------------------- ResNet-18
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, cout, 3, stride), conv_bn(cout, cout, 3, act=None))
        self.short = (nn.Identity() if stride == 1 and cin == cout
                      else conv_bn(cin, cout, 1, stride, act=None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.short(x))


class ResNet18(nn.Module):
    def __init__(self, width: int = 64, num_classes: int = 100) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, width, 7, 2), nn.MaxPool2d(3, 2, 1)]
        cin = width
        for stage in range(4):
            cout = width * 2 ** stage
            for i in range(2):
                layers.append(BasicBlock(cin, cout, 2 if stage and i == 0 else 1))
                cin = cout
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# ----------------------------------------------------------------------------- MobileNetV2
class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        layers = [conv_bn(cin, mid, 1, act=nn.ReLU6)] if expand != 1 else []
        layers += [conv_bn(mid, mid, 3, stride, groups=mid, act=nn.ReLU6),
                   conv_bn(mid, cout, 1, act=None)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


def _ch(c: float, div: int = 8) -> int:
    return max(div, int(c + div / 2) // div * div)


class MobileNetV2(nn.Module):
    # (expansion, channels, repeats, stride) as in the paper
    CFG = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
           (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, width_mult: float = 1.0, num_classes: int = 100) -> None:
        super().__init__()
        cin = _ch(32 * width_mult)
        layers: list[nn.Module] = [conv_bn(3, cin, 3, 2, act=nn.ReLU6)]
        for t, c, n, s in self.CFG:
            cout = _ch(c * width_mult)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        last = _ch(1280 * max(1.0, width_mult))
        layers.append(conv_bn(cin, last, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# ----------------------------------------------------------------------------- MobileNetV3 / EfficientNet
class SqueezeExcite(nn.Module):
    def __init__(self, c: int, squeeze: int, act: type[nn.Module], gate: type[nn.Module]) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)
        self.act, self.gate = act(), gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


class MBConv(nn.Module):
    """Expand 1x1 -> depthwise kxk -> optional squeeze-excite -> project 1x1 (+ residual)."""

    def __init__(self, cin: int, mid: int, cout: int, k: int, stride: int,
                 act: type[nn.Module], se: SqueezeExcite | None) -> None:
        super().__init__()
        layers = [conv_bn(cin, mid, 1, act=act)] if mid != cin else []
        layers.append(conv_bn(mid, mid, k, stride, groups=mid, act=act))
        if se is not None:
            layers.append(se)
        layers.append(conv_bn(mid, cout, 1, act=None))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV3Small(nn.Module):
    # (kernel, expanded, out, squeeze-excite, hardswish, stride) as in the paper
    CFG = [(3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2), (3, 88, 24, False, False, 1),
           (5, 96, 40, True, True, 2), (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
           (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1), (5, 288, 96, True, True, 2),
           (5, 576, 96, True, True, 1), (5, 576, 96, True, True, 1)]

    def __init__(self, num_classes: int = 100) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 16, 3, 2, act=nn.Hardswish)]
        cin = 16
        for k, mid, cout, se, hs, s in self.CFG:
            act = nn.Hardswish if hs else nn.ReLU
            block_se = SqueezeExcite(mid, _ch(mid // 4), nn.ReLU, nn.Hardsigmoid) if se else None
            layers.append(MBConv(cin, mid, cout, k, s, act, block_se))
            cin = cout
        layers.append(conv_bn(cin, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class EfficientNetB0(nn.Module):
    # (expansion, kernel, stride, out, repeats) as in the paper
    CFG = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
           (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]

    def __init__(self, num_classes: int = 100) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 32, 3, 2, act=nn.SiLU)]
        cin = 32
        for t, k, s, cout, n in self.CFG:
            for i in range(n):
                se = SqueezeExcite(cin * t, max(1, cin // 4), nn.SiLU, nn.Sigmoid)
                layers.append(MBConv(cin, cin * t, cout, k, s if i == 0 else 1, nn.SiLU, se))
                cin = cout
        layers.append(conv_bn(cin, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(1280, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# ----------------------------------------------------------------------------- YOLO-style
class C2f(nn.Module):
    """Split, n bottlenecks chained on one half, concat everything, 1x1 (YOLOv8's block)."""

    def __init__(self, cin: int, cout: int, n: int = 1) -> None:
        super().__init__()
        half = cout // 2
        self.cv1 = conv_bn(cin, 2 * half, 1, act=nn.SiLU)
        self.blocks = nn.ModuleList(
            nn.Sequential(conv_bn(half, half, 3, act=nn.SiLU), conv_bn(half, half, 3, act=nn.SiLU))
            for _ in range(n))
        self.cv2 = conv_bn((2 + n) * half, cout, 1, act=nn.SiLU)
        self.half = half

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv1(x)
        parts = [y[:, :self.half], y[:, self.half:]]
        for b in self.blocks:
            parts.append(parts[-1] + b(parts[-1]))
        return self.cv2(torch.cat(parts, 1))


class SPPF(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.cv1, self.cv2 = conv_bn(c, c // 2, 1, act=nn.SiLU), conv_bn(2 * c, c, 1, act=nn.SiLU)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.pool(y[-1]))
        return self.cv2(torch.cat(y, 1))


def _leaky() -> nn.Module:
    return nn.LeakyReLU(0.1)


class YoloStyle(nn.Module):
    """Backbone (SiLU convs, C2f, SPPF), a two-scale feature pyramid (nearest upsample +
    concat), leaky-ReLU detection heads, predictions concatenated over both scales."""

    def __init__(self, width: int = 16, num_outputs: int = 21) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(conv_bn(3, w, 3, 2, act=nn.SiLU), conv_bn(w, 2 * w, 3, 2, act=nn.SiLU),
                                  C2f(2 * w, 2 * w))
        self.p3 = nn.Sequential(conv_bn(2 * w, 4 * w, 3, 2, act=nn.SiLU), C2f(4 * w, 4 * w))
        self.p4 = nn.Sequential(conv_bn(4 * w, 8 * w, 3, 2, act=nn.SiLU), C2f(8 * w, 8 * w),
                                SPPF(8 * w))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.fuse3 = C2f(12 * w, 4 * w)
        self.down = conv_bn(4 * w, 4 * w, 3, 2, act=nn.SiLU)
        self.fuse4 = C2f(12 * w, 8 * w)
        self.head3 = nn.Sequential(conv_bn(4 * w, 4 * w, 3, act=_leaky), nn.Conv2d(4 * w, num_outputs, 1))
        self.head4 = nn.Sequential(conv_bn(8 * w, 4 * w, 3, act=_leaky), nn.Conv2d(4 * w, num_outputs, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p3 = self.p3(self.stem(x))
        p4 = self.p4(p3)
        f3 = self.fuse3(torch.cat([self.up(p4), p3], 1))
        f4 = self.fuse4(torch.cat([self.down(f3), p4], 1))
        o3, o4 = self.head3(f3), self.head4(f4)
        return torch.cat([o3.flatten(2), o4.flatten(2)], 2)


# ----------------------------------------------------------------------------- UNet
class UNet(nn.Module):
    """Three-level UNet: double 3x3 convs, max-pool down, ConvTranspose2d 2x2 up, skip concat."""

    def __init__(self, width: int = 16, in_ch: int = 3, classes: int = 4) -> None:
        super().__init__()
        w = width

        def double(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(conv_bn(cin, cout, 3), conv_bn(cout, cout, 3))

        self.enc = nn.ModuleList([double(in_ch, w), double(w, 2 * w), double(2 * w, 4 * w)])
        self.mid = double(4 * w, 8 * w)
        self.ups = nn.ModuleList(nn.ConvTranspose2d(c, c // 2, 2, 2) for c in (8 * w, 4 * w, 2 * w))
        self.dec = nn.ModuleList([double(8 * w, 4 * w), double(4 * w, 2 * w), double(2 * w, w)])
        self.out = nn.Conv2d(w, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for e in self.enc:
            x = e(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.mid(x)
        for up, dec, skip in zip(self.ups, self.dec, reversed(skips)):
            x = dec(torch.cat([up(x), skip], 1))
        return self.out(x)


# ----------------------------------------------------------------------------- ConvNeXt
class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (permute, normalize, permute back)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7 -> channels-last LayerNorm -> Linear 4x -> GELU -> Linear -> layer
    scale -> residual."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, dims: tuple[int, ...] = (32, 64, 128, 256), depths: tuple[int, ...] = (1, 1, 3, 1),
                 num_classes: int = 100) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6)]
        for i, (d, n) in enumerate(zip(dims, depths)):
            if i:
                layers += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], d, 2, 2)]
            layers += [ConvNeXtBlock(d) for _ in range(n)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.fc = nn.Linear(dims[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.features(x).mean((2, 3))))


# ----------------------------------------------------------------------------- Conv1d audio
class AudioConv1d(nn.Module):
    """M5-style raw-waveform classifier: strided Conv1d front end, Conv1d+BN+ReLU+MaxPool1d
    stages, global average pool, Linear."""

    def __init__(self, width: int = 32, num_classes: int = 35) -> None:
        super().__init__()
        w = width

        def stage(cin: int, cout: int, k: int, stride: int = 1) -> list[nn.Module]:
            return [nn.Conv1d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm1d(cout),
                    nn.ReLU(), nn.MaxPool1d(4)]

        self.features = nn.Sequential(*stage(1, w, 80, 16), *stage(w, w, 3), *stage(w, 2 * w, 3),
                                      nn.Conv1d(2 * w, 2 * w, 3, 1, 1), nn.ReLU())
        self.fc = nn.Linear(2 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean(2))
