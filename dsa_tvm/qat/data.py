"""Unlabeled training data from a folder of images, as the user has it.

Files that are not images are ignored; images that cannot be decoded are skipped and
named, so one broken file does not stop a training run (none readable is an error).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..quant.data import IMAGE_SUFFIXES, check_preprocess, load_image
from .errors import QatError


def image_folder(folder: str | Path, size: tuple[int, int], preprocess: str = "imagenet"
                 ) -> tuple[list[torch.Tensor], list[tuple[str, str]]]:
    """Every decodable image of ``folder`` (sorted by name) as a (1, 3, H, W) tensor, and
    the (file, reason) of each one skipped."""
    path = Path(folder)
    if not path.is_dir():
        raise QatError(f"--data '{folder}' is not a folder; pass a folder of images")
    check_preprocess(preprocess)
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise QatError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in '{folder}'")
    out, skipped = [], []
    for f in files:
        try:
            out.append(torch.from_numpy(load_image(f, size, preprocess)))
        except ValueError as e:
            skipped.append((f.name, str(e)))
    if not out:
        raise QatError(f"none of the {len(files)} images in '{folder}' could be read (first: "
                       f"{skipped[0][0]}: {skipped[0][1]}); check the files")
    return out, skipped


def split(images: list[torch.Tensor], heldout: float = 0.2, seed: int = 0
          ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A seeded shuffle into (training, held-out); at least one image on each side."""
    if len(images) < 2:
        raise QatError(f"{len(images)} readable image: distillation needs at least 2 (one is "
                       f"held out)")
    order = np.random.default_rng(seed).permutation(len(images))
    cut = min(len(images) - 1, max(1, round(heldout * len(images))))
    return [images[i] for i in order[cut:]], [images[i] for i in order[:cut]]
