"""Small PyTorch networks with every layer kind QAT mirrors, and a DSA run helper."""

from __future__ import annotations

import numpy as np
import torch
import tvm
from torch import nn
from tvm import relax

import dsa_tvm


class TinyNet(nn.Module):
    """conv+BN+ReLU, asymmetric zero pad + strided conv, depthwise+BN+ReLU6, 1x1 conv,
    residual add, global average pool, flatten, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.b1 = nn.BatchNorm2d(16)
        self.pad = nn.ZeroPad2d((0, 1, 0, 1))
        self.down = nn.Conv2d(16, 16, 3, stride=2, bias=False)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.b2 = nn.BatchNorm2d(16)
        self.pw = nn.Conv2d(16, 16, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        y = self.down(self.pad(y))
        z = nn.functional.relu6(self.b2(self.dw(y)))
        y = y + self.pw(z)
        return self.fc(torch.flatten(self.pool(y), 1))


def tiny_net(seed: int = 0) -> TinyNet:
    torch.manual_seed(seed)
    net = TinyNet()
    for b in (net.b1, net.b2):
        b.running_mean.uniform_(-0.5, 0.5)
        b.running_var.uniform_(0.5, 2.0)
        b.weight.data.uniform_(0.5, 1.5)
        b.bias.data.uniform_(-0.2, 0.2)
    return net.eval()


def run_on_dsa(model, x: np.ndarray, hw="default") -> np.ndarray:
    """The ONNX model compiled with every region on the DSA (``hw``: a preset name or a
    HardwareConfig), run on the simulator; ``dsa_tvm.last_compile_report()`` tells how."""
    with dsa_tvm.options(offload="all"):
        ex = dsa_tvm.compile(model, hw, verbose=False)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(np.ascontiguousarray(x, np.float32))).numpy()


class PoolNet(nn.Module):
    """Max pool and a ReLU / ReLU6 / Hardtanh that no layer before can absorb (its input
    has two readers)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, 8, 1)
        self.act = nn.Hardtanh(-0.5, 0.75)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(self.c1(x))
        a = self.c2(y)  # three readers: no activation folds into c2
        b = torch.relu(a)
        c = self.act(nn.functional.relu6(a))
        return self.c3(b) + c + a


class TinyViT(nn.Module):
    """Patches (a strided conv), one post-norm attention block with its residual, mean
    over the tokens, a classifier: what ``--quantize-norms --wide-norms`` acts on."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, stride=4)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(self.patch(x).flatten(2).transpose(1, 2))
        att = torch.softmax(torch.matmul(self.q(h), self.k(h).transpose(-1, -2)), dim=-1)
        h = self.ln2(self.o(torch.matmul(att, self.v(h))) + h)
        return self.head(h.mean(1))
