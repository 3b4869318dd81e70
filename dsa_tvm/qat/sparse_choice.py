"""Which layers to prune N:M: the ones whose zeros cost the output least for what they save.

Pruning every eligible layer of a compact network is often too much at once:
EfficientNet-Lite0 pruned 2:4 in all 33 eligible layers falls from an output cosine of
0.996 against FP32 to 0.08, and a few hundred distillation steps do not bring it back.
As :func:`~.precision.choose_bits` does for weight widths, :func:`sparse_sensitivity`
measures each eligible layer pruned alone, and :func:`choose_sparse_layers` prunes the
cheapest layers first, as many as keep the output cosine at a target. The caller then
prunes those, skipping the other eligible ones:
``prune(p, n, m, skip=[k for k in eligible_layers(p, n, m) if k not in chosen], ...)``
(``skip=lambda k: k not in chosen`` prunes the same layers, but the report then gives
"skipped" as the reason a stem stays dense too).

"Cheapest" is cosine lost per MAC saved by default (``per="mac"``): a sparse array runs
a pruned layer's tiles M / N to a cycle, so the multiplications a layer drops are the
cycles it saves, and those sit in the early, wide layers. ``per="weight"`` ranks by
pruned weights instead (the DRAM bytes the compressed tiles save), which favours the
late layers with many channels.

Every measurement prunes a copy of the module (with :func:`~.sparsity.prune` itself), so
the caller's module is never masked and the cosine reached is what the caller's own
``prune`` call gives.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .errors import QatError
from .precision import Batch, fp32_outputs, output_cosine, weighted_layers
from .prepare import _as_args
from .sparse_refit import input_moments
from .sparsity import METHODS, _plan, check_pattern, prune

#: what a pruned layer saves, the denominator of the ranking
PER = ("mac", "weight")


def _check_prepared(prepared: nn.Module) -> None:
    """A module from ``prepare`` that is not pruned yet (a mask is set once)."""
    if not hasattr(prepared, "qat_report"):
        raise QatError("choosing layers to prune takes a module returned by "
                       "dsa_tvm.qat.prepare; prepare it first")
    if getattr(prepared, "qat_sparsity", None) is not None:
        raise QatError("this module is already pruned; choose the layers on the prepared "
                       "module before calling prune (or prepare the FP32 model again)")


def _check_batches(batches: Iterable[Any], what: str = "batches") -> list[Batch]:
    """Input batches as tuples of tensors; at least one."""
    out = [_as_args(b) for b in batches]
    if not out:
        raise QatError(f"{what} is empty; pass at least one input batch (e.g. held-out "
                       f"images)")
    return out


def _check_target(min_cosine: Any) -> float:
    """The target as a float in [0, 1]."""
    ok = isinstance(min_cosine, (int, float)) and not isinstance(min_cosine, bool)
    if not ok or not math.isfinite(min_cosine) or not 0.0 <= min_cosine <= 1.0:
        raise QatError(f"min_cosine={min_cosine!r}: pass an output cosine between 0 and 1, "
                       f"e.g. the dense prepared module's cosine minus 0.01")
    return float(min_cosine)


def eligible_layers(prepared: nn.Module, n: int, m: int) -> list[str]:
    """The layers ``prune(prepared, n, m)`` would prune with no ``skip`` (not depthwise,
    at least M input channels), in the module's order."""
    layers = weighted_layers(prepared)
    dense = dict(_plan(layers, n, m, None, m).dense)
    return [name for name in layers if name not in dense]


def _copy(prepared: nn.Module) -> nn.Module:
    """A deep copy ``prune`` accepts: an fx module's deepcopy drops plain attributes,
    so the ``qat_*`` ones ``prepare`` set are copied over."""
    twin = copy.deepcopy(prepared)
    for key, value in vars(prepared).items():
        if key.startswith("qat_"):
            setattr(twin, key, copy.deepcopy(value))
    return twin


