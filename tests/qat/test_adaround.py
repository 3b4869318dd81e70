"""Learned weight rounding (``qat.adaround``): better codes, the same grids, the DSA
reproducing the rounded module bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm import qat
from dsa_tvm.qat.errors import QatError
from dsa_tvm.qat.precision import weighted_layers

from .nets import run_on_dsa, tiny_net
from .test_training import _data


def _prepared(bits: int = 4, **kw):
    net = tiny_net()
    cal = _data(3, 1)
    return net, qat.prepare(net, (cal[0][0][:1],), cal, bits=bits, **kw), cal


def _dsa_equals_module(p, x: torch.Tensor) -> None:
    """The exported model on the DSA gives the prepared module's outputs, bit for bit."""
    with torch.no_grad():
        want = p(x).numpy()
    np.testing.assert_array_equal(run_on_dsa(qat.export(p), x.numpy()), want)


def _layer_output_error(p, name: str, x: torch.Tensor) -> float:
    """``name``'s output against the FP32 network's, relative to its mean square."""
    from dsa_tvm.qat.features import captured, fp32_copy

    ref = fp32_copy(p)
    with torch.no_grad(), captured(p) as got, captured(ref) as want:
        p(x)
        ref(x)
    return float(((got[name] - want[name]) ** 2).mean() / want[name].pow(2).mean())


def test_learned_rounding_lowers_every_layers_error_and_keeps_the_scales():
    _net, p, cal = _prepared()
    layers = weighted_layers(p)
    scales = {n: ly.quant_params()[0].copy() for n, ly in layers.items()}
    nearest = {n: ly.quant_params()[1].copy() for n, ly in layers.items()}
    rep = qat.adaround(p, cal, iters=150, show_progress=False)
    assert [r.name for r in rep.layers] == ["c1", "down", "dw", "pw", "fc"]   # forward order
    for r in rep.layers:
        assert r.error_learned <= r.error_nearest
    assert sum(r.error_learned for r in rep.layers) < 0.8 * sum(r.error_nearest
                                                                for r in rep.layers)
    moved = 0
    for n, ly in layers.items():
        s_w, wq = ly.quant_params()[:2]
        np.testing.assert_array_equal(s_w, scales[n])          # the grid is PTQ's
        assert np.abs(wq.astype(int) - nearest[n]).max() <= 1   # a code moves by one at most
        assert np.abs(wq).max() <= 7
        moved += int((wq != nearest[n]).sum())
    assert moved > 0
    # the module's float mode is still the FP32 network
    x = cal[0][0]
    qat.set_mode(p, "float")
    with torch.no_grad():
        np.testing.assert_allclose(p(x).numpy(), _net(x).numpy(), rtol=1e-4, atol=1e-4)
    qat.set_mode(p, "quant")


def test_the_rounded_module_holds_on_held_out_inputs():
    _net, p, cal = _prepared()
    held = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(9))
    before = {n: _layer_output_error(p, n, held) for n in weighted_layers(p)}
    qat.adaround(p, cal, iters=150, show_progress=False)
    after = {n: _layer_output_error(p, n, held) for n in weighted_layers(p)}
    assert sum(after.values()) < sum(before.values())


@pytest.mark.parametrize("bits", [4, 8])
def test_the_dsa_runs_the_rounded_module_bit_for_bit(bits):
    _net, p, cal = _prepared(bits)
    rep = qat.adaround(p, cal, bits=(bits,), iters=60, show_progress=False)
    assert any(r.flipped > 0 for r in rep.layers)
    _dsa_equals_module(p, torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(5)) * 2)


def test_training_after_rounding_keeps_the_export_exact():
    net, p, cal = _prepared()
    qat.adaround(p, cal, iters=60, show_progress=False)
    qat.distill(p, net, _data(4, 2), _data(1, 3), steps=8, lr=1e-4, eval_every=4,
                show_progress=False)
    _dsa_equals_module(p, torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(6)))


