"""PTQ's input split in QAT: a linear layer's outlier input features (a LayerNorm gain
outlier, as BERT's have) in an FP32 side path, the grid holding the rest.

Checked: the split leaves the FP32 function; it takes the features PTQ's predicate
takes; the prepared module gets closer to FP32; the export runs on the DSA as the
prepared module computes (integer layers exact, host float ops within their rounding),
per channel, at 4 bits and per group; a value whose readers' outputs are read as
integers is not split (the side path's FP32 sum is no grid value).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dsa_tvm import qat
from dsa_tvm.models.minilm_torch import MiniLM
from dsa_tvm.qat.layers import Grid, WeightedLayer
from dsa_tvm.quant.outliers import OutlierOptions, outlier_channels

from .test_qat_transformer import _tokens, trained_on_dsa

FEATURE = 3   # the hidden feature whose LayerNorm gain is an outlier


def _tiny_with_input_outliers() -> MiniLM:
    """A tiny encoder whose attention LayerNorm has one gain ~40x the rest: the FFN's
    first layer reads that feature far larger than the others."""
    torch.manual_seed(0)
    net = MiniLM(vocab=50, hidden=32, layers=2, heads=4, inner=64, positions=16).eval()
    with torch.no_grad():
        for layer in net.layers:
            layer.attn_norm.weight[FEATURE] *= 40.0
    return net


def _layers(p) -> dict[str, WeightedLayer]:
    return {m.name: m for m in p.modules() if isinstance(m, WeightedLayer)}


def test_input_outliers_split_as_ptq_and_the_fp32_function_is_kept():
    net = _tiny_with_input_outliers()
    ids, mask = _tokens(np.random.default_rng(0), 6, 8, 50)
    p = qat.prepare(net, (ids[:1], mask[:1]), [(ids, mask)], split_outliers=True)
    assert p.qat_report.side_inputs == {"layers.0.inner": [FEATURE],
                                        "layers.1.inner": [FEATURE]}
    assert "input features [3]" in p.qat_report.summary()
    # PTQ's predicate over the FFN input's FP32 magnitudes picks the same feature
    seen = {}
    hook = net.layers[0].inner.register_forward_hook(
        lambda m, i, o: seen.update(x=i[0].abs().reshape(-1, 32).amax(0).numpy()))
    with torch.no_grad():
        net(ids, mask)
    hook.remove()
    assert outlier_channels(seen["x"], OutlierOptions()).tolist() == [FEATURE]
    inner = _layers(p)["layers.0.inner"]
    assert inner.inputs[0].mask[FEATURE] == 0 and inner.inputs[0].mask.sum() == 31
    assert not inner.masked_weight()[:, FEATURE].any()   # per channel: zero in the grid
    qat.set_mode(p, "float")
    with torch.no_grad():   # the split computes the same function
        np.testing.assert_allclose(p(ids, mask).numpy(), net(ids, mask).numpy(), atol=2e-6)


def test_input_split_brings_the_prepared_module_closer_to_fp32():
    net = _tiny_with_input_outliers()
    ids, mask = _tokens(np.random.default_rng(1), 8, 8, 50)
    with torch.no_grad():
        ref = net(ids, mask)
        gap = {split: 1 - torch.nn.functional.cosine_similarity(
            qat.prepare(net, (ids[:1], mask[:1]), [(ids, mask)],
                        split_outliers=split)(ids, mask), ref).mean().item()
            for split in (False, True)}
    assert gap[True] < 0.5 * gap[False], gap


@pytest.mark.parametrize("bits, group", [(8, 0), (4, 0), (4, 16)])
def test_input_split_on_the_dsa_equals_the_prepared_module(bits, group):
    net = _tiny_with_input_outliers()
    ids, mask = _tokens(np.random.default_rng(2), 6, 8, 50)
    p = qat.prepare(net, (ids[:1], mask[:1]), [(ids, mask)], bits=bits, weight_group=group,
                    split_outliers=True)
    assert set(p.qat_report.side_inputs) == {"layers.0.inner", "layers.1.inner"}
    if group:   # per group the weights stay: the input is zero there, the grid unwidened
        assert _layers(p)["layers.0.inner"].masked_weight()[:, FEATURE].any()
    on_dsa = trained_on_dsa(p, net, ids, mask)
    assert on_dsa.count("GroupedDense" if group else "Dense") >= 8, on_dsa


class _Stacked(nn.Module):
    """LayerNorm -> linear -> ReLU -> linear: the first layer's output is read as
    integers by the second, so its input may not get an FP32 side path."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 8)
        with torch.no_grad():
            self.norm.weight[2] = 60.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(self.norm(x))))