def _pruned_cosine(prepared: nn.Module, chosen: Sequence[str], n: int, m: int,
                   batches: Sequence[Batch], ref: Sequence[torch.Tensor],
                   calibration_data: Sequence[Batch] | None = None,
                   how: Mapping[str, Any] | None = None) -> float:
    """Output cosine with the ``chosen`` layers pruned, measured on a pruned copy
    (``how``: ``prune``'s ``method`` and ``moments``)."""
    if not chosen:
        return output_cosine(prepared, batches, ref)
    keep = set(chosen)
    twin = _copy(prepared)
    prune(twin, n, m, skip=lambda name: name not in keep, calibration_data=calibration_data,
          **(how or {}))
    return output_cosine(twin, batches, ref)


def sparse_sensitivity(prepared: nn.Module, batches: Iterable[Any], n: int = 2, m: int = 4,
                       reference: Sequence[torch.Tensor] | None = None, *,
                       method: str = "magnitude",
                       refit_data: Iterable[Any] | None = None) -> dict[str, float]:
    """The output cosine (against FP32, the prepared module's ``float`` mode) each
    eligible layer loses when it alone is pruned N:M (by ``prune``'s ``method``, refit on
    ``refit_data``): the dense prepared module's cosine minus the pruned one's, most
    sensitive first. ``reference``: the FP32 outputs, when the caller has them. The
    copies are not recalibrated (``prune`` re-derives their bias corrections), which is
    enough to rank the layers and one pass cheaper each."""
    _check_prepared(prepared)
    n, m = check_pattern(n, m)
    batches = _check_batches(batches)
    ref = reference if reference is not None else fp32_outputs(prepared, batches)
    return _sensitivity(prepared, batches, n, m, ref,
                        _pruning_args(prepared, n, m, method, refit_data))


def _sensitivity(prepared: nn.Module, batches: Sequence[Batch], n: int, m: int,
                 ref: Sequence[torch.Tensor], how: Mapping[str, Any]) -> dict[str, float]:
    dense = output_cosine(prepared, batches, ref)
    lost = {name: dense - _pruned_cosine(prepared, [name], n, m, batches, ref, how=how)
            for name in eligible_layers(prepared, n, m)}
    return dict(sorted(lost.items(), key=lambda kv: -kv[1]))


def _pruning_args(prepared: nn.Module, n: int, m: int, method: str,
                  refit_data: Iterable[Any] | None) -> dict[str, Any]:
    """``prune``'s ``method`` and, for SparseGPT, every eligible layer's input moments on
    ``refit_data``, captured once: every measurement then refits from the same moments,
    as the caller's ``prune(..., refit_data=...)`` captures them from the unpruned module."""
    if method not in METHODS:
        raise QatError(f"method={method!r}: choose one of {METHODS}")
    if method == "magnitude":
        return {}
    data = None if refit_data is None else _check_batches(refit_data, "refit_data")
    if data is None:
        raise QatError("method='sparsegpt' refits the weights on real inputs; pass "
                       "refit_data (or calibration_data), e.g. a hundred images")
    layers = weighted_layers(prepared)
    eligible = [layers[k] for k in eligible_layers(prepared, n, m)]
    return {"method": method, "moments": input_moments(prepared, eligible, data)}