@pytest.mark.parametrize("bits", [4, 8])
def test_grouped_layers_learn_their_rounding_on_their_group_grids(bits):
    """The pointwise conv and the classifier on per-group grids: codes move by one at most
    on the nearest grid's steps and offsets, the layers' error falls, and the DSA (grouped
    dense on the image and on the rows) still gives the module bit for bit."""
    from dsa_tvm.qat import grouped

    _net, p, cal = _prepared(bits, weight_group=16)
    layers = {n: ly for n, ly in weighted_layers(p).items() if ly.group}
    assert sorted(layers) == ["fc", "pw"]
    nearest = {n: grouped.weight_values(ly).copy() for n, ly in layers.items()}
    rep = qat.adaround(p, cal, bits=(bits,), iters=150, show_progress=False)
    rounded = {r.name: r for r in rep.layers}
    assert set(layers) <= set(rounded)
    assert sum(rounded[n].error_learned for n in layers) < sum(rounded[n].error_nearest
                                                               for n in layers)
    for n, ly in layers.items():
        _base, step, offset, _limits, _free = grouped.rounding_base(ly)
        got = grouped.weight_values(ly).astype(np.float64)
        moved = np.rint((got - nearest[n]) / np.where(step > 0, step, 1.0))
        assert np.abs(moved).max() <= 1
        codes = (got - offset) / np.where(step > 0, step, 1.0)
        np.testing.assert_allclose(codes, np.rint(codes), atol=1e-3)   # on the same grid
    assert any(not np.array_equal(grouped.weight_values(ly), nearest[n])
               for n, ly in layers.items())      # the module computes the learned codes
    _dsa_equals_module(p, torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(7)))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), groups=st.integers(1, 4), group=st.sampled_from([16, 32]),
       bits=st.sampled_from([4, 8]), magnitude=st.floats(-6, 3), share_up=st.floats(0, 1),
       coarse=st.booleans(), seed=st.integers(0, 2**31))
def test_any_learned_rounding_stays_on_a_grid_the_compiler_finds(n, groups, group, bits,
                                                                   magnitude, share_up,
                                                                   coarse, seed):
    """Whatever ``round_up`` says (all up, all down, any mix; tiny and huge weights; groups
    already on a coarser grid), each value is within one step of nearest rounding and
    ``find_grid`` finds a grid holding all of them: the export compiles as trained."""
    import types

    from dsa_tvm.layers.group_grid import find_grid, group_grid
    from dsa_tvm.qat import grouped

    rng = np.random.default_rng(seed)
    w = rng.normal(0, 1, (n, groups * group)) * 10.0 ** magnitude
    if coarse:   # a group on a grid of a few levels already (Q4_0-like)
        w[:, :group] = rng.integers(-3, 4, (n, group)) * 10.0 ** magnitude
    layer = types.SimpleNamespace(masked_weight=lambda: torch.from_numpy(w), name="l",
                                  group=group, bits=bits,
                                  round_up=torch.from_numpy(rng.random(w.shape) < share_up))
    got = grouped.weight_values(layer).astype(np.float64)
    step = grouped.rounding_base(layer)[1]
    near = group_grid(w, group, bits).values()
    assert np.all(np.abs(got - near) <= step * (1 + 1e-6) + 1e-6 * np.abs(w).max())
    assert find_grid(got.astype(np.float32)) is not None


def test_changing_a_layers_width_or_mask_drops_its_rounding():
    _net, p, cal = _prepared()
    qat.adaround(p, cal, iters=30, show_progress=False)
    layers = weighted_layers(p)
    assert layers["pw"].round_up is not None
    qat.set_bits(p, {"pw": 8})
    assert layers["pw"].round_up is None
    qat.prune(p, 2, 4)
    assert all(ly.round_up is None for n, ly in layers.items() if ly.mask is not None)


def test_only_the_named_widths_are_rounded():
    _net, p, cal = _prepared(8)
    assert qat.adaround(p, cal, iters=10, show_progress=False).layers == []
    assert all(ly.round_up is None for ly in weighted_layers(p).values())


@pytest.mark.parametrize("kw, needle", [
    (dict(batches=[]), "at least one batch"),
    (dict(iters=0), "iters=0"),
    (dict(batch_size=0), "batch_size=0"),
    (dict(batches=[(torch.full((2, 3, 16, 16), float("nan")),)]), "NaN or infinite"),
    (dict(batches=[(torch.zeros(0, 3, 16, 16),)]), "batch 0 is empty"),
    (dict(batches=[(torch.zeros(2, 5, 16, 16),)]), "does not run on the given batches"),
    (dict(batches=[("image.png",)]), "not a float tensor"),
])
def test_bad_arguments_are_refused_with_the_fix(kw, needle):
    _net, p, cal = _prepared()
    args = dict(batches=cal, show_progress=False) | kw
    with pytest.raises(QatError, match=needle):
        qat.adaround(p, args.pop("batches"), **args)
