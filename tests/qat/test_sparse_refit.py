"""SparseGPT pruning (``prune(..., method="sparsegpt")``): the masks are the array's N:M,
the refit lowers the output error where the inputs are correlated, and it is magnitude
pruning exactly where they are not."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm import qat
from dsa_tvm.qat.errors import QatError
from dsa_tvm.qat.precision import output_cosine, weighted_layers
from dsa_tvm.qat.sparse_refit import input_moments, refit_layer
from dsa_tvm.qat.sparsity import GROUP_SIZES, is_n_m, n_m_mask, report

from .nets import run_on_dsa, tiny_net


def _data(n: int, seed: int, scale: float = 1.0) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 3, 16, 16, generator=g) * scale,) for _ in range(n)]


def _flat(w: np.ndarray) -> np.ndarray:
    """[out, taps * channels], tap-major: the refit's column order."""
    o, c = w.shape[:2]
    return np.moveaxis(w.reshape(o, c, -1), 1, 2).reshape(o, -1)


@st.composite
def _layers(draw):
    m = draw(st.sampled_from(GROUP_SIZES))
    n = draw(st.integers(1, m - 1))
    o, c = draw(st.integers(1, 5)), draw(st.integers(1, 37))
    taps = draw(st.sampled_from([(), (1, 1), (2, 3)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return rng.standard_normal((o, c, *taps)), n, m, rng


@settings(max_examples=60, deadline=None)
@given(case=_layers())
def test_on_uncorrelated_inputs_the_refit_is_magnitude_pruning(case):
    """H = I: no weight can stand in for another, so SparseGPT keeps the N largest of each
    group unchanged, as ``n_m_mask`` does (convolutions: per tap, along the channels)."""
    w, n, m, _ = case
    cols = _flat(w).shape[1]
    new, keep = refit_layer(SimpleNamespace(weight=torch.from_numpy(w)),
                            torch.eye(cols, dtype=torch.float64), n, m)
    want = n_m_mask(w, n, m, axis=1)
    np.testing.assert_array_equal(keep.numpy(), want)
    np.testing.assert_allclose(new.numpy(), w * want, rtol=0, atol=1e-12)


def _correlated(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Inputs driven by a few latent factors plus a little noise (as a layer's are)."""
    return rng.standard_normal((rows, cols // 4)) @ rng.standard_normal((cols // 4, cols)) \
        + 0.3 * rng.standard_normal((rows, cols))


@settings(max_examples=40, deadline=None)
@given(case=_layers())
def test_on_correlated_inputs_the_masks_are_still_the_arrays_n_m(case):
    """Every group holds at most N kept weights, and only kept weights are nonzero."""
    w, n, m, rng = case
    cols = _flat(w).shape[1]
    x = _correlated(rng, 200, max(cols, 4))[:, :cols]
    new, keep = refit_layer(SimpleNamespace(weight=torch.from_numpy(w)),
                            torch.from_numpy(x.T @ x), n, m)
    new, keep = new.numpy(), keep.numpy()
    assert is_n_m(keep, n, m, axis=1) and is_n_m(new, n, m, axis=1)
    assert np.all(new[~keep] == 0) and np.isfinite(new).all()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n, m", [(2, 4), (1, 4), (4, 8)])
def test_on_correlated_inputs_the_refit_costs_far_less_output_than_magnitude(seed, n, m):
    """A layer-sized case (64 outputs, 96 inputs): the output error on those inputs,
    measured in numpy, is well below magnitude pruning's. (SparseGPT is greedy: on a
    handful of columns it can lose to magnitude pruning, so this is not a property of
    every shape.)"""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((64, 96))
    x = _correlated(rng, 2000, 96)
    new, _ = refit_layer(SimpleNamespace(weight=torch.from_numpy(w)),
                         torch.from_numpy(x.T @ x), n, m)

    def error(v: np.ndarray) -> float:
        return float(np.sum((x @ (w - v).T) ** 2))

    assert error(new.numpy()) < 0.7 * error(w * n_m_mask(w, n, m, axis=1))


def test_the_moments_are_the_layers_own_im2col():
    """``tr(dW H dW^T)`` equals the summed square of the layer's own convolution of its
    captured input by dW: stride 2 with the asymmetric zero pad, a 1x1 conv, a linear."""
    _, cal, p = _prepared()
    layers = weighted_layers(p)
    for name in ("down", "pw", "fc"):
        la = layers[name]
        seen: list[torch.Tensor] = []
        handle = la.register_forward_pre_hook(lambda _m, a, seen=seen: seen.append(a[0].detach()))
        with torch.no_grad():
            for b in cal:
                p(*b)
        handle.remove()
        h = input_moments(p, [la], cal)[name]
        dw = torch.randn_like(la.weight, dtype=torch.float64)
        want = sum(float((la._op(x.double(), dw, None) ** 2).sum()) for x in seen)
        flat = torch.from_numpy(_flat(dw.numpy()))
        got = float(((flat @ h) * flat).sum())
        assert got == pytest.approx(want, rel=1e-9), name


def _prepared(**kw):
    net = tiny_net()
    cal = _data(3, 1)
    return net, cal, qat.prepare(net, (cal[0][0][:1],), cal, **kw)


def test_sparsegpt_prunes_the_same_layers_closer_to_fp32_and_runs_bit_for_bit():
    net, cal, p_mag = _prepared()
    _, _, p_gpt = _prepared()
    data = _data(8, 5)
    rep_mag = qat.prune(p_mag, 2, 4, calibration_data=cal)
    rep_gpt = qat.prune(p_gpt, 2, 4, calibration_data=cal, method="sparsegpt", refit_data=data)
    assert [la.is_pruned for la in rep_gpt.layers] == [la.is_pruned for la in rep_mag.layers]
    assert all(la.codes_n <= 2 for la in rep_gpt.layers if la.is_pruned)
    assert rep_gpt.pruned_share == rep_mag.pruned_share
    held = _data(4, 9)
    ref = [net(*b).detach() for b in held]
    assert output_cosine(p_gpt, held, ref) > output_cosine(p_mag, held, ref)
    assert report(p_gpt) == rep_gpt
    x = held[0][0][:1]
    with torch.no_grad():
        want = p_gpt(x).numpy()
    from dsa_tvm.hw.config import load_config, with_overrides
    sparse_part = with_overrides(load_config("default"), ["array.sparsity=2:4"])
    np.testing.assert_array_equal(run_on_dsa(qat.export(p_gpt), x.numpy(), sparse_part), want)


def _nan_batch() -> list[tuple[torch.Tensor]]:
    x = _data(1, 3)[0][0].clone()
    x[0, 0, 0, 0] = float("nan")
    return [(x,)]


@pytest.mark.parametrize("bad, match", [
    (lambda p: qat.prune(p, 2, 4, method="sparsegpt", refit_data=_nan_batch()),
     "batch 0 holds NaN or infinite values; pass finite inputs"),
    (lambda p: qat.prune(p, 2, 4, method="sparsegpt", refit_data=_data(1, 3, 1e200)),
     "NaN or infinite values"),
    (lambda p: qat.prune(p, 2, 4, method="sparsegpt", refit_data=[(torch.zeros(2, 5, 16, 16),)]),
     "does not run on the refit data .*shaped as prepare's example inputs"),
    (lambda p: qat.prune(p, 2, 4, method="sparsegpt", moments={}),
     r"moments has no input moments for \['down', 'pw', 'fc'\]"),
    (lambda p: qat.prune(p, 2, 4, method="obs"), "method='obs'"),
    (lambda p: qat.prune(p, 2, 4, method="sparsegpt"), "pass calibration_data"),
    (lambda p: qat.prune(p, 2, 4, method="sparsegpt", refit_data=[]), "pass calibration_data"),
])
def test_hostile_input_gets_a_clear_error(bad, match):
    _, _, p = _prepared()
    with pytest.raises(QatError, match=match):
        bad(p)
    assert all(la.mask is None for la in weighted_layers(p).values())


def test_non_finite_moments_are_refused_by_layer_and_nothing_changes():
    _, cal, p = _prepared()
    layers = weighted_layers(p)
    moments = input_moments(p, [layers[k] for k in ("down", "pw", "fc")], cal)
    moments["pw"] = moments["pw"] * float("inf")
    with pytest.raises(QatError, match="layer pw: its inputs on the refit data hold NaN or "
                                       "infinite values"):
        qat.prune(p, 2, 4, method="sparsegpt", moments=moments)
    assert all(la.mask is None for la in weighted_layers(p).values())


def test_a_nan_weight_is_refused_before_any_layer_changes():
    _, cal, p = _prepared()
    before = {n: la.weight.detach().clone() for n, la in weighted_layers(p).items()}
    with torch.no_grad():
        weighted_layers(p)["fc"].weight[0, 0] = float("nan")
    with pytest.raises(QatError, match="layer fc: weights are NaN"):
        qat.prune(p, 2, 4, calibration_data=cal, method="sparsegpt")
    assert all(la.mask is None for la in weighted_layers(p).values())
    assert all(torch.equal(la.weight, before[n]) for n, la in weighted_layers(p).items()
               if n != "fc")


def test_a_failure_part_way_leaves_nothing_half_pruned(monkeypatch):
    """A layer that fails after others were refit (here: interrupted at the third) puts
    every weight, mask and bias correction back as it was."""
    import dsa_tvm.qat.sparse_refit as sr

    _, cal, p = _prepared()
    before = {n: (la.weight.detach().clone(), la.bias_shift)
              for n, la in weighted_layers(p).items()}
    calls = []
    real = sr.refit_layer

    def flaky(layer, *a, **kw):
        calls.append(layer.name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(layer, *a, **kw)

    monkeypatch.setattr(sr, "refit_layer", flaky)
    with pytest.raises(KeyboardInterrupt):
        qat.prune(p, 2, 4, calibration_data=cal, method="sparsegpt")
    assert len(calls) == 3
    for n, la in weighted_layers(p).items():
        assert la.mask is None and torch.equal(la.weight, before[n][0]), n
        assert (la.bias_shift is None) == (before[n][1] is None), n
        if la.bias_shift is not None:
            assert torch.equal(la.bias_shift, before[n][1]), n
    assert not hasattr(p, "qat_sparsity")
