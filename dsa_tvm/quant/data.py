"""Calibration and evaluation data: numpy arrays, an .npz file, or a folder of images.

Everything becomes a list of feeds (``{input name: array}``), one per batch, with the
batch size the model was exported with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

Feed = dict[str, np.ndarray]
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".tif", ".tiff", ".webp"}

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)

#: named preprocessings: HWC float32 RGB in [0, 255] -> HWC float32
PREPROCESS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "imagenet": lambda x: (x / 255.0 - IMAGENET_MEAN) / IMAGENET_STD,
    "efficientnet": lambda x: (x - 127.0) / 128.0,   # EfficientNet-Lite: (x - 127) / 128
    "unit": lambda x: x / 255.0,
    "raw": lambda x: x,
}


def _split(arr: np.ndarray, shape: tuple[int, ...] | None) -> list[np.ndarray]:
    """Batches of ``shape`` from ``arr``: the array itself, its leading axis (one more
    dim than the input), or batch-sized slices of axis 0."""
    arr = np.asarray(arr)
    if shape is None or arr.shape == tuple(shape) or any(d <= 0 for d in shape):
        return [arr] if shape is None or arr.ndim == len(shape) else list(arr)
    if arr.ndim == len(shape) + 1 and arr.shape[1:] == tuple(shape):
        return list(arr)
    if arr.ndim == len(shape) and arr.shape[1:] == tuple(shape[1:]) and arr.shape[0] % shape[0] == 0:
        b = shape[0]
        return [arr[i:i + b] for i in range(0, arr.shape[0], b)]
    raise ValueError(f"calibration array of shape {arr.shape} does not fit the model input {shape}")


def as_feeds(data, input_shapes: Mapping[str, tuple[int, ...] | None],
             preprocess: str | Callable[[np.ndarray], np.ndarray] = "imagenet",
             limit: int | None = None, dtypes: Mapping[str, np.dtype] | None = None) -> list[Feed]:
    """Normalize ``data`` into feeds: a list of feeds, a list of arrays (single-input
    model), an array, a dict of arrays, an ``.npz`` path, or an image folder path."""
    names = list(input_shapes)
    if isinstance(data, (str, Path)):
        p = Path(data)
        if p.is_dir():
            data = load_images(p, input_shapes[names[0]], preprocess)
        elif p.suffix == ".npz":
            with np.load(p) as z:
                data = {k: z[k] for k in z.files}
            if len(names) == 1 and names[0] not in data and len(data) == 1:
                data = {names[0]: next(iter(data.values()))}
        elif p.suffix == ".npy":
            data = np.load(p)
        else:
            raise ValueError(f"calibration data '{p}': expected a folder of images, .npz or .npy")
    if isinstance(data, np.ndarray):
        if len(names) != 1:
            raise ValueError(f"a single array was given but the model has inputs {names}")
        data = {names[0]: data}
    if isinstance(data, Mapping):
        missing = [n for n in names if n not in data]
        if missing:
            raise ValueError(f"calibration data has no array for model input(s) {missing} "
                             f"(has {sorted(data)})")
        cols = {n: _split(data[n], input_shapes[n]) for n in names}
        count = min(len(c) for c in cols.values())
        feeds = [{n: cols[n][i] for n in names} for i in range(count)]
    elif isinstance(data, Sequence):
        feeds = [dict(f) if isinstance(f, Mapping) else {names[0]: np.asarray(f)} for f in data]
    else:
        raise TypeError(f"unsupported calibration data of type {type(data).__name__}")
    if limit is not None:
        feeds = feeds[:limit]
    if not feeds:
        raise ValueError("no calibration batches")
    out = []
    for f in feeds:
        ff = {}
        for n in names:
            if n not in f:
                raise ValueError(f"a calibration feed lacks input '{n}'")
            dt = (dtypes or {}).get(n, np.float32)
            ff[n] = np.ascontiguousarray(f[n], dtype=dt)
        out.append(ff)
    return out


def load_image(path: Path | np.ndarray, size: tuple[int, int],
               preprocess: str | Callable[[np.ndarray], np.ndarray] = "imagenet",
               layout: str = "NCHW") -> np.ndarray:
    """One image as a (1, C, H, W) float32 batch: RGB, short side resized to 1.14x then
    centre-cropped to ``size`` (the usual ImageNet evaluation transform), preprocessed."""
    from PIL import Image

    img = Image.open(path) if not isinstance(path, np.ndarray) else Image.fromarray(path)
    img = img.convert("RGB")
    h, w = size
    scale = 1.14 * max(h, w) / min(img.size)
    img = img.resize((max(w, round(img.size[0] * scale)), max(h, round(img.size[1] * scale))),
                     Image.BILINEAR)
    left, top = (img.size[0] - w) // 2, (img.size[1] - h) // 2
    x = np.asarray(img.crop((left, top, left + w, top + h)), np.float32)
    fn = PREPROCESS[preprocess] if isinstance(preprocess, str) else preprocess
    x = np.asarray(fn(x), np.float32)
    return (x.transpose(2, 0, 1) if layout == "NCHW" else x)[None]


def load_images(folder: Path, shape: tuple[int, ...] | None,
                preprocess: str | Callable[[np.ndarray], np.ndarray] = "imagenet") -> list[np.ndarray]:
    """Every image in ``folder`` (sorted by name) as a batch of the model's input shape."""
    if shape is None or len(shape) != 4:
        raise ValueError(f"an image folder needs a model with one 4-D image input, got {shape}")
    files = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in '{folder}'")
    nchw = shape[1] in (1, 3)
    size = (shape[2], shape[3]) if nchw else (shape[1], shape[2])
    return [load_image(f, size, preprocess, "NCHW" if nchw else "NHWC") for f in files]
