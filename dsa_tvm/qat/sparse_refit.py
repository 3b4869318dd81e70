"""N:M pruning that refits the weights it keeps (SparseGPT, Frantar and Alistarh, 2023).

Magnitude pruning drops the N smallest of every M weights and leaves the rest as they
were, so each pruned weight's share of the output is simply lost. The inputs of a layer
are correlated, though: the weights that stay can take over much of what the pruned ones
did. SparseGPT prunes one input column at a time and spreads each pruned weight's
contribution over the columns not yet visited, in proportion to the inverse of the
inputs' second-moment matrix ``H = X X^T`` (the optimal brain surgeon's update, the same
machinery as GPTQ's rounding, :mod:`dsa_tvm.llm.gptq`). Each aligned group's mask is
chosen when the sweep reaches it, from the weights as updated so far
(``w^2 / [H^-1]_jj^2``, the error a weight's removal would leave), so the mask adapts to
the refit.

The inputs are the prepared module's own, in ``quant`` mode, captured for every layer in
one pass before any is pruned (capturing each after the layers before it are pruned,
SparseGPT's order, costs a pass a layer and measured no better here). The columns are
visited tap by tap, channels within a tap in order, so the groups are the array's: M
consecutive input channels at one kernel tap (:mod:`.sparsity`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..quant.calibrate import progress
from .errors import QatError
from .layers import WeightedLayer, set_mode
from .precision import weighted_layers

Batch = tuple[torch.Tensor, ...]

#: dampening added to H's diagonal, as a share of its mean (SparseGPT's 1%)
DAMP = 0.01
#: columns updated together (lazy batch updates; whole groups, so a mask is chosen from
#: fully updated weights; any size gives the same result)
BLOCK = 128


class _Stop(Exception):
    """Raised by the capture hook once the layer's input is seen."""


def _columns(layer: WeightedLayer, x: torch.Tensor, raw: torch.Tensor | None) -> torch.Tensor:
    """The layer's input as rows of its reduction columns, [samples, taps * channels],
    tap-major (a convolution's im2col with the channels of one tap together)."""
    if layer.kind == "linear":
        if layer.side_cols is not None and raw is not None:   # those features reach the
            x = x.clone()                                      # weights through the FP32
            x[..., layer.side_cols] = raw[..., layer.side_cols]  # side path
        return x.reshape(-1, x.shape[-1]).double()
    if layer.pad is not None:
        x = F.pad(x, layer.pad)
    kh, kw = layer.weight.shape[2:]
    conv = layer.conv
    cols = F.unfold(x.double(), (kh, kw), dilation=conv.get("dilation", 1),
                    padding=conv.get("padding", 0), stride=conv.get("stride", 1))
    b, _, positions = cols.shape
    c = layer.weight.shape[1]
    cols = cols.reshape(b, c, kh * kw, positions).permute(0, 3, 2, 1)
    return cols.reshape(-1, kh * kw * c)


def input_moments(module: nn.Module, layers: Sequence[WeightedLayer],
                  batches: Sequence[Batch]) -> dict[str, torch.Tensor]:
    """``X^T X`` (float64) of each of ``layers``' input columns over ``batches``, by
    name, the module in ``quant`` mode, in one pass per batch (which stops once the last
    of them has run; nothing is stored but the sums). The batches are checked first: a
    NaN would be rounded onto the first layer's grid and leave finite, wrong moments."""
    check_batches(batches)
    total: dict[str, torch.Tensor] = {}
    waiting: set[str] = set()

    def hook(layer: WeightedLayer, args: tuple) -> None:
        cols = _columns(layer, args[0].detach(), args[1] if len(args) > 1 else None)
        h = cols.T @ cols
        total[layer.name] = h if layer.name not in total else total[layer.name] + h
        waiting.discard(layer.name)
        if not waiting:
            raise _Stop

    handles = [la.register_forward_pre_hook(hook) for la in layers]
    set_mode(module, "quant")
    try:
        with torch.no_grad():
            for b in batches:
                waiting.update(la.name for la in layers)
                try:
                    module(*b)
                except _Stop:
                    pass
    finally:
        for handle in handles:
            handle.remove()
    missing = [la.name for la in layers if la.name not in total]
    if missing:
        raise QatError(f"layer(s) {missing} never ran on the given batches; pass inputs that "
                       f"reach them")
    return total


def _groups(taps: int, channels: int, m: int) -> list[tuple[int, int]]:
    """(start, stop) column ranges of the aligned groups, tap by tap."""
    return [(t * channels + g, t * channels + min(g + m, channels))
            for t in range(taps) for g in range(0, channels, m)]


