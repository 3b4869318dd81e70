"""Choosing the layers to prune N:M for a target output cosine (``qat.choose_sparse_layers``)."""

from __future__ import annotations

import math

import pytest
import torch

from dsa_tvm import qat
from dsa_tvm.qat.errors import QatError
from dsa_tvm.qat.precision import fp32_outputs, output_cosine, weighted_layers
from dsa_tvm.qat.sparse_choice import eligible_layers, pruned_cost

from .nets import tiny_net

ELIGIBLE = ["down", "pw", "fc"]   # tiny_net: c1 (3 input channels) and dw stay dense


def _data(n: int, seed: int, size: int = 4) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 3, 16, 16, generator=g),) for _ in range(n)]


@pytest.fixture(scope="module")
def setup():
    cal, held = _data(3, 1), _data(1, 5, size=8)
    p = qat.prepare(tiny_net(), (cal[0][0][:1],), cal)
    return p, cal, held, qat.sparse_sensitivity(p, held)


def _pruned_cosine(p, held, chosen, cal=None) -> float:
    """The caller's way: a fresh prepared module pruned with the others skipped."""
    ref = fp32_outputs(p, held)
    q = qat.prepare(tiny_net(), (p.qat_example[0],), _data(3, 1))
    qat.prune(q, 2, 4, skip=lambda name: name not in chosen, calibration_data=cal)
    return output_cosine(q, held, ref)


def test_sensitivity_is_the_cosine_each_eligible_layer_loses_alone(setup):
    p, _, held, lost = setup
    assert sorted(lost) == sorted(ELIGIBLE) == sorted(eligible_layers(p, 2, 4))
    assert list(lost.values()) == sorted(lost.values(), reverse=True)
    dense = output_cosine(p, held, fp32_outputs(p, held))
    for name, loss in lost.items():
        assert loss > 0, name
        assert math.isclose(dense - loss, _pruned_cosine(p, held, [name]), abs_tol=1e-6)


def test_the_cost_is_macs_or_weights_pruned(setup):
    p, _, held, _ = setup
    # down: 16x16x3x3 on an 8x8 output, pw: 16x16 on 8x8, fc: 10x16; half of each pruned
    assert pruned_cost(p, held[0], 2, 4) == {"down": 1152 * 64, "pw": 128 * 64, "fc": 80}
    assert pruned_cost(p, held[0], 2, 4, per="weight") == {"down": 1152, "pw": 128, "fc": 80}


def test_the_chosen_set_meets_the_target_when_pruned_and_nests_under_looser_targets(setup):
    p, cal, held, lost = setup
    cost = pruned_cost(p, held[0], 2, 4)
    first = min(lost, key=lambda k: lost[k] / cost[k])
    dense = output_cosine(p, held, fp32_outputs(p, held))
    targets = [1.0, dense - lost[first] - 1e-6, 0.5, 0.0]   # strictest first
    chosen = [qat.choose_sparse_layers(p, held, t, ranking=lost) for t in targets]
    assert chosen[0] == ([], pytest.approx(dense))          # above the dense cosine: nothing
    assert chosen[1][0][0] == first and len(chosen[1][0]) < len(ELIGIBLE)
    assert sorted(chosen[-1][0]) == sorted(ELIGIBLE)        # target 0: every eligible layer
    for (stricter, _), (looser, _) in zip(chosen, chosen[1:]):
        assert set(stricter) <= set(looser)
    for t, (layers, reached) in zip(targets[1:], chosen[1:]):
        assert reached >= t
        assert _pruned_cosine(p, held, layers) == pytest.approx(reached, abs=1e-6)
    # measured as the caller's prune with calibration data will prune
    layers, reached = qat.choose_sparse_layers(p, held, targets[1], ranking=lost,
                                               calibration_data=cal)
    assert reached >= targets[1]
    assert _pruned_cosine(p, held, layers, cal) == pytest.approx(reached, abs=1e-6)


