"""N:M structured weight sparsity: prune a prepared module the way the DSA's array reads it.

The DSA multiplies a weight tile of ``block_out`` x ``block_in`` int8 codes, one row per
output channel, the columns a run of the reduction: ``block_in`` consecutive input
channels at one kernel tap for a convolution, consecutive input features for a linear
layer. It can skip zeros when, in every row, every aligned group of M consecutive
columns holds at most N nonzero codes. The compiler finds that pattern in the weight
values themselves, so pruning only has to put the zeros there.

:func:`prune` keeps the N largest ``|w|`` of every aligned group of M input channels
(per output channel and kernel tap) and records the choice as a mask on each
:class:`~.layers.WeightedLayer`. The layer applies the mask in every mode: a pruned
weight computes as zero, gets no gradient, and exports as code 0. M divides every
preset's ``block_in``, so aligned groups along the channels are aligned inside each tile.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..hw.sparsity import parse_n_m
from .errors import QatError
from .layers import WeightedLayer
from .precision import weighted_layers
from .prepare import _as_args, calibrate
from .sparse_refit import refit_all

#: group sizes a pattern may use: each divides the 16 input channels of a tile on the
#: ``default`` preset (and 2, 4, 8 also the 8 of ``edge``), so groups never straddle tiles
GROUP_SIZES = (2, 4, 8, 16)
#: the input channel (reduction) axis of both weight layouts, conv [O, C, kh, kw] and
#: linear [O, C]
CHANNEL_AXIS = 1

Skip = Callable[[str], bool] | Iterable[str] | str | None
#: how :func:`prune` picks the zeros: the smallest weights, or SparseGPT's masks with the
#: weights that stay refit (:mod:`.sparse_refit`)
METHODS = ("magnitude", "sparsegpt")


@dataclass(frozen=True)
class LayerSparsity:
    """One weighted layer after pruning: what was pruned, or why it stays dense."""

    name: str
    kind: str           # "conv2d" | "linear"
    in_channels: int
    weights: int        # weight count
    pruned: int         # weights the mask holds at zero (0 for a dense layer)
    codes_n: int        # most nonzero codes in any aligned group of M (<= N when pruned)
    why: str = ""       # why the layer stays dense; "" for a pruned layer

    @property
    def is_pruned(self) -> bool:
        return not self.why

    @property
    def density(self) -> float:
        """The share of weights the mask lets be nonzero."""
        return 1.0 - self.pruned / max(self.weights, 1)


@dataclass
class SparsityReport:
    """What :func:`prune` did to every weighted layer of a prepared module."""

    n: int
    m: int
    layers: list[LayerSparsity] = field(default_factory=list)

    @property
    def pruned_share(self) -> float:
        """The share of all the array's weights (every weighted layer's) pruned to zero."""
        total = sum(la.weights for la in self.layers)
        return sum(la.pruned for la in self.layers) / max(total, 1)

    @property
    def runs_sparse(self) -> bool:
        """Whether an array can declare this pattern (``[array] sparsity``, whose rule is
        ``hw.sparsity.parse_n_m``: N must divide M); otherwise every part runs it dense."""
        return parse_n_m(f"{self.n}:{self.m}") is not None

    @property
    def dense(self) -> list[tuple[str, str]]:
        """(layer, why) for every layer left dense."""
        return [(la.name, la.why) for la in self.layers if not la.is_pruned]

    def summary(self) -> str:
        pruned = [la for la in self.layers if la.is_pruned]
        lines = [f"sparsity {self.n}:{self.m}: {len(pruned)} of {len(self.layers)} weighted "
                 f"layers pruned, {100 * self.pruned_share:.1f}% of the array's weights zero"]
        lines += [f"  pruned: {la.name} ({la.kind}, {la.in_channels} input channels): density "
                  f"{la.density:.2f}, at most {la.codes_n} nonzero codes per group of {self.m}"
                  for la in pruned]
        lines += [f"  dense: {name}: {why}" for name, why in self.dense]
        if not self.runs_sparse:
            lines.append(f"  note: no array runs {self.n}:{self.m} sparse (N must divide M, "
                         f"e.g. 2:4, 1:4, 4:8); the pruned model runs dense, unchanged")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Plan:
    """The pattern a module was pruned with and the layers left dense (with why)."""

    n: int
    m: int
    dense: tuple[tuple[str, str], ...]


def check_pattern(n: Any, m: Any) -> tuple[int, int]:
    """(n, m) as ints when ``n`` of every ``m`` is a pattern :func:`prune` makes."""
    if isinstance(n, bool) or isinstance(m, bool) or not (isinstance(n, int)
                                                          and isinstance(m, int)):
        raise QatError(f"sparsity {n!r}:{m!r}: N and M are whole numbers; pass e.g. n=2, m=4")
    if m not in GROUP_SIZES:
        raise QatError(f"sparsity {n}:{m}: M={m} is not one of {GROUP_SIZES} (a group must "
                       f"divide a weight tile's 16 input channels); pass e.g. 2:4")
    if not 1 <= n < m:
        raise QatError(f"sparsity {n}:{m}: N must be at least 1 and below M={m} (N of every M "
                       f"weights stay); pass e.g. {m // 2}:{m}")
    return n, m


def parse_pattern(text: str) -> tuple[int, int]:
    """``"N:M"`` (e.g. ``"2:4"``) as (N, M), checked by :func:`check_pattern`."""
    found = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(text))
    if found is None:
        raise QatError(f"sparsity {text!r} is not N:M; pass N nonzero weights of every M, "
                       f"e.g. 2:4")
    return check_pattern(int(found.group(1)), int(found.group(2)))


def _groups(a: np.ndarray, m: int, axis: int, fill: float) -> tuple[np.ndarray, int]:
    """``a`` with ``axis`` moved last and split into aligned groups of ``m`` (the last
    partial group padded with ``fill``): shape [..., groups, m], and the axis' length."""
    moved = np.moveaxis(np.asarray(a), axis, -1)
    c = moved.shape[-1]
    pad = np.full(moved.shape[:-1] + ((-c) % m,), fill, dtype=moved.dtype)
    padded = np.concatenate([moved, pad], axis=-1)
    return padded.reshape(padded.shape[:-1] + (padded.shape[-1] // m, m)), c


def group_nonzeros(codes: np.ndarray, m: int, axis: int = CHANNEL_AXIS) -> np.ndarray:
    """Nonzero count of every aligned group of ``m`` along ``axis`` (the last group may be
    partial: the hardware pads it with zero channels): shape [..., groups]."""
    g, _ = _groups(np.asarray(codes) != 0, m, axis, False)
    return g.sum(axis=-1)


def n_m_of(codes: np.ndarray, m: int, axis: int = CHANNEL_AXIS) -> int:
    """The smallest N for which ``codes`` (int8 weight codes, or any array) are N:M along
    ``axis``: the most nonzeros in any aligned group of ``m``."""
    counts = group_nonzeros(codes, m, axis)
    return int(counts.max()) if counts.size else 0


def is_n_m(codes: np.ndarray, n: int, m: int, axis: int = CHANNEL_AXIS) -> bool:
    """Whether every aligned group of ``m`` along ``axis`` holds at most ``n`` nonzeros
    (the test the DSA's array makes on each row of a weight tile)."""
    return n_m_of(codes, m, axis) <= n


def n_m_mask(weight: np.ndarray, n: int, m: int, axis: int = CHANNEL_AXIS) -> np.ndarray:
    """True for the ``n`` largest ``|w|`` of every aligned group of ``m`` along ``axis``
    (all of a partial last group's entries when it has ``n`` or fewer). Among equal
    magnitudes the lower index is kept: the same weights always give the same mask."""
    mag, c = _groups(np.abs(np.asarray(weight, np.float64)), m, axis, -1.0)  # pads rank last
    order = np.argsort(-mag, axis=-1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(m), order.shape), axis=-1)
    keep = (rank < n).reshape(mag.shape[:-2] + (mag.shape[-2] * m,))[..., :c]
    return np.moveaxis(keep, -1, axis)


def _skip_test(skip: Skip, names: Iterable[str]) -> Callable[[str], bool]:
    """``skip`` as a predicate on layer names; a listed name that is no layer is an error
    (a typo would otherwise prune the layer it meant to keep)."""
    if skip is None:
        return lambda _name: False
    if callable(skip):
        return lambda name: bool(skip(name))
    listed = {skip} if isinstance(skip, str) else set(skip)
    if not all(isinstance(s, str) for s in listed):
        raise QatError("skip takes layer names (a list of str) or a callable name -> bool")
    unknown = sorted(listed - set(names))
    if unknown:
        known = ", ".join(sorted(names)[:8])
        raise QatError(f"skip names {unknown}, which are no weighted layers; names are the "
                       f"source modules' paths, e.g. {known}")
    return lambda name: name in listed


def _dense_reason(layer: WeightedLayer, skipped: bool, min_in_channels: int) -> str:
    """Why ``layer`` stays dense ("" when it is pruned)."""
    groups = int(layer.conv.get("groups", 1)) if layer.kind == "conv2d" else 1
    if groups != 1:
        return ("depthwise: one input channel per output channel, no group of M to prune "
                "(on the array its tiles are diagonal, already mostly zeros)"
                if layer.weight.shape[1] == 1 else f"grouped convolution (groups={groups})")
    if skipped:
        return "skipped by the caller"
    if layer.group:
        return (f"weights per group of {layer.group} rows (a grid with an offset: a pruned "
                f"zero is no code of it; the grouped dense has no sparse form)")
    c = _in_channels(layer)
    if c < min_in_channels:
        return (f"{c} input channels < min_in_channels={min_in_channels} (a stem: few weights "
                f"to save, and every one matters)")
    return ""


def _in_channels(layer: WeightedLayer) -> int:
    return int(layer.weight.shape[CHANNEL_AXIS])


def _plan(layers: dict[str, WeightedLayer], n: int, m: int, skip: Skip,
          min_in_channels: int) -> _Plan:
    test = _skip_test(skip, layers)
    dense = ((name, _dense_reason(la, test(name), min_in_channels))
             for name, la in layers.items())
    return _Plan(n, m, tuple((name, why) for name, why in dense if why))


def _masks(layers: dict[str, WeightedLayer], plan: _Plan) -> dict[str, torch.Tensor]:
    """The N:M mask of every layer the plan prunes, all computed before any is set (a
    layer with NaN weights must not leave the module half pruned)."""
    dense = dict(plan.dense)
    masks = {}
    for name, la in layers.items():
        if name in dense:
            continue
        w = la.masked_weight().detach().numpy()
        if not np.isfinite(w).all():
            raise QatError(f"layer {name}: weights are NaN or infinite; prune finite weights "
                           f"(prepare the FP32 model again)")
        masks[name] = torch.from_numpy(n_m_mask(w, plan.n, plan.m))
    return masks


def report(prepared: nn.Module) -> SparsityReport:
    """The sparsity of a pruned module's weights as they are now (codes measured from the
    current weights, so after fine-tuning it shows the pattern held)."""
    plan = getattr(prepared, "qat_sparsity", None)
    if plan is None:
        raise QatError("this module was not pruned; call dsa_tvm.qat.prune first")
    why = dict(plan.dense)
    rows = []
    for name, la in weighted_layers(prepared).items():
        _, wq, _, _ = la.quant_params()
        pruned = 0 if la.mask is None else int((~la.mask).sum())
        rows.append(LayerSparsity(name, la.kind, _in_channels(la), la.weight.numel(), pruned,
                                  n_m_of(wq, plan.m), why.get(name, "")))
    return SparsityReport(plan.n, plan.m, rows)


def prune(prepared: nn.Module, n: int = 2, m: int = 4, *, skip: Skip = None,
          min_in_channels: int | None = None,
          calibration_data: Iterable[Any] | None = None, method: str = "magnitude",
          refit_data: Iterable[Any] | None = None,
          moments: Mapping[str, torch.Tensor] | None = None, sequential: bool = False,
          show_progress: bool = False) -> SparsityReport:
    """Prune a module from :func:`~.prepare.prepare` to N:M structured sparsity.

    In every weighted layer, of every aligned group of ``m`` input channels (per output
    channel and kernel tap) the ``n`` largest-magnitude weights stay and the rest are held
    at zero through training and export. Depthwise convolutions stay dense (one input
    channel per output channel: nothing to group), as do layers named by ``skip`` (names,
    or a callable ``name -> bool``) and layers with fewer than ``min_in_channels`` input
    channels (default ``m``: an RGB stem). Prune after ``prepare`` and before ``distill``.

    ``method="sparsegpt"`` chooses each layer's masks and refits the weights that stay so
    its output on real inputs changes least (:mod:`.sparse_refit`). The inputs are the
    unpruned module's on ``refit_data`` (default: ``calibration_data``; a few thousand
    input rows per layer, e.g. a hundred images, are enough), captured in one pass, or
    ``moments`` already captured (``sparse_refit.input_moments``). ``sequential=True``
    captures each layer's inputs after the layers before it are pruned instead, one pass
    a layer (on EfficientNet-Lite0 and MiniLM no better: docs/qat.md).
    ``show_progress`` shows a bar over the layers.

    Weight scales need nothing: they are ``max|w| / qmax`` per output channel, recomputed
    at every forward pass from the masked weights. With ``calibration_data`` the
    activation grids and bias corrections are calibrated again on the pruned network (as
    if it had been prepared pruned); without, the bias corrections are re-derived from the
    input means the first calibration kept. Pruning again with the same pattern and layers changes no
    mask; with another, it is an error (prepare the FP32 model again).
    """
    if not hasattr(prepared, "qat_report"):
        raise QatError("prune takes a module returned by dsa_tvm.qat.prepare; prepare it first")
    n, m = check_pattern(n, m)
    min_in = m if min_in_channels is None else min_in_channels
    if isinstance(min_in, bool) or not isinstance(min_in, int) or min_in < 1:
        raise QatError(f"min_in_channels={min_in!r}: pass a whole number >= 1 (layers with "
                       f"fewer input channels stay dense)")
    batches = None if calibration_data is None else [_as_args(b) for b in calibration_data]
    if batches == []:
        raise QatError("calibration_data is empty; pass at least one batch, or None to keep "
                       "the activation scales")
    if method not in METHODS:
        raise QatError(f"method={method!r}: choose one of {METHODS}")
    refit = batches if refit_data is None else [_as_args(b) for b in refit_data]
    if method == "sparsegpt" and not refit and moments is None:
        raise QatError("method='sparsegpt' refits the weights on real inputs; pass "
                       "calibration_data (or refit_data), e.g. a hundred images")
    layers = weighted_layers(prepared)
    plan = _plan(layers, n, m, skip, min_in)
    previous = getattr(prepared, "qat_sparsity", None)
    if previous is not None and previous != plan:
        raise QatError(f"this module is already pruned {previous.n}:{previous.m} (dense: "
                       f"{[name for name, _ in previous.dense]}); a mask is set once: prepare "
                       f"the FP32 model again to prune it {n}:{m} or with other layers")
    if previous is None:
        dense = dict(plan.dense)
        pruned = [k for k in layers if k not in dense]
        if method == "sparsegpt":
            refit_all(prepared, pruned, n, m, refit, moments=moments, sequential=sequential,
                      show_progress=show_progress)
        else:
            masks = _masks(layers, plan)
            for name, mask in masks.items():
                layers[name].set_mask(mask)
        prepared.qat_sparsity = plan
        if batches is None:  # the weights whose rounding the corrections cancelled are gone
            for name in pruned:
                layers[name].rederive_bias_correction()
    if batches is not None:
        calibrate(prepared, batches, getattr(prepared, "qat_bias_correction", True))
    return report(prepared)