def _blocks(groups: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Runs of whole groups of about :data:`BLOCK` columns."""
    out: list[list[tuple[int, int]]] = [[]]
    for g in groups:
        if out[-1] and g[1] - out[-1][0][0] > BLOCK:
            out.append([])
        out[-1].append(g)
    return out


def obs_prune(w: torch.Tensor, h: torch.Tensor, groups: list[tuple[int, int]], n: int,
              damp: float = DAMP) -> tuple[torch.Tensor, torch.Tensor]:
    """(refit weights, keep mask) of ``w`` [out, cols]: in every column range of
    ``groups`` at most ``n`` weights per row stay nonzero, and the weights not yet visited
    absorb each pruned one's output on inputs with moments ``h`` [cols, cols]."""
    w = w.detach().double().clone()
    h = h.double().clone()
    cols = w.shape[1]
    dead = torch.diagonal(h) == 0                    # inputs never seen: nothing to balance
    h[dead, dead] = 1.0
    h += damp * torch.diagonal(h).mean() * torch.eye(cols, dtype=h.dtype)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    keep = torch.ones_like(w, dtype=torch.bool)
    for block in _blocks(groups):
        b0, b1 = block[0][0], block[-1][1]
        wb, err = w[:, b0:b1].clone(), torch.zeros_like(w[:, b0:b1])
        for g0, g1 in block:
            if g1 - g0 > n:   # keep the n whose removal would cost the most
                score = wb[:, g0 - b0:g1 - b0] ** 2 / torch.diagonal(hinv)[g0:g1] ** 2
                drop = torch.argsort(score, dim=1, stable=True)[:, :g1 - g0 - n]
                keep[:, g0:g1].scatter_(1, drop, False)
            for c in range(g0, g1):
                j = c - b0
                q = wb[:, j] * keep[:, c]
                e = (wb[:, j] - q) / hinv[c, c]
                wb[:, j:] -= e[:, None] * hinv[c, c:b1][None, :]
                wb[:, j] = q
                err[:, j] = e
        w[:, b0:b1] = wb
        w[:, b1:] -= err @ hinv[b0:b1, b1:]
    return w, keep


def refit_layer(layer: WeightedLayer, h: torch.Tensor, n: int, m: int,
                damp: float = DAMP) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, mask) in ``layer``'s own layout: its weights pruned N:M and refit against
    its input moments ``h`` (from :func:`input_moments`)."""
    w = layer.weight.detach()
    out, c = w.shape[:2]
    taps = w[0, 0].numel()
    flat = w.reshape(out, c, taps).permute(0, 2, 1).reshape(out, taps * c)
    new, keep = obs_prune(flat, h, _groups(taps, c, m), n, damp)

    def back(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(out, taps, c).permute(0, 2, 1).reshape(w.shape)

    return back(new).to(w.dtype), back(keep)


def check_batches(batches: list[Batch]) -> None:
    """Float tensors, not empty, finite: a NaN would turn every layer's AdaRound error or
    SparseGPT moments into NaN without a word."""
    for i, b in enumerate(batches):
        for t in b:
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise QatError(f"batch {i} holds a {type(t).__name__}, not a float tensor; "
                               f"pass batches as tuples of input tensors, e.g. [(x,)]")
            if t.dim() == 0 or len(t) == 0:
                raise QatError(f"batch {i} is empty; pass at least one input in every batch")
            if not torch.isfinite(t).all():
                raise QatError(f"batch {i} holds NaN or infinite values; pass finite inputs")


def forward_order(module: nn.Module, batch: Batch, layers: dict[str, WeightedLayer]) -> list[str]:
    """The layers' names in the order the forward pass calls them."""
    order: list[str] = []
    hooks = [m.register_forward_pre_hook(lambda m, _a: order.append(m.name))
             for m in layers.values()]
    try:
        with torch.no_grad():
            module(*(t[:1] for t in batch))
    finally:
        for h in hooks:
            h.remove()
    return list(dict.fromkeys(order))


def refit_all(prepared: nn.Module, names: Sequence[str], n: int, m: int,
              batches: Sequence[Batch] | None, *,
              moments: Mapping[str, torch.Tensor] | None = None, sequential: bool = False,
              show_progress: bool = False) -> None:
    """Prune the named layers N:M with SparseGPT's masks and refit weights (the weights,
    masks and bias corrections set on the layers). Every layer's inputs come from the
    module as it is now, captured in one pass over ``batches`` (or ``moments`` given);
    with ``sequential``, each layer's come after the layers before it are pruned. On any
    failure every layer is put back as it was."""
    layers = weighted_layers(prepared)
    for name in names:   # checked before any layer changes
        if not torch.isfinite(layers[name].weight).all():
            raise QatError(f"layer {name}: weights are NaN or infinite; prune finite weights "
                           f"(prepare the FP32 model again)")
    if moments is not None:
        missing = [k for k in names if k not in moments]
        if missing:
            raise QatError(f"moments has no input moments for {missing[:4]}; capture them "
                           f"with sparse_refit.input_moments for every layer pruned")
        todo = list(names)
    else:   # forward order (a layer never run last, where its capture names it)
        wanted = set(names)
        try:
            ran = [k for k in forward_order(prepared, batches[0], layers) if k in wanted]
        except (RuntimeError, TypeError, ValueError) as e:
            raise QatError(f"the module does not run on the refit data ({type(e).__name__}: "
                           f"{e}); pass batches shaped as prepare's example inputs") from None
        todo = list(dict.fromkeys([*ran, *names]))
    saved = {k: (layers[k].weight.detach().clone(), layers[k].round_up, layers[k].bias_shift)
             for k in todo}
    was_training = prepared.training
    prepared.eval()
    try:
        if moments is None and not sequential:
            moments = input_moments(prepared, [layers[k] for k in todo], batches)
        for name in progress(todo, len(todo), "sparsegpt", show_progress):
            la = layers[name]
            h = moments[name] if moments is not None else \
                input_moments(prepared, [la], batches)[name]
            if not torch.isfinite(h).all():
                raise QatError(f"layer {name}: its inputs on the refit data hold NaN or "
                               f"infinite values (or overflow float64); pass finite inputs "
                               f"of a sane range")
            weight, mask = refit_layer(la, h, n, m)
            with torch.no_grad():
                la.weight.copy_(weight)
            la.set_mask(mask)
            la.rederive_bias_correction()
    except BaseException:   # nothing half pruned
        for k, (w, up, shift) in saved.items():
            with torch.no_grad():
                layers[k].weight.copy_(w)
            layers[k].mask, layers[k].round_up, layers[k].bias_shift = None, up, shift
        raise
    finally:
        prepared.train(was_training)
