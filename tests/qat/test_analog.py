"""Noise-aware training for analog crossbars (``qat.enable_analog``): the noise-free forward
untouched, seeded chips, the simulator's statistics, gradients to the clean weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm import qat
from dsa_tvm.runtime import cim_conditions

from .nets import tiny_net

CIM = dsa_tvm.load_config("cim-pcm")
#: devices that hold their targets
QUIET = dict(prog_noise_scale=0.0, read_noise_scale=0.0, drift_scale=0.0)
#: an ADC that resolves every sum
FINE = dict(adc_bits=32, adc_range=1.0)


class WideNet(nn.Module):
    """A folded RGB stem, a 3x3 conv whose 288-row reduction takes two crossbars, a 1x1 conv
    to a feature map with many outputs (the statistics' samples)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)
        self.c3 = nn.Conv2d(32, 64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c3(torch.relu(self.c2(torch.relu(self.c1(x)))))


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 12, 12)
    return qat.prepare(tiny_net(), (x[:1],), [(x,)], learn_scales=True), x


@pytest.fixture(scope="module")
def wide():
    """WideNet prepared, and the simulator running its export on a CIM part under any
    device conditions (one compile)."""
    torch.manual_seed(0)
    x = torch.randn(8, 3, 8, 8)
    p = qat.prepare(WideNet().eval(), (x[:1],), [(x,)])
    with dsa_tvm.options(offload="all"):
        ex = tvm.compile(from_onnx(qat.export(p), keep_params_in_input=False),
                         target=dsa_tvm.target(CIM))
    vm = relax.VirtualMachine(ex, tvm.cpu())

    def sim(cfg) -> np.ndarray:
        with cim_conditions(cfg):
            return vm["main"](tvm.runtime.tensor(x[:1].numpy())).numpy()

    return p, x[:1], sim


def _out(p, x, **analog) -> np.ndarray:
    """One forward pass (analog reads on ``analog['hw']`` when given)."""
    if analog:
        qat.enable_analog(p, **analog)
    try:
        with torch.no_grad():
            return p(x).numpy()
    finally:
        qat.disable_analog(p)


def test_noise_off_is_the_exact_forward_bit_for_bit(tiny):
    """Disabled (the default, after the context manager) and on a part whose devices are
    noiseless with an ADC that resolves every sum (raw and zero-point DAC inputs,
    bit-serial slices), the layers compute the DSA's exact integers."""
    p, x = tiny
    with torch.no_grad():
        clean = p(x)
    with qat.analog_noise(p, CIM, seed=3) as rep:
        assert len(rep.analog) == 4 and [n for n, _ in rep.digital] == ["dw"]
        with torch.no_grad():
            assert not torch.equal(p(x), clean)
    with torch.no_grad():
        assert torch.equal(p(x), clean)
    for enc in ("zero_point", "signed"):
        quiet = CIM.replace(input_encoding=enc, dac_bits=3, **QUIET, **FINE)
        np.testing.assert_array_equal(_out(p, x, hw=quiet), clean.numpy())


def test_seeded_chips(tiny):
    """The same seed draws the same chip, another seed another; resampling reads a new chip
    every pass, without it every pass reads the same one."""
    p, x = tiny
    a = _out(p, x, hw=CIM, seed=1)
    assert np.array_equal(a, _out(p, x, hw=CIM, seed=1))
    assert not np.array_equal(a, _out(p, x, hw=CIM, seed=2))
    for resample in (True, False):
        qat.enable_analog(p, CIM, seed=1, resample=resample)
        with torch.no_grad():
            first, second = p(x), p(x)
        qat.disable_analog(p)
        assert torch.equal(first, second) is not resample
        assert np.array_equal(first.numpy(), a)


def test_deterministic_adc_reads_equal_the_simulator(wide):
    """Noiseless devices, coarse ADCs: the reads are deterministic, and the layers give the
    simulator's outputs bit for bit: the same crossbar rows (folded stem, taps x padded
    channels, a reduction over two crossbars), ADC steps, clipping and DAC slices."""
    p, x, sim = wide
    for changes in (dict(adc_bits=8), dict(adc_bits=6, adc_range=0.25, dac_bits=4),
                    dict(adc_bits=7, input_encoding="signed")):
        cfg = CIM.replace(**QUIET, **changes)
        # bit for bit, though the ADC puts the fake-quantized float path (the gradient's)
        # far from the exact one: the forward value is the exact one's
        np.testing.assert_array_equal(_out(p, x, hw=cfg, resample=False), sim(cfg))


@pytest.mark.parametrize("changes", [
    dict(noise_model="gaussian", prog_noise_scale=0.02, read_noise_scale=0.0,
         t_inference_s=0.0, **FINE),
    dict(**FINE),                                          # PCM: programming, 1 h drift, read
    dict(t_inference_s=86400.0, drift_compensation=True, **FINE),
    dict(mvm_noise=0.002, **QUIET, **FINE),                # per-read noise
], ids=["gaussian", "pcm-1h", "pcm-1d-compensated", "per-read"])
def test_noise_statistics_match_the_simulator(wide, changes):
    """Over 6 chips each, the output error (noisy minus exact) has the simulator's mean and
    spread: the same draws (the simulator's own functions) on the same rows. Chips differ
    (the simulator seeds by program and region), so the tolerance is statistical."""
    p, x, sim = wide
    with torch.no_grad():
        clean = p(x).numpy()
    cfg = CIM.replace(**changes)
    got = np.stack([_out(p, x, hw=cfg, seed=s) for s in range(6)]) - clean
    want = np.stack([sim(cfg.replace(noise_seed=s)) for s in range(6)]) - clean
    assert want.std() > 0
    assert abs(got.std() / want.std() - 1) < 0.15
    assert abs(got.mean() - want.mean()) < 0.15 * want.std()


def test_noise_scale_multiplies_the_noise(wide):
    p, x, _ = wide
    with torch.no_grad():
        clean = p(x).numpy()
    cfg = CIM.replace(noise_model="gaussian", prog_noise_scale=0.01, read_noise_scale=0.0,
                      t_inference_s=0.0, **FINE)
    assert np.array_equal(_out(p, x, hw=cfg, noise_scale=0.0), clean)
    one, three = (np.std(_out(p, x, hw=cfg, noise_scale=k) - clean) for k in (1.0, 3.0))
    assert 2.4 < three / one < 3.6


def test_gradients_reach_the_clean_weights(tiny):
    """The noisy forward back-propagates to every weight (straight through the noise);
    the parameters themselves never take the noise."""
    p, x = tiny
    before = {n: w.detach().clone() for n, w in p.named_parameters()}
    grads = {}
    for on in (False, True):
        p.zero_grad()
        if on:
            qat.enable_analog(p, CIM, seed=0)
        p(x).square().mean().backward()
        qat.disable_analog(p)
        grads[on] = {n: w.grad.clone() for n, w in p.named_parameters()
                     if n.endswith(".weight")}
    for n, g in grads[True].items():
        assert torch.isfinite(g).all() and g.abs().sum() > 0, n
    assert any(not torch.equal(g, grads[False][n]) for n, g in grads[True].items())
    for n, w in p.named_parameters():
        assert torch.equal(w, before[n]), n
    p.zero_grad()


def test_training_with_noise_exports_the_exact_model(tiny):
    """distill with analog reads; once they are off the module is exact again and the DSA
    compiled from its export equals it bit for bit."""
    from .nets import run_on_dsa

    _, x = tiny
    torch.manual_seed(1)
    net = tiny_net()
    p = qat.prepare(net, (x[:1],), [(x,)], learn_scales=True)
    qat.enable_analog(p, CIM, seed=0, noise_scale=2.0)
    data = [(torch.randn(4, 3, 12, 12),) for _ in range(4)]
    res = qat.distill(p, net, data, steps=4, eval_every=2, lr=1e-3, show_progress=False)
    assert res.steps == 4 and res.best_step > 0
    qat.disable_analog(p)
    with torch.no_grad():
        want = p(x[:1]).numpy()
    np.testing.assert_array_equal(run_on_dsa(qat.export(p), x[:1].numpy()), want)


def test_hostile_inputs_name_the_cause_and_the_fix(tiny):
    p, _ = tiny
    with pytest.raises(qat.QatError, match="no crossbars.*cim-pcm"):
        qat.enable_analog(p, "default")
    with pytest.raises(qat.QatError, match="unknown hardware preset"):
        qat.enable_analog(p, "no-such-part")
    with pytest.raises(qat.QatError, match="adc_calibration.*replace"):
        qat.enable_analog(p, CIM.replace(adc_calibration=True))
    with pytest.raises(qat.QatError, match="digital_layers.*skip"):
        qat.enable_analog(p, CIM.replace(digital_layers="dsa_region0.1:conv2d"))
    with pytest.raises(qat.QatError, match="noise_scale"):
        qat.enable_analog(p, CIM, noise_scale=-1.0)
    with pytest.raises(qat.QatError, match="prepare"):
        qat.enable_analog(nn.Linear(4, 4), CIM)
    rep = qat.enable_analog(p, CIM, skip=["c1", "fc"])
    assert sorted(n for n, _ in rep.digital) == ["c1", "dw", "fc"]
    qat.disable_analog(p)


def test_qat_cli_trains_with_analog_noise(tmp_path, capsys):
    """``dsa-tvm qat --analog cim-pcm``: the chips in the training passes, the exact integers
    in the reported cosines and the export; a digital part or a stray --noise-scale is a
    one-line error before any image is read."""
    from PIL import Image

    from dsa_tvm.cli import main

    rng = np.random.default_rng(0)
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(imgs / f"{i}.png")
    torch.save(tiny_net(), tmp_path / "tiny.pt")
    base = ["qat", str(tmp_path / "tiny.pt"), "--data", str(imgs), "--size", "16", "--quiet",
            "--out", str(tmp_path / "q.onnx")]
    assert main(base + ["--steps", "2", "--analog", "cim-pcm", "--noise-scale", "2"]) == 0
    out = capsys.readouterr().out
    assert "analog reads on 'cim-pcm' (seed 0, noise x2): 4 layers on crossbars" in out, out
    assert "training: 2 steps" in out and (tmp_path / "q.onnx").is_file()
    for extra, want in ((["--analog", "default"], "--analog default: 'default' has no crossbars"),
                        (["--noise-scale", "2"], "--noise-scale applies to --analog HW")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert want in err and "Traceback" not in err, err
