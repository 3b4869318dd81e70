"""Input augmentation for distillation from few images ("function matching").

With a few hundred unlabeled crops of a dozen photos, a student fits the teacher on
those crops and little else: the held-out loss on crops of the same photos falls while
other photos do not improve. Beyer et al. (2022, "Knowledge distillation: a good teacher
is patient and consistent") show the remedy: the teacher labels every augmented input
afresh (no fixed targets), and aggressive mixing of images (mixup) covers the space
between the photos. :func:`mixup` is that augmentation, seeded through the training
run's generator.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .errors import QatError

Batch = tuple[torch.Tensor, ...]
Augment = Callable[[Batch, torch.Generator], Batch]


def mixup(share: float = 1.0, flip: bool = True) -> Augment:
    """A ``share`` of an image batch's examples each mixed with another example of the
    batch, ``lam * a + (1 - lam) * b`` with ``lam`` uniform in [0, 1] (mixup's Beta(1, 1)),
    after a random horizontal flip of every example (``flip``). Images are the batch's
    first tensor (N, C, H, W); other tensors pass unchanged. The teacher labels the same
    mixed inputs."""
    if not 0 <= share <= 1:
        raise QatError(f"mixup share {share!r} is outside [0, 1]; pass the share of each "
                       f"batch to mix")

    def apply(batch: Batch, gen: torch.Generator) -> Batch:
        x = batch[0]
        if x.dim() != 4:
            raise QatError(f"mixup mixes image batches (N, C, H, W); got shape "
                           f"{tuple(x.shape)}")
        n = x.shape[0]
        if flip:
            flips = torch.rand(n, generator=gen) < 0.5
            x = torch.where(flips[:, None, None, None], x.flip(-1), x)
        lam = torch.rand(n, generator=gen).to(x.dtype)
        mixed = torch.rand(n, generator=gen) < share
        lam = torch.where(mixed, lam, torch.ones_like(lam))[:, None, None, None]
        other = torch.randperm(n, generator=gen)
        return (lam * x + (1 - lam) * x[other],) + tuple(batch[1:])

    return apply
