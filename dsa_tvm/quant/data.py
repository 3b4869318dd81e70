"""Calibration and evaluation data: numpy arrays, an .npz file, or a folder of images.

Everything becomes a list of feeds (``{input name: array}``), one per batch, with the
batch size the model was exported with.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from .qparams import MIN_SCALE

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


def _split(arr: np.ndarray, shape: tuple[int, ...] | None, what: str = "calibration data"
           ) -> list[np.ndarray]:
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
    raise ValueError(f"{what}: array of shape {arr.shape} does not fit the model input {shape}")


def check_preprocess(preprocess: str | Callable[[np.ndarray], np.ndarray]) -> None:
    """A named preprocessing must exist (callables are taken as they are)."""
    if isinstance(preprocess, str) and preprocess not in PREPROCESS:
        raise ValueError(f"unknown preprocess '{preprocess}' (choose from {', '.join(PREPROCESS)}, "
                         "or pass a function)")


def check_num_batches(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer))
                              or limit < 1):
        raise ValueError(f"num_batches must be a positive integer (or None for all), got {limit!r}")


def as_feeds(data, input_shapes: Mapping[str, tuple[int, ...] | None],
             preprocess: str | Callable[[np.ndarray], np.ndarray] = "imagenet",
             limit: int | None = None, dtypes: Mapping[str, np.dtype] | None = None,
             what: str = "calibration data", keep_order: bool = False) -> list[Feed]:
    """Normalize ``data`` into feeds: a list of feeds, a list of arrays (single-input
    model), an array, a dict of arrays, an ``.npz`` path, or an image folder path.

    Every batch is checked against the model's inputs (shape, a numeric dtype); batches
    with NaN or Inf are skipped with a warning (an error when none is left), and an input
    that is all zero or below the smallest quantization step warns: its scale then says
    nothing about real data. ``what`` names the data in messages. ``keep_order``: a batch
    with NaN or Inf is an error instead (evaluation: inputs line up with their labels)."""
    check_num_batches(limit)
    check_preprocess(preprocess)
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
            raise ValueError(f"{what} '{p}': expected a folder of images, .npz or .npy")
    if isinstance(data, np.ndarray):
        if len(names) != 1:
            raise ValueError(f"{what}: a single array was given but the model has inputs {names}")
        data = {names[0]: data}
    if isinstance(data, Mapping):
        missing = [n for n in names if n not in data]
        if missing:
            raise ValueError(f"{what} has no array for model input(s) {missing} "
                             f"(has {sorted(data)})")
        cols = {n: _split(data[n], input_shapes[n], what) for n in names}
        count = min(len(c) for c in cols.values())
        feeds = [{n: cols[n][i] for n in names} for i in range(count)]
    elif isinstance(data, Sequence):
        feeds = [dict(f) if isinstance(f, Mapping) else {names[0]: np.asarray(f)} for f in data]
    else:
        raise TypeError(f"unsupported {what} of type {type(data).__name__} (give arrays, feeds, "
                        "an .npz/.npy file or an image folder)")
    if limit is not None:
        feeds = feeds[:limit]
    if not feeds:
        raise ValueError(f"{what} is empty: no batches")
    out = [_typed_feed(f, i, input_shapes, dtypes or {}, what) for i, f in enumerate(feeds)]
    out = _drop_non_finite(out, what, keep_order)
    _warn_degenerate(out, what)
    return out


def _typed_feed(f: Mapping, i: int, input_shapes: Mapping[str, tuple[int, ...] | None],
                dtypes: Mapping[str, np.dtype], what: str) -> Feed:
    """Batch ``i`` as contiguous arrays of the input dtypes, its shapes checked."""
    ff = {}
    for n, shape in input_shapes.items():
        if n not in f:
            raise ValueError(f"{what}: batch {i} lacks input '{n}' (has {sorted(f)})")
        arr = np.asarray(f[n])
        dt = np.dtype(dtypes.get(n, np.float32))
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"{what}: input '{n}' of batch {i} has dtype {arr.dtype}; "
                             f"the model takes {dt} numbers")
        if shape is not None and (arr.ndim != len(shape) or any(
                d > 0 and a != d for a, d in zip(arr.shape, shape))):
            raise ValueError(f"{what}: input '{n}' of batch {i} has shape {arr.shape}; "
                             f"the model input is {tuple(shape)}")
        with np.errstate(over="ignore", invalid="ignore"):
            ff[n] = np.ascontiguousarray(arr, dtype=dt)
    return ff


def _drop_non_finite(feeds: list[Feed], what: str, keep_order: bool = False) -> list[Feed]:
    """Batches without NaN/Inf (in float32, as the model reads them); warn about the rest
    (``keep_order``: refuse them)."""
    bad = [i for i, f in enumerate(feeds)
           if any(v.dtype.kind == "f" and not np.isfinite(v).all() for v in f.values())]
    if not bad:
        return feeds
    where = ", ".join(map(str, bad[:8])) + (", ..." if len(bad) > 8 else "")
    if keep_order:
        raise ValueError(f"{what}: {len(bad)} input(s) hold NaN or Inf values (index {where}); "
                         f"remove or fix them (inputs are reported, and matched with labels, "
                         f"by index)")
    if len(bad) == len(feeds):
        raise ValueError(f"{what}: every batch ({len(feeds)}) has NaN or Inf values "
                         "(or values past float32); nothing to calibrate on")
    warnings.warn(f"{what}: skipped {len(bad)} of {len(feeds)} batches with NaN or Inf values "
                  f"(batch {where})", NonFiniteDataWarning, stacklevel=3)
    return [f for i, f in enumerate(feeds) if i not in set(bad)]


def _warn_degenerate(feeds: list[Feed], what: str) -> None:
    for n in feeds[0]:
        if feeds[0][n].dtype.kind != "f":
            continue
        peak = max(float(np.abs(f[n]).max(initial=0.0)) for f in feeds)
        if peak == 0:
            warnings.warn(f"{what}: input '{n}' is all zero; its scale (and every range it "
                          "drives) says nothing about real data", DegenerateDataWarning, stacklevel=3)
        elif peak < MIN_SCALE:
            warnings.warn(f"{what}: input '{n}' peaks at {peak:.3g}, below the smallest "
                          f"quantization step {MIN_SCALE:g}: it quantizes to zero (check the "
                          "preprocessing)", DegenerateDataWarning, stacklevel=3)


class NonFiniteDataWarning(UserWarning):
    """Batches with NaN/Inf were left out of calibration or evaluation."""


class DegenerateDataWarning(UserWarning):
    """An input carries no usable range (all zero, or below the smallest step)."""


def load_image(path: Path | np.ndarray, size: tuple[int, int],
               preprocess: str | Callable[[np.ndarray], np.ndarray] = "imagenet",
               layout: str = "NCHW") -> np.ndarray:
    """One image as a (1, C, H, W) float32 batch: RGB, short side resized to 1.14x then
    centre-cropped to ``size`` (the usual ImageNet evaluation transform), preprocessed."""
    from PIL import Image

    if isinstance(path, np.ndarray):
        img = Image.fromarray(path).convert("RGB")
    else:
        try:
            with Image.open(path) as f:
                img = f.convert("RGB")   # decodes: a truncated file fails here
        except (OSError, SyntaxError, ValueError) as e:  # PIL's UnidentifiedImageError is an OSError
            raise ValueError(f"image '{path}' cannot be read ({e}); remove or replace it") from e
    h, w = size
    scale = 1.14 * max(h, w) / min(img.size)
    img = img.resize((max(w, round(img.size[0] * scale)), max(h, round(img.size[1] * scale))),
                     Image.BILINEAR)
    left, top = (img.size[0] - w) // 2, (img.size[1] - h) // 2
    x = np.asarray(img.crop((left, top, left + w, top + h)), np.float32)
    check_preprocess(preprocess)
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