def test_a_value_whose_readers_feed_integer_layers_is_not_split():
    torch.manual_seed(0)
    net = _Stacked().eval()
    x = torch.randn(16, 16)
    p = qat.prepare(net, (x[:1],), [(x,)], split_outliers=True)
    assert p.qat_report.side_inputs == {}
    assert all(g.mask is None for g in p.modules() if isinstance(g, Grid))


class _OutlierThenReLU(nn.Module):
    """linear (output channel 3 ~100x the rest) -> ReLU -> linear: the first layer's
    output is read as integers, so its outlier channel may not leave its grid."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 8)
        with torch.no_grad():
            self.a.weight[3] *= 100.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_an_output_read_as_integers_keeps_its_outlier_channels():
    """An FP32 side path there would be clamped back onto the narrowed grid by the ReLU's
    restated grid (cosine 0.54 against FP32 when it was split; 0.98 kept whole)."""
    torch.manual_seed(0)
    net = _OutlierThenReLU().eval()
    x = torch.randn(64, 16)
    p = qat.prepare(net, (x[:1],), [(x,)], split_outliers=True)
    assert p.qat_report.side_paths == {}
    with torch.no_grad():
        cos = torch.nn.functional.cosine_similarity(p(x), net(x)).mean().item()
    assert cos > 0.97, cos


def test_both_splits_from_one_pass_equal_the_two_passes_in_turn():
    """``split_all`` (what ``prepare`` runs) reads the FP32 magnitudes of both splits in
    one pass over the calibration batches and splits exactly what the input split and
    then the output split did, each in a pass of its own."""
    from dsa_tvm.qat.layers import set_mode
    from dsa_tvm.qat.outliers import split_all, split_input_outliers, split_outliers

    net = _tiny_with_input_outliers()
    with torch.no_grad():                      # an output outlier too: attention's out
        for layer in net.layers:
            layer.attn_out.weight[5] *= 60.0
    ids, mask = _tokens(np.random.default_rng(1), 6, 8, 50)
    batches = [(ids[:3], mask[:3]), (ids[3:], mask[3:])]
    a, b = (qat.prepare(net, (ids[:1], mask[:1]), batches) for _ in range(2))
    for p in (a, b):
        set_mode(p, "float")
    want = (split_input_outliers(a, batches), split_outliers(a, batches))
    calls = []
    hook = b.register_forward_pre_hook(lambda m, args: calls.append(1))
    got = split_all(b, batches)
    hook.remove()
    assert got == want and got[0] and got[1], (got, want)
    assert len(calls) == len(batches)          # one pass
    for la, lb in zip(_layers(a).values(), _layers(b).values(), strict=True):
        for side in ("side_rows", "side_cols"):
            x, y = getattr(la, side), getattr(lb, side)
            assert (x is None and y is None) or torch.equal(x, y), (la.name, side)
    masks = [[g.mask for g in p.modules() if isinstance(g, Grid)] for p in (a, b)]
    assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(*masks))
    x = (ids, mask)
    with torch.no_grad():
        torch.testing.assert_close(a(*x), b(*x), rtol=0, atol=0)
