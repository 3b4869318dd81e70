"""The ``dsa`` TVM target: registration and the hook into ``tvm.compile``.

TVM cannot register a new target kind from Python, so ``dsa`` is an LLVM
target tag with key ``"dsa"`` whose ``model`` names the hardware description.
``tvm.compile`` runs the pipeline registered as ``"default"`` for every CPU
target; dsa-tvm wraps that entry so that it offloads DSA regions first when
the current target carries the ``dsa`` key, and changes nothing otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .hw.config import HardwareConfig, load_config, preset_names

KEY = "dsa"
_configs: dict[str, HardwareConfig] = {}
_registered = False


def _target_dict(model: str) -> dict[str, Any]:
    return {"kind": "llvm", "keys": [KEY, "cpu"], "model": model}


def target(hw: "str | Path | HardwareConfig | None" = None):
    """A ``tvm.target.Target`` for the DSA with hardware ``hw`` (preset name, TOML file
    or config; default preset by default). ``"dsa"`` alone names the default preset."""
    import tvm

    cfg = load_config(hw)
    model = cfg.name if hw is None or (isinstance(hw, str) and hw in preset_names()) \
        else f"{cfg.name}-{cfg.fingerprint.hex()[:8]}"
    _configs[model] = cfg
    return tvm.target.Target(_target_dict(model))


def is_dsa(tgt) -> bool:
    return tgt is not None and KEY in list(tgt.keys)


def config_of(tgt) -> HardwareConfig:
    """The hardware description behind a DSA target."""
    model = str(tgt.attrs.get("model", "default")) if hasattr(tgt, "attrs") else "default"
    if model not in _configs:
        _configs[model] = load_config(model if model in preset_names() else "default")
    return _configs[model]


def register() -> None:
    """Register the ``dsa`` tags (``dsa``, ``dsa-edge``, ...) and the pipeline hook once."""
    global _registered
    if _registered:
        return
    import tvm
    from tvm import relax

    for name in preset_names():
        tag = KEY if name == "default" else f"{KEY}-{name}"
        tvm.target.Target(_target_dict(name))  # validate before registering (see TVM_NOTES)
        tvm.target.tag.register_tag(tag, _target_dict(name))
        _configs[name] = load_config(name)

    from .pipeline import dsa_aware_default_pipeline

    relax.pipeline.PIPELINE_MAP["default"] = dsa_aware_default_pipeline(
        relax.pipeline.PIPELINE_MAP["default"])
    _registered = True
