"""A prepared module computes what the DSA compiled from its export computes, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dsa_tvm import qat

from .nets import PoolNet, run_on_dsa, tiny_net


def _finetune(p, teacher, steps: int, seed: int = 0) -> float:
    """A few distillation steps with Adam (weights, biases, learned scales)."""
    return _finetune_on(p, teacher, (3, 16, 16), steps, seed)


def _finetune_on(p, teacher, shape: tuple[int, ...], steps: int = 6, seed: int = 0) -> float:
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam([t for t in p.parameters() if t.requires_grad], 1e-3)
    p.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x = torch.randn(8, *shape, generator=g)
        with torch.no_grad():
            ref = teacher(x)
        loss = ((p(x) - ref) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    p.eval()
    return float(loss.detach())


@pytest.mark.parametrize("bits", [8, 4])
def test_exported_model_on_the_dsa_equals_the_prepared_module(bits):
    net = tiny_net()
    g = torch.Generator().manual_seed(1)
    cal = [(torch.randn(4, 3, 16, 16, generator=g),) for _ in range(3)]
    x = torch.randn(1, 3, 16, 16, generator=g)
    p = qat.prepare(net, (x,), cal, bits=bits, learn_scales=True, learn_weight_scales=True)
    kinds = sorted({k for _, k in p.qat_report.layers})
    assert kinds == ["add", "conv2d", "global_avg_pool", "linear"]
    assert not p.qat_report.fp32
    before = {n: t.detach().clone() for n, t in p.named_parameters()}
    _finetune(p, net, steps=6)
    moved = [n for n, t in p.named_parameters() if not torch.equal(t, before[n])]
    assert any(n.endswith(".gain") for n in moved) and any(n.endswith("weight") for n in moved)
    assert any(n.endswith(".weight_gain") for n in moved)  # learned weight scales moved too
    model = qat.export(p)
    for seed in range(2):
        xs = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(10 + seed)) * 2
        with torch.no_grad():
            want = p(xs).numpy()
        got = run_on_dsa(model, xs.numpy())
        np.testing.assert_array_equal(got, want)


def test_int4_weights_hold_int4_codes():
    net = tiny_net()
    x = torch.randn(2, 3, 16, 16)
    p = qat.prepare(net, (x[:1],), [(x,)], bits=4)
    from dsa_tvm.qat.layers import WeightedLayer

    for m in p.modules():
        if isinstance(m, WeightedLayer):
            _, wq, _, _ = m.quant_params()
            assert np.abs(wq).max() <= 7
    model = qat.export(p)
    dq_weights = [i for i in model.graph.node if i.op_type == "DequantizeLinear"]
    assert dq_weights


def test_float_mode_is_the_original_network():
    net = tiny_net()
    x = torch.randn(2, 3, 16, 16)
    p = qat.prepare(net, (x,))
    qat.set_mode(p, "float")
    with torch.no_grad():
        np.testing.assert_allclose(p(x).numpy(), net(x).numpy(), rtol=1e-5, atol=1e-5)


def test_an_untrained_prepared_module_is_dsa_tvms_ptq_bit_for_bit():
    """Same observers, scales, bias correction and weight floors as ``quantize_onnx``: on
    the DSA, the exported prepared module and the PTQ model give the same numbers."""
    import io
    import warnings

    import onnx

    from dsa_tvm.quant import quantize_onnx

    net = tiny_net()
    g = torch.Generator().manual_seed(1)
    cal = torch.randn(8, 3, 16, 16, generator=g)
    x = torch.randn(1, 3, 16, 16, generator=g)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), buf, input_names=["x"], opset_version=17, dynamo=False)
    ptq = quantize_onnx(onnx.load_from_string(buf.getvalue()),
                        [{"x": cal[i:i + 1].numpy()} for i in range(8)], show_progress=False)
    p = qat.prepare(net, (x,), [(cal,)])
    np.testing.assert_array_equal(run_on_dsa(qat.export(p), x.numpy()),
                                  run_on_dsa(ptq.model, x.numpy()))


def test_max_pool_and_lone_activations_stay_on_their_grid_bit_for_bit():
    torch.manual_seed(0)
    net = PoolNet().eval()
    g = torch.Generator().manual_seed(2)
    cal = [(torch.randn(4, 3, 12, 12, generator=g),)]
    x = torch.randn(1, 3, 12, 12, generator=g) * 1.5
    p = qat.prepare(net, (x,), cal, learn_scales=True)
    kinds = [k for _, k in p.qat_report.layers]
    assert kinds.count("clip") == 3 and kinds.count("max_pool") == 1
    assert not p.qat_report.fp32
    _finetune_on(p, net, (3, 12, 12))
    with torch.no_grad():
        want = p(x).numpy()
    np.testing.assert_array_equal(run_on_dsa(qat.export(p), x.numpy()), want)
