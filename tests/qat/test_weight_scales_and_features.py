"""Learned per-channel weight scales and feature distillation (``qat.features``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dsa_tvm import qat
from dsa_tvm.qat.errors import NonFiniteError, QatError
from dsa_tvm.qat.features import captured, feature_loss, fp32_copy
from dsa_tvm.qat.layers import WeightedLayer
from dsa_tvm.qat.precision import weighted_layers

from .test_training import _data, _prepared


def _layers(p) -> list[WeightedLayer]:
    return list(weighted_layers(p).values())


@pytest.mark.parametrize("bits", [8, 4])
def test_learned_weight_scales_start_at_ptqs(bits):
    _, plain = _prepared(bits)
    _, learned = _prepared(bits, learn_weight_scales=True)
    for a, b in zip(_layers(plain), _layers(learned)):
        assert b.weight_gain.requires_grad and not a.weight_gain.requires_grad
        for u, v in zip(a.quant_params(), b.quant_params()):
            np.testing.assert_array_equal(u, v)


def test_a_negative_weight_gain_clips_the_largest_weights_onto_a_finer_grid():
    _, p = _prepared(4, learn_weight_scales=True)
    layer = _layers(p)[2]
    s0, q0, _, _ = layer.quant_params()
    layer.weight_gain.data.fill_(-0.5)
    s1, q1, _, _ = layer.quant_params()
    np.testing.assert_allclose(s1, np.maximum(s0 * 0.5, s1.min()), rtol=1e-6)
    w = layer.masked_weight().detach().numpy()
    want = np.clip(np.round(w / s1.reshape(-1, *[1] * (w.ndim - 1))), -7, 7)
    np.testing.assert_array_equal(q1, want)
    assert (np.abs(q1) == 7).sum() > (np.abs(q0) == 7).sum()  # saturated, not wrapped


@pytest.mark.parametrize("gain", [-1.0, -3.0, float("nan")])
def test_a_broken_weight_gain_names_the_layer_and_the_fix(gain):
    _, p = _prepared(4, learn_weight_scales=True)
    layer = _layers(p)[0]
    layer.weight_gain.data[0] = gain
    with pytest.raises(NonFiniteError, match=f"layer {layer.name}.*lower"):
        layer.quant_params()


def test_training_moves_the_weight_scales_at_scale_lr():
    net, p = _prepared(4, learn_weight_scales=True, bias_correction=False)
    res = qat.distill(p, net, _data(6, 2), _data(2, 3), steps=20, lr=0.0, scale_lr=1e-2,
                      eval_every=5, patience=10, show_progress=False)
    gains = torch.cat([m.weight_gain.detach() for m in _layers(p)])
    assert res.best_step > 0 and res.best_heldout < res.heldout[0][1]
    assert (gains != 0).any() and gains.abs().max() <= 20 * 1e-2 * 1.01  # Adam: ~lr a step


def test_the_feature_teacher_is_the_fp32_network_and_stays_fixed():
    net, p = _prepared(4)
    ref = fp32_copy(p)
    x = _data(1, 5)[0][0]
    with torch.no_grad(), captured(ref) as outs:
        y = ref(x)
    np.testing.assert_allclose(y.numpy(), net(x).detach().numpy(), rtol=1e-4, atol=1e-4)
    assert sorted(outs) == sorted(m.name for m in _layers(p))
    for m in _layers(p):
        m.weight.data.mul_(2)  # training the student never moves the teacher
    with torch.no_grad():
        np.testing.assert_array_equal(ref(x).numpy(), y.numpy())


def test_feature_loss_is_normalized_per_layer():
    t = {"a": torch.ones(4) * 100, "b": torch.ones(4) * 0.01}
    assert float(feature_loss(t, t)) == 0.0
    s = {"a": torch.zeros(4), "b": torch.zeros(4)}  # zeros: 1.0 for every layer
    assert float(feature_loss(s, t)) == pytest.approx(1.0)


def _layer_error(p, ref, x: torch.Tensor) -> float:
    with torch.no_grad(), captured(ref) as want, captured(p) as got:
        ref(x)
        p(x)
    return float(feature_loss(got, want))


def test_feature_distillation_is_seeded_and_brings_the_layers_closer():
    runs = []
    x = _data(1, 7)[0][0]
    for _ in range(2):
        net, p = _prepared(4, learn_scales=True, bias_correction=False)
        ref = fp32_copy(p)
        before = _layer_error(p, ref, x)
        res = qat.distill(p, net, _data(6, 2), _data(2, 3), steps=20, lr=1e-4, eval_every=10,
                          patience=5, show_progress=False, features=1.0)
        runs.append(([h for _, h in res.heldout], _layer_error(p, ref, x)))
        assert runs[-1][1] < before
    assert runs[0] == runs[1]


def test_a_negative_feature_weight_is_refused():
    net, p = _prepared(8)
    with pytest.raises(QatError, match="features"):
        qat.distill(p, net, _data(2, 2), _data(1, 3), steps=1, features=-1.0)


@pytest.mark.parametrize("clip", ["max", "mse"])
def test_setting_widths_after_prepare_is_preparing_at_those_widths(clip):
    """choose_bits / sensitivity set widths on a prepared module: its clip and bias
    correction must then be the new width's, not the old one's."""
    _, wide = _prepared(8, weight_clip=clip)
    qat.set_bits(wide, {m.name: 4 for m in _layers(wide)})
    _, narrow = _prepared(4, weight_clip=clip)
    for a, b in zip(_layers(wide), _layers(narrow)):
        np.testing.assert_array_equal(a.bias_shift.numpy(), b.bias_shift.numpy())
        for u, v in zip(a.quant_params(), b.quant_params()):
            np.testing.assert_array_equal(u, v)
    x = _data(1, 9)[0][0]
    with torch.no_grad():
        np.testing.assert_array_equal(wide(x).numpy(), narrow(x).numpy())


def test_mse_clipping_rounds_4_bit_weights_closer_and_leaves_8_bit_ones():
    _, plain = _prepared(4, layer_bits={"fc": 8})
    _, mse = _prepared(4, layer_bits={"fc": 8}, weight_clip="mse")
    clipped = 0
    for a, b in zip(_layers(plain), _layers(mse)):
        w = a.masked_weight().detach().numpy().reshape(len(a.weight), -1).astype(np.float64)
        err = []
        for layer in (a, b):
            s, q, _, _ = layer.quant_params()
            err.append(((q.reshape(len(w), -1) * s[:, None].astype(np.float64) - w) ** 2).sum(1))
        gain = b.weight_gain.detach().numpy()
        if b.bits == 8:
            assert (gain == 0).all()
            continue
        assert (gain <= 0).all() and (err[1] <= err[0] * (1 + 1e-9)).all()
        clipped += int((gain < 0).sum())
    assert clipped > 0


def test_an_unknown_weight_clip_is_refused():
    with pytest.raises(QatError, match="weight_clip"):
        _prepared(4, weight_clip="percentile")
