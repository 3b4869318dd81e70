"""Distillation, mixed precision and hostile input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dsa_tvm import qat
from dsa_tvm.qat.errors import QatError

from .nets import run_on_dsa, tiny_net


def _data(n: int, seed: int) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 3, 16, 16, generator=g),) for _ in range(n)]


def _prepared(bits: int = 8, **kw):
    net = tiny_net()
    data = _data(3, 1)
    return net, qat.prepare(net, (data[0][0][:1],), data, bits=bits, **kw)


def test_distillation_lowers_the_heldout_loss_and_is_seeded():
    runs = []
    for _ in range(2):
        net, p = _prepared(bits=4, learn_scales=True, bias_correction=False)
        res = qat.distill(p, net, _data(6, 2), _data(2, 3), steps=30, lr=1e-4, eval_every=10,
                          patience=5, show_progress=False)
        runs.append((res, [t.detach().clone() for t in p.parameters()]))
    res, params = runs[0]
    assert res.best_heldout < 0.2 * res.heldout[0][1]
    assert res.stopped == "steps" and res.steps == 30
    assert [h for _, h in runs[1][0].heldout] == [h for _, h in res.heldout]
    assert all(torch.equal(a, b) for a, b in zip(params, runs[1][1]))


def test_early_stop_keeps_the_best_weights():
    net, p = _prepared()
    res = qat.distill(p, net, _data(4, 2), _data(1, 3), steps=200, lr=0.5, eval_every=2,
                      patience=2, show_progress=False)
    assert res.stopped in ("early stop",) or res.stopped.startswith("non-finite")
    assert res.steps < 200
    with torch.no_grad():
        h = qat.train.distill_loss(p(*_data(1, 3)[0]), net(*_data(1, 3)[0]))
    assert float(h) == pytest.approx(res.best_heldout, rel=1e-5)


def test_a_non_finite_loss_stops_with_its_step_and_restores_the_last_good_weights():
    net, p = _prepared()
    calls = {"n": 0}

    class Poisoned(nn.Module):
        def forward(self, x):
            calls["n"] += 1
            y = net(x)
            return y * float("nan") if calls["n"] > 6 else y  # 1 held-out call, then steps

    before = [t.detach().clone() for t in p.parameters()]
    res = qat.distill(p, Poisoned(), _data(4, 2), _data(1, 3), steps=50, lr=1e-3,
                      eval_every=100, show_progress=False)
    assert res.stopped == "non-finite loss at step 6"
    assert res.steps == 5
    # no held-out check beat the start: the starting weights are restored
    assert all(torch.equal(a, b) for a, b in zip(before, p.parameters()))


def test_an_exploding_learning_rate_stops_cleanly():
    net, p = _prepared(learn_scales=True)
    res = qat.distill(p, net, _data(4, 2), _data(1, 3), steps=40, lr=1e9, scale_lr=1e9,
                      eval_every=1, patience=100, show_progress=False)
    assert res.stopped.startswith("non-finite") or res.stopped == "steps"
    with torch.no_grad():
        assert torch.isfinite(p(*_data(1, 3)[0])).all()


def test_mixed_precision_keeps_the_most_sensitive_layers_wide():
    net, p = _prepared()
    batch = _data(1, 4)
    ranking = qat.sensitivity(p, batch)
    assert len(ranking) == 5 and ranking[0].cosine <= ranking[-1].cosine
    widths, cos = qat.choose_bits(p, batch, target_cosine=ranking[0].cosine + 0.5, ranking=ranking)
    assert set(widths.values()) <= {4, 8}
    assert qat.precision.bits_of(p) == widths
    # unreachable target: every layer ends up 8-bit
    assert all(b == 8 for b in widths.values())
    widths, _ = qat.choose_bits(p, batch, target_cosine=-1.0, ranking=ranking)
    assert all(b == 4 for b in widths.values())
    model = qat.export(p)
    x = _data(1, 5)[0][0][:1]
    with torch.no_grad():
        np.testing.assert_array_equal(run_on_dsa(model, x.numpy()), p(x).numpy())


def test_an_op_without_an_integer_mirror_stays_fp32_and_is_named():
    class WithSigmoid(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 8, 3, padding=1)
            self.b = nn.Conv2d(8, 4, 1)

        def forward(self, x):
            return self.b(torch.sigmoid(self.a(x)))

    torch.manual_seed(0)
    net = WithSigmoid().eval()
    x = torch.randn(2, 3, 8, 8)
    p = qat.prepare(net, (x[:1],), [(x,)])
    assert [(n, op) for n, op, _ in p.qat_report.fp32] == [("sigmoid", "sigmoid")]
    assert "FP32: sigmoid" in p.qat_report.summary()
    got = run_on_dsa(qat.export(p), x[:1].numpy())
    with torch.no_grad():
        want = p(x[:1]).numpy()
    step = p.qat_b.out.s
    # the DSA runs the sigmoid as an int8 table: at most one step of b's input apart
    assert np.abs(got - want).max() <= 4 * step


@pytest.mark.parametrize("bad, match", [
    (lambda: qat.prepare("model.onnx", torch.zeros(1)), "is not a file"),
    (lambda: qat.prepare(3, torch.zeros(1)), "torch.nn.Module, an onnx.ModelProto"),
    (lambda: qat.prepare(tiny_net(), torch.zeros(1, 3, 16, 16), bits=3), "bits=3"),
    (lambda: qat.prepare(tiny_net(), [], None), "example_inputs"),
    (lambda: qat.prepare(tiny_net(), torch.zeros(1, 3, 16, 16), method="magic"), "method"),
    (lambda: qat.prepare(tiny_net(), torch.zeros(1, 3, 16, 16), calibration_data=[]), "empty"),
    (lambda: qat.prepare(tiny_net(), torch.zeros(1, 3, 16, 16),
                         calibration_data=[torch.full((1, 3, 16, 16), float("nan"))]), "NaN"),
    (lambda: qat.export(tiny_net()), "prepare it first"),
    (lambda: qat.set_bits(_prepared()[1], {"nope": 4}), "no weighted layer named 'nope'"),
    (lambda: qat.set_bits(_prepared()[1], {"c1": 2}), "bits=2"),
    (lambda: qat.distill(_prepared()[1], tiny_net(), _data(1, 0)), "at least 2"),
    (lambda: qat.distill(_prepared()[1], tiny_net(), _data(3, 0), loss="l7"), "loss"),
])
def test_bad_input_gets_a_clear_error(bad, match):
    with pytest.raises(QatError, match=match):
        bad()


def test_an_untraceable_module_names_the_cause_and_the_fix():
    class DataDependent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = nn.Conv2d(3, 3, 1)

        def forward(self, x):
            return self.c(x) if x.sum() > 0 else x

    with pytest.raises(QatError, match="torch.fx cannot trace DataDependent.*control flow"):
        qat.prepare(DataDependent(), torch.zeros(1, 3, 4, 4))


def test_training_never_moves_the_callers_module():
    """FP32 ops keep parameters in the prepared module; the caller's module (the teacher)
    must stay as it was."""

    class WithNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = nn.Conv2d(3, 8, 3, padding=1)
            self.norm = nn.GroupNorm(2, 8)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(self.norm(self.c(x)).mean((2, 3)))

    torch.manual_seed(0)
    net = WithNorm().eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    data = [(torch.randn(4, 3, 8, 8),) for _ in range(4)]
    p = qat.prepare(net, data[0], data)
    assert any(op == "GroupNorm" for _, op, _ in p.qat_report.fp32)
    qat.distill(p, net, data, steps=5, lr=1e-2, show_progress=False)
    assert p.norm.weight is not net.norm.weight
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())


def test_a_batch_norm_without_affine_parameters_folds():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=False), nn.ReLU()).eval()
    net[1].running_mean.uniform_(-1, 1)
    net[1].running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 8, 8)
    p = qat.prepare(net, (x,))
    assert p.qat_report.folded and not p.qat_report.fp32
    qat.set_mode(p, "float")
    with torch.no_grad():
        np.testing.assert_allclose(p(x).numpy(), net(x).numpy(), rtol=1e-5, atol=1e-5)
