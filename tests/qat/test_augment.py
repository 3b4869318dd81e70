"""Mixup for distillation from few images: seeded, convex, and refused on bad input."""

from __future__ import annotations

import pytest
import torch

from dsa_tvm import qat
from dsa_tvm.qat.augment import mixup
from dsa_tvm.qat.errors import QatError

from .nets import tiny_net


def _images(n: int = 6) -> torch.Tensor:
    return torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def test_mixup_is_seeded_and_each_pixel_lies_between_two_flipped_images():
    x = _images()
    a = mixup()((x, torch.arange(6)), torch.Generator().manual_seed(3))
    b = mixup()((x, torch.arange(6)), torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], torch.arange(6))
    lo = torch.minimum(x.amin(0), x.flip(-1).amin(0))
    hi = torch.maximum(x.amax(0), x.flip(-1).amax(0))
    assert (a[0] >= lo - 1e-6).all() and (a[0] <= hi + 1e-6).all()
    assert not any(torch.equal(a[0][i], x[i]) or torch.equal(a[0][i], x[i].flip(-1))
                   for i in range(6))  # share 1: every example mixed


def test_mixup_with_nothing_to_do_is_the_identity():
    x = _images()
    (y,) = mixup(share=0.0, flip=False)((x,), torch.Generator().manual_seed(0))
    assert torch.equal(y, x)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_a_share_outside_0_1_is_refused(bad):
    with pytest.raises(QatError, match="share"):
        mixup(share=bad)


def test_mixup_names_a_batch_that_is_not_images():
    with pytest.raises(QatError, match="N, C, H, W"):
        mixup()((torch.randn(4, 16),), torch.Generator())


def test_distillation_with_mixup_is_seeded():
    runs = []
    for _ in range(2):
        net = tiny_net()
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(4, 3, 16, 16, generator=g),) for _ in range(5)]
        p = qat.prepare(net, (data[0][0][:1],), data[:2], bits=4)
        res = qat.distill(p, net, data[:4], data[4:], steps=6, lr=1e-4, eval_every=3,
                          show_progress=False, augment=mixup())
        runs.append([h for _, h in res.heldout])
    assert runs[0] == runs[1] and len(runs[0]) == 3
