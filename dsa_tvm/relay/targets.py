"""``relay.build``'s ``target`` argument as old scripts wrote it, turned into a TVM 0.27 target.

TVM 0.27 refuses CLI target strings with flags (``"llvm -mcpu=skylake"``) and the DSA
presets are tags (``"dsa"``, ``"dsa-edge"``); a hardware description (config or TOML
file) goes through :func:`dsa_tvm.target`, which also remembers it for the compile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..hw.config import HardwareConfig, preset_names
from ..target import is_dsa
from ..target import target as dsa_target

#: target options that are lists in TVM 0.27 even when the CLI string gave one value
_LIST_OPTIONS = ("mattr", "keys", "libs")


def resolve(target: Any, target_host: Any = None):
    """A ``tvm.target.Target`` for ``target`` (string, dict, Target, HardwareConfig or TOML
    path), with ``target_host`` as its host when given. Raises ValueError naming the fix."""
    import tvm

    if target is None:
        target = tvm.target.Target.current(allow_none=True)
        if target is None:
            raise ValueError("relay.build needs a target: target='dsa' (the accelerator, "
                             "CPU for the rest), 'dsa-edge', a HardwareConfig, or 'llvm'")
    tgt = _one(target)
    if target_host is not None:
        tgt = tvm.target.Target(tgt, host=_one(target_host))
    return tgt


def _one(target: Any):
    import tvm

    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, (HardwareConfig, Path)):
        return dsa_target(target)
    if isinstance(target, str):
        name = target.strip()
        if name == "dsa":
            return dsa_target(None)
        if name.startswith("dsa-"):
            if name[4:] not in preset_names():
                tags = ", ".join("dsa" if p == "default" else f"dsa-{p}" for p in preset_names())
                raise ValueError(f"unknown DSA target {name!r}: the presets are {tags}; "
                                 "other hardware is a HardwareConfig or a TOML path")
            return dsa_target(name[4:])
        if name.endswith(".toml"):
            return dsa_target(name)
        return _from_string(name)
    if isinstance(target, dict) and "kind" in target:
        return tvm.target.Target(target)
    raise ValueError(f"unsupported target {target!r} ({type(target).__name__}): give a string "
                     "('dsa', 'dsa-edge', 'llvm'), a dict, a tvm.target.Target or a HardwareConfig "
                     "(several targets in a dict, as heterogeneous Relay builds took, are not supported)")


def _from_string(text: str):
    """``"llvm -mcpu=skylake -mattr=+avx2,+fma"`` -> Target of the equivalent dict."""
    import tvm

    try:
        return tvm.target.Target(text)
    except ValueError:
        if " -" not in text:
            raise
    kind, *flags = text.split()
    spec: dict[str, Any] = {"kind": kind}
    for flag in flags:
        key, sep, value = flag.lstrip("-").partition("=")
        spec[key] = _option(key, value) if sep else True
    try:
        return tvm.target.Target(spec)
    except ValueError as e:
        raise ValueError(f"target {text!r}: TVM 0.27 takes targets as dicts; read as {spec}, which "
                         f"TVM refuses ({str(e).splitlines()[0]}); pass a dict instead") from None


def _option(key: str, value: str) -> Any:
    if key in _LIST_OPTIONS or "," in value:
        return [v for v in value.split(",") if v]
    try:
        return int(value)
    except ValueError:
        return value


def runs_on_cpu(tgt) -> bool:
    """Whether code built for ``tgt`` runs on ``tvm.cpu()`` (LLVM, C, and the DSA, whose
    simulator is driven from the host)."""
    return is_dsa(tgt) or str(tgt.kind.name) in ("llvm", "c")
