"""Registry of the bundled models with an on-disk cache of the generated ONNX files.

The cache lives in ``$DSA_TVM_CACHE`` (default ``~/.cache/dsa-tvm/models``); a file's
name carries a hash of everything that determines its contents (builder, its bound
arguments, the quantization settings and the onnxruntime version).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnx

from .cnn import mobilenet_v2, resnet18, resnet50, small_cnn
from .quantize import calibration_data, qdq_quantize
from .transformer import transformer_encoder

# bump when a builder or the quantization recipe changes what gets generated
FORMAT_VERSION = 1

BUILDERS: dict[str, Callable[..., onnx.ModelProto]] = {
    "small_cnn": small_cnn,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "transformer_encoder": transformer_encoder,
}

# calibration recipe used for the quantized variants (seed differs from test inputs' seeds)
CALIBRATION_SIZE = 8
CALIBRATION_SEED = 1234


def list_models() -> list[str]:
    """Names accepted by :func:`get_model`."""
    return list(BUILDERS)


def cache_dir() -> Path:
    """``$DSA_TVM_CACHE`` if set, else ``~/.cache/dsa-tvm/models``."""
    env = os.environ.get("DSA_TVM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dsa-tvm" / "models"


def _bound_args(name: str, size_kwargs: dict) -> dict:
    if name not in BUILDERS:
        raise KeyError(f"unknown model {name!r}; choose from {', '.join(BUILDERS)}")
    sig = inspect.signature(BUILDERS[name])
    try:
        bound = sig.bind(**size_kwargs)
    except TypeError as e:
        raise TypeError(f"{name}: {e} (parameters: {', '.join(sig.parameters)})") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _quant_settings(per_channel: bool, calibration_size: int) -> dict:
    import onnxruntime

    return {"per_channel": per_channel, "calibration_size": calibration_size,
            "calibration_seed": CALIBRATION_SEED, "format": "QDQ", "activation": "QInt8",
            "weight": "QInt8", "onnxruntime": onnxruntime.__version__}


def _key(spec: dict) -> str:
    blob = json.dumps(spec, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _atomic_save(model: onnx.ModelProto, path: Path, spec: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        onnx.save(model, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    path.with_suffix(".json").write_text(json.dumps(spec, indent=1, sort_keys=True, default=str))


def get_model_path(name: str, quantized: bool = True, *, per_channel: bool = True,
                   calibration_size: int = CALIBRATION_SIZE, **size_kwargs) -> Path:
    """Path of the cached ONNX file for ``name`` (generated on first use).

    ``size_kwargs`` go to the builder (e.g. ``input_size=32, width=16`` for resnet18);
    ``quantized`` selects the onnxruntime QDQ int8 model calibrated on
    ``calibration_size`` deterministic inputs, otherwise the FP32 model.
    """
    args = _bound_args(name, size_kwargs)
    spec: dict = {"model": name, "args": args, "version": FORMAT_VERSION}
    fp32_path = cache_dir() / f"{name}-{_key(spec)}.onnx"
    if not quantized:
        if not fp32_path.exists():
            _atomic_save(BUILDERS[name](**args), fp32_path, spec)
        return fp32_path
    qspec = {**spec, "quantization": _quant_settings(per_channel, calibration_size)}
    q_path = cache_dir() / f"{name}-{_key(qspec)}-qdq.onnx"
    if not q_path.exists():
        fp32 = onnx.load(str(get_model_path(name, False, **size_kwargs)))
        calib = calibration_data(fp32, calibration_size, CALIBRATION_SEED)
        _atomic_save(qdq_quantize(fp32, calib, per_channel=per_channel), q_path, qspec)
    return q_path


def get_model(name: str, quantized: bool = True, *, per_channel: bool = True,
              calibration_size: int = CALIBRATION_SIZE, **size_kwargs) -> onnx.ModelProto:
    """The bundled model ``name`` as an ``onnx.ModelProto`` (QDQ int8 unless
    ``quantized=False``), built once and then loaded from the cache."""
    path = get_model_path(name, quantized, per_channel=per_channel,
                          calibration_size=calibration_size, **size_kwargs)
    return onnx.load(str(path))


def model_or_file(spec: str | Path, shapes=None, notes: list[str] | None = None
                  ) -> tuple[onnx.ModelProto, str]:
    """(onnx.ModelProto, display name) of what a user named: an ONNX file through intake
    (:func:`dsa_tvm.load_onnx`, ``shapes`` for dynamic inputs; its notes appended to
    ``notes``), or a bundled model name (quantized)."""
    from ..frontend.intake import load_onnx

    p = Path(str(spec))
    if p.suffix == ".onnx" or p.exists():
        taken = load_onnx(p, shapes)
        if notes is not None:
            notes.extend(taken.notes)
        return taken.model, p.name
    if str(spec) not in list_models():
        raise FileNotFoundError(f"no ONNX file '{spec}' and no bundled model of that name "
                                f"(bundled: {', '.join(list_models())})")
    return get_model(str(spec), quantized=True), str(spec)
