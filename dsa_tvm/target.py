"""The ``dsa`` TVM target: registration and the hook into ``tvm.compile``.

TVM cannot register a new target kind from Python, so ``dsa`` is an LLVM
target tag with key ``"dsa"`` whose ``model`` names the hardware description.
``tvm.compile`` runs the pipeline registered as ``"default"`` for every CPU
target; dsa-tvm wraps that entry so that it offloads DSA regions first when
the current target carries the ``dsa`` key, and changes nothing otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .hw.config import ConfigError, HardwareConfig, load_config, preset_names

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
    """The hardware description behind a DSA target.

    A target carries only the name of its hardware (``model``): a preset, or the name of
    a description loaded with :func:`target` in this process. Any other name (a target
    made from a TOML file and reused in a new process) is refused, never compiled for
    another part."""
    model = str(tgt.attrs.get("model", "") or "") if hasattr(tgt, "attrs") else ""
    model = model or "default"
    cfg = _configs.get(model)
    if cfg is None:
        if model not in preset_names():
            raise ConfigError(
                f"DSA target names hardware '{model}', which is neither a preset "
                f"({', '.join(preset_names())}) nor a description loaded in this process "
                f"(loaded: {', '.join(sorted(_configs)) or 'none'}). A target keeps only the "
                f"hardware's name: load the description again with "
                f"dsa_tvm.target('path/to/{model.rsplit('-', 1)[0]}.toml') (or "
                f"dsa_tvm.target(config)) in this process and compile with that target")
        cfg = _configs[model] = load_config(model)
    return cfg


def register(wrap_pipeline: Callable[[Any], Any]) -> None:
    """Register the ``dsa`` tags (``dsa``, ``dsa-edge``, ...) and the pipeline hook once:
    ``wrap_pipeline`` wraps TVM's default Relax pipeline (``pipeline.py`` passes its own;
    the target does not import the compiler)."""
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

    relax.pipeline.PIPELINE_MAP["default"] = wrap_pipeline(relax.pipeline.PIPELINE_MAP["default"])
    _registered = True