def _kept_channels(c: int, n: int, m: int) -> int:
    """Input channels N:M keeps of ``c`` per output channel and tap (a partial last
    group keeps at most N)."""
    return (c // m) * n + min(n, c % m)


def _positions(prepared: nn.Module, batch: Batch) -> dict[str, int]:
    """How many times each weighted layer applies each weight per example: its output
    elements per output channel (a convolution's output pixels, a linear layer's tokens)."""
    seen: dict[str, int] = {}

    def hook(layer: nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        seen[layer.name] = out.numel() // (out.shape[0] * layer.weight.shape[0])

    handles = [la.register_forward_hook(hook) for la in weighted_layers(prepared).values()]
    try:
        with torch.no_grad():
            prepared(*batch)
    finally:
        for h in handles:
            h.remove()
    return seen


def pruned_cost(prepared: nn.Module, batch: Batch, n: int, m: int,
                per: str = "mac") -> dict[str, int]:
    """What N:M pruning removes from each eligible layer: multiply-accumulates per
    example (``per="mac"``, measured on ``batch``'s shapes) or weights (``"weight"``)."""
    if per not in PER:
        raise QatError(f"per={per!r}: pass one of {PER} (what a pruned layer saves)")
    layers = weighted_layers(prepared)
    positions = _positions(prepared, batch) if per == "mac" else {}
    out = {}
    for name in eligible_layers(prepared, n, m):
        w = layers[name].weight
        c = int(w.shape[1])
        pruned = w.numel() // c * (c - _kept_channels(c, n, m))
        out[name] = pruned * positions.get(name, 1)
    return out


def _longest_prefix(order: Sequence[str], measure: Callable[[Sequence[str]], float],
                    target: float) -> tuple[list[str], float]:
    """The longest prefix of ``order`` all of whose prefixes keep ``measure`` >= target,
    with its measure. A prefix, so a stricter target's choice is part of a looser one's;
    the whole list is tried first (one measurement when a loose target allows it all);
    when even nothing pruned misses the target, nothing is chosen."""
    reached = measure([])
    if reached < target:
        return [], reached
    everything = measure(order)
    if everything >= target:
        return list(order), everything
    chosen: list[str] = []
    for name in order:
        cos = measure([*chosen, name])
        if cos < target:
            break
        chosen, reached = [*chosen, name], cos
    return chosen, reached


def _ranking(lost: Mapping[str, float], eligible: Sequence[str]) -> dict[str, float]:
    """A caller's ranking, checked to cover every eligible layer."""
    missing = [name for name in eligible if name not in lost]
    if missing:
        raise QatError(f"ranking has no loss for {missing[:4]}; pass "
                       f"sparse_sensitivity(prepared, batches, n, m) for the same pattern")
    return {name: float(lost[name]) for name in eligible}


def choose_sparse_layers(prepared: nn.Module, batches: Iterable[Any], min_cosine: float,
                         n: int = 2, m: int = 4, ranking: Mapping[str, float] | None = None,
                         *, per: str = "mac",
                         calibration_data: Iterable[Any] | None = None,
                         method: str = "magnitude", refit_data: Iterable[Any] | None = None
                         ) -> tuple[list[str], float]:
    """The eligible layers to prune N:M so the output cosine (against FP32, on
    ``batches``) stays >= ``min_cosine``, and the cosine they reach together.

    Layers are taken in order of cosine lost (``ranking``, else
    :func:`sparse_sensitivity`) per MAC or weight saved (``per``), least first, for as
    long as the layers chosen so far, pruned together, keep the target. Pass the
    ``calibration_data``, ``method`` and ``refit_data`` the caller's ``prune`` will get,
    so each set is measured as that call prunes it. Target 0 prunes every eligible
    layer the cosine allows (all, unless it goes negative); a target above the dense
    module's cosine prunes none. The module is not changed: prune it with the other
    :func:`eligible_layers` as ``skip``.
    """
    target = _check_target(min_cosine)
    _check_prepared(prepared)
    n, m = check_pattern(n, m)
    batches = _check_batches(batches)
    cal = None if calibration_data is None else _check_batches(calibration_data, "calibration_data")
    how = _pruning_args(prepared, n, m, method, refit_data if refit_data is not None else cal)
    eligible = eligible_layers(prepared, n, m)
    saved = pruned_cost(prepared, batches[0], n, m, per)
    ref = fp32_outputs(prepared, batches)
    lost = _ranking(ranking if ranking is not None else
                    _sensitivity(prepared, batches, n, m, ref, how), eligible)
    order = sorted(eligible, key=lambda k: (lost[k] / max(saved[k], 1), -saved[k], k))
    return _longest_prefix(order, lambda chosen: _pruned_cosine(
        prepared, chosen, n, m, batches, ref, cal, how), target)