def test_with_sparsegpt_the_choice_is_measured_as_the_callers_prune_refits(setup):
    """The sensitivities and the chosen set's cosine are what a fresh module pruned with
    ``method="sparsegpt"`` on the same refit data gives (moments captured once by the
    choice, once by the caller's prune: the same inputs, the same weights)."""
    p, cal, held, lost_magnitude = setup
    refit = _data(4, 7)
    ref = fp32_outputs(p, held)
    lost = qat.sparse_sensitivity(p, held, method="sparsegpt", refit_data=refit)

    def caller(chosen, cal=None):
        q = qat.prepare(tiny_net(), (p.qat_example[0],), _data(3, 1))
        qat.prune(q, 2, 4, skip=lambda name: name not in chosen, calibration_data=cal,
                  method="sparsegpt", refit_data=refit)
        return output_cosine(q, held, ref)

    dense = output_cosine(p, held, ref)
    for name, loss in lost.items():   # sensitivities: the copies are not recalibrated
        assert math.isclose(dense - loss, caller([name]), abs_tol=1e-6), name
    assert sum(lost.values()) < sum(lost_magnitude.values())   # the refit costs less
    layers, reached = qat.choose_sparse_layers(p, held, 0.0, calibration_data=cal,
                                               method="sparsegpt", refit_data=refit)
    assert sorted(layers) == sorted(ELIGIBLE)
    assert caller(layers, cal) == pytest.approx(reached, abs=1e-6)
    assert all(la.mask is None for la in weighted_layers(p).values())


def test_choosing_leaves_the_module_as_it_was(setup):
    p, _, held, _ = setup
    x = held[0][0]
    with torch.no_grad():
        before = p(x)
    qat.choose_sparse_layers(p, held, 0.0)   # computes its own ranking
    assert all(la.mask is None for la in weighted_layers(p).values())
    assert not hasattr(p, "qat_sparsity")
    with torch.no_grad():
        assert torch.equal(p(x), before)


@pytest.mark.parametrize("call, match", [
    (lambda p, h: qat.choose_sparse_layers(p, h, 1.5), r"min_cosine=1.5: pass .* between 0"),
    (lambda p, h: qat.choose_sparse_layers(p, h, -0.1), "min_cosine=-0.1"),
    (lambda p, h: qat.choose_sparse_layers(p, h, float("nan")), "min_cosine=nan"),
    (lambda p, h: qat.choose_sparse_layers(p, h, True), "min_cosine=True"),
    (lambda p, h: qat.choose_sparse_layers(p, h, "0.9"), "min_cosine='0.9'"),
    (lambda p, h: qat.choose_sparse_layers(p, [], 0.9), "batches is empty; pass at least"),
    (lambda p, h: qat.sparse_sensitivity(p, []), "batches is empty"),
    (lambda p, h: qat.choose_sparse_layers(p, h, 0.9, calibration_data=[]),
     "calibration_data is empty"),
    (lambda p, h: qat.choose_sparse_layers(p, h, 0.9, n=4, m=4), "N must be at least 1"),
    (lambda p, h: qat.choose_sparse_layers(p, h, 0.9, per="flop"), r"per='flop': pass one of"),
    (lambda p, h: qat.choose_sparse_layers(p, h, 0.9, ranking={"down": 0.1}),
     r"ranking has no loss for \['pw', 'fc'\]"),
    (lambda p, h: qat.choose_sparse_layers(tiny_net(), h, 0.9), "prepare it first"),
    (lambda p, h: qat.choose_sparse_layers(p, h, 0.9, method="wanda"), "method='wanda'"),
    (lambda p, h: qat.choose_sparse_layers(p, h, 0.9, method="sparsegpt"),
     "pass refit_data"),
    (lambda p, h: qat.sparse_sensitivity(p, h, method="sparsegpt", refit_data=[]),
     "refit_data is empty"),
    (lambda p, h: qat.choose_sparse_layers(p, h, 0.9, method="sparsegpt",
                                           refit_data=[(h[0][0] * float("nan"),)]),
     "batch 0 holds NaN or infinite values"),
])
def test_hostile_input_names_the_cause_and_the_fix(setup, call, match):
    p, _, held, _ = setup
    with pytest.raises(QatError, match=match):
        call(p, held)


def test_an_already_pruned_module_is_refused():
    cal = _data(1, 1)
    p = qat.prepare(tiny_net(), (cal[0][0][:1],), cal)
    qat.prune(p, 2, 4)
    with pytest.raises(QatError, match="already pruned; choose the layers .* before calling"):
        qat.choose_sparse_layers(p, cal, 0.9)
