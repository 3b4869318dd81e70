"""QAT with per-group weight grids (``prepare(..., weight_group=G)``): linear layers on a
4-bit grid per G input rows with an offset, the DSA's grouped dense. The exported model,
compiled for the DSA, gives the prepared module's codes bit for bit (an MLP: no host op
between the layers; a tiny encoder: within the host float ops' tolerance), before and
after training; convolutions other than pointwise ones and layers whose input rows do
not split into whole groups stay per channel; a group the compiler cannot find is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from tvm import relax

import dsa_tvm
from dsa_tvm import qat
from dsa_tvm.qat.layers import WeightedLayer

from .nets import tiny_net
from .test_qat_transformer import _tiny_with_outliers, _tokens, trained_on_dsa


class Mlp(nn.Module):
    def __init__(self, k: int, h: int, n: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(k, h), nn.Linear(h, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def on_dsa(model, x: np.ndarray) -> tuple[np.ndarray, list[str]]:
    with dsa_tvm.options(offload="all"):
        ex = dsa_tvm.compile(model, "default", verbose=False)
    kinds = [type(ly).__name__ for r in dsa_tvm.last_compile_report().regions
             if r.target == "dsa" for ly in r.region.layers]
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy(), kinds


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.sampled_from([32, 64, 96]), h=st.integers(8, 80), n=st.integers(1, 40),
       lead=st.sampled_from([(2,), (1, 3), (2, 2)]), group=st.sampled_from([16, 32]),
       seed=st.integers(0, 1000))
def test_mlp_on_the_dsa_equals_the_prepared_module(k, h, n, lead, group, seed) -> None:
    torch.manual_seed(seed)
    net = Mlp(k, h, n).eval()
    x = torch.randn(*lead, k) * 2
    p = qat.prepare(net, (x,), [(x,)], bits=4, weight_group=group)
    groups = {m.name: m.group for m in p.modules() if isinstance(m, WeightedLayer)}
    assert groups == {"a": group, "b": group if h % group == 0 and h >= group else 0}
    with torch.no_grad():
        want = p(x).numpy()
    got, kinds = on_dsa(qat.export(p), x.numpy())
    np.testing.assert_array_equal(got, want)
    assert kinds.count("GroupedDense") == sum(1 for g in groups.values() if g)


def test_training_moves_the_grids_and_stays_exact() -> None:
    torch.manual_seed(0)
    net = Mlp(64, 64, 16).eval()
    data = [(torch.randn(8, 64),) for _ in range(4)]
    p = qat.prepare(net, data[1], data, bits=4, weight_group=32)
    layer = next(m for m in p.modules() if isinstance(m, WeightedLayer) and m.name == "a")
    before = layer.weight.detach().clone()
    opt = torch.optim.Adam([layer.weight], lr=3e-3)
    for step in range(5):   # straight-through gradients reach the float weights
        x = data[step % 4][0]
        loss = ((p(x) - net(x).detach()) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0
        opt.step()
    assert not torch.equal(before, layer.weight.detach())
    x = data[1][0]
    with torch.no_grad():
        want = p(x).numpy()
    np.testing.assert_array_equal(on_dsa(qat.export(p), x.numpy())[0], want)


def test_grouped_int4_is_closer_to_fp32_than_per_channel() -> None:
    """The reason for the mode: input rows of very different magnitudes (as a trained
    layer's are; all-MiniLM-L6-v2 at 4 bits: cosine 0.972 grouped, 0.915 per channel) cost
    a per-channel grid its small rows, a grid per group of rows keeps them."""
    torch.manual_seed(1)
    net = Mlp(128, 64, 16).eval()
    with torch.no_grad():
        net.a.weight.mul_(torch.tensor([0.05, 1.0, 0.2, 8.0]).repeat_interleave(32))
    x = torch.randn(32, 128)
    with torch.no_grad():
        ref = net(x)
        cos = {g: torch.nn.functional.cosine_similarity(
            qat.prepare(net, (x,), [(x,)], bits=4, weight_group=g)(x), ref).mean().item()
            for g in (0, 32)}
    assert 1 - cos[32] < 0.5 * (1 - cos[0]), cos


def test_tiny_encoder_with_smoothing_and_outliers_on_the_dsa() -> None:
    net = _tiny_with_outliers()
    ids, mask = _tokens(np.random.default_rng(0), 6, 8, 50)
    p = qat.prepare(net, (ids[:1], mask[:1]), [(ids, mask)], bits=4, smooth=0.5,
                    split_outliers=True, weight_group=16)
    on_dsa = trained_on_dsa(p, net, ids, mask)
    assert on_dsa.count("GroupedDense") == 12, on_dsa


def test_convolutions_stay_per_channel_and_bad_groups_are_refused() -> None:
    """Convolutions stay per channel, except a pointwise one (test_qat_grouped_conv.py)."""
    net = tiny_net()
    x = torch.randn(2, 3, 16, 16)
    p = qat.prepare(net, (x[:1],), [(x,)], bits=4, weight_group=16)
    groups = {m.name: (m.kind, m.group) for m in p.modules() if isinstance(m, WeightedLayer)}
    assert all(g == 0 for name, (kind, g) in groups.items() if kind == "conv2d" and name != "pw")
    assert groups["pw"] == ("conv2d", 16)
    assert groups["fc"] == ("linear", 16)
    with pytest.raises(qat.QatError, match="weight_group=24.*16, 32, 64, 128"):
        qat.prepare(net, (x[:1],), bits=4, weight_group=24)


def test_pruning_and_analog_reads_leave_grouped_layers_alone() -> None:
    """A pruned zero is no code of a grid with an offset, and crossbars read per-channel
    codes: grouped layers stay dense and digital, named in the reports."""
    torch.manual_seed(0)
    net = Mlp(64, 64, 16).eval()
    x = torch.randn(4, 64)
    p = qat.prepare(net, (x,), [(x,)], bits=4, weight_group=32)
    rep = qat.prune(p, 2, 4)
    assert {name for name, _ in rep.dense} >= {"a", "b"}
    assert all("per group of 32" in why for _, why in rep.dense)
    analog = qat.enable_analog(p, "cim-pcm", seed=0)
    assert {name for name, _ in analog.digital} == {"a", "b"}
    qat.disable_analog(p)
