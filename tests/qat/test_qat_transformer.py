"""A transformer through QAT: all-MiniLM-L6-v2 as a traceable module, prepared, exported
and run on the DSA.

What is mirrored: every linear layer (Q/K/V, attention output, MLP), int8 or int4, on the
DSA; the residual adds (one operand from a LayerNorm), the attention mask, the attention
matmuls, softmax and LayerNorm stay FP32 on the host, as PTQ's default keeps them. GELU,
between two integer layers, runs on the DSA as the table the compiler evaluates from the
same float chain.
The DSA's linear layers equal the prepared module's integers; what differs is float
rounding of those host ops (TVM's LLVM build against PyTorch), stated as a tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import dsa_tvm
from dsa_tvm import qat
from dsa_tvm.models.minilm_torch import MiniLM

#: host float ops (LayerNorm, softmax, GELU, the attention matmuls) in TVM's LLVM build
#: against PyTorch: the normalized embedding's largest elementwise difference
HOST_TOLERANCE = 1e-5


def _on_dsa(model, ids: np.ndarray, mask: np.ndarray, hw="default") -> np.ndarray:
    with dsa_tvm.options(offload="all"):
        ex = dsa_tvm.compile(model, hw, verbose=False)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(ids), tvm.runtime.tensor(mask)).numpy()


def _tokens(rng: np.random.Generator, batch: int, seq: int, vocab: int):
    ids = torch.from_numpy(rng.integers(1, vocab, (batch, seq)))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1::2, seq // 2:] = 0   # padded sentences: the mask reaches the softmax
    return ids, mask


def trained_on_dsa(p, net, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Three distillation steps, the export compiled for the DSA and checked against the
    prepared module on two sentences (within the host's float rounding); the layer kinds
    that ran on the DSA."""
    qat.distill(p, net, [(ids, mask)], [(ids, mask)], steps=3, batch_size=6, lr=1e-4,
                loss="cosine", eval_every=3, seed=0, show_progress=False)
    model = qat.export(p)
    for k in (0, 1):
        with torch.no_grad():
            want = p(ids[k:k + 1], mask[k:k + 1]).numpy()
        got = _on_dsa(model, ids[k:k + 1].numpy(), mask[k:k + 1].numpy())
        np.testing.assert_allclose(got, want, atol=HOST_TOLERANCE, rtol=0)
    return [type(ly).__name__ for r in dsa_tvm.last_compile_report().regions
            if r.target == "dsa" for ly in r.region.layers]


def _tiny_with_outliers() -> MiniLM:
    """A tiny encoder whose FFN output has one channel ~100x the rest (as BERT's do)."""
    torch.manual_seed(0)
    net = MiniLM(vocab=50, hidden=32, layers=2, heads=4, inner=64, positions=16).eval()
    with torch.no_grad():
        for layer in net.layers:
            layer.out.weight[5] *= 100.0
    return net


@pytest.mark.parametrize("bits, smooth", [(8, None), (4, None), (8, 0.5)])
def test_tiny_encoder_on_the_dsa_equals_the_prepared_module(bits, smooth):
    net = _tiny_with_outliers()
    ids, mask = _tokens(np.random.default_rng(0), 6, 8, 50)
    p = qat.prepare(net, (ids[:1], mask[:1]), [(ids, mask)], bits=bits, smooth=smooth,
                    split_outliers=True)
    # the outlier channel is computed in FP32 beside each FFN output layer, as PTQ splits it
    assert p.qat_report.side_paths == {"layers.0.out": [5], "layers.1.out": [5]}
    qat.set_mode(p, "float")
    with torch.no_grad():   # the split and the scale migration leave the FP32 function
        np.testing.assert_allclose(p(ids, mask).numpy(), net(ids, mask).numpy(), atol=2e-6)
    qat.set_mode(p, "quant")
    kinds = [k for _, k in p.qat_report.layers]
    assert kinds == ["linear"] * 12                      # 6 per layer, every one mirrored
    fp32 = {why for *_, why in p.qat_report.fp32}
    assert fp32 and all("runs in FP32" in w for w in fp32)
    on_dsa = trained_on_dsa(p, net, ids, mask)
    # every projection on the DSA; GELU, between two integer layers, becomes the table the
    # compiler evaluates from the same float chain (it agrees with it but at float ties);
    # with smoothing, the scale multiply after it keeps it on the host
    assert on_dsa.count("Dense") == 12, on_dsa
    assert len(on_dsa) == (12 if smooth else 14), on_dsa


def test_outlier_split_restores_the_ordinary_channels():
    """Without the split one per-tensor grid over the outlier channel leaves the others a
    few codes; with it the prepared module is several times closer to FP32."""
    net = _tiny_with_outliers()
    ids, mask = _tokens(np.random.default_rng(1), 8, 8, 50)
    with torch.no_grad():
        ref = net(ids, mask)
        cos = {split: torch.nn.functional.cosine_similarity(
            qat.prepare(net, (ids[:1], mask[:1]), [(ids, mask)],
                        split_outliers=split)(ids, mask), ref).mean().item()
            for split in (False, True)}
    assert 1 - cos[True] < 0.25 * (1 - cos[False]), cos   # 4x closer (0.9997 vs 0.9960)


def test_bad_smoothing_strength_is_refused():
    net = MiniLM(vocab=20, hidden=8, layers=1, heads=2, inner=16, positions=8)
    ids, mask = _tokens(np.random.default_rng(0), 2, 4, 20)
    with pytest.raises(qat.QatError, match=r"alpha lies in \[0, 1\]"):
        qat.prepare(net, (ids, mask), smooth=1.5)


def test_minilm_module_equals_the_exported_onnx_and_runs_on_the_dsa():
    import onnxruntime as ort

    from dsa_tvm.models.minilm_torch import minilm
    from dsa_tvm.models.pretrained import minilm_feeds, minilm_path

    net = minilm()
    feeds = minilm_feeds()
    sess = ort.InferenceSession(str(minilm_path()))
    ids = torch.from_numpy(np.concatenate([f["input_ids"] for f in feeds]))
    mask = torch.from_numpy(np.concatenate([f["attention_mask"] for f in feeds]))
    with torch.no_grad():
        mine = net(ids[:2], mask[:2]).numpy()
    ref = np.concatenate([sess.run(None, f)[0] for f in feeds[:2]])
    np.testing.assert_allclose(mine, ref, atol=1e-6)
    p = qat.prepare(net, (ids[:1], mask[:1]), [(ids[:8], mask[:8])], bits=8)
    assert [k for _, k in p.qat_report.layers] == ["linear"] * 36
    with torch.no_grad():
        want = p(ids[8:9], mask[8:9]).numpy()
    got = _on_dsa(qat.export(p), ids[8:9].numpy(), mask[8:9].numpy())
    np.testing.assert_allclose(got, want, atol=HOST_TOLERANCE, rtol=0)
    cos = float((got * net(ids[8:9], mask[8:9]).detach().numpy()).sum())
    assert cos > 0.9
