"""SmoothQuant's scale migration, folded into a Llama decoder's FP32 weights.

The DSA quantizes every linear layer's input with one static int8 scale per tensor. A
decoder's linear inputs carry a few outlier channels (tens to hundreds of times the
median), which stretch that one grid until the ordinary channels keep a handful of
codes. SmoothQuant (Xiao et al., 2023) divides input channel ``j`` by
``s_j = max|X_j|^a / max|W[:, j]|^(1-a)`` and multiplies the weight's column ``j`` by
the same factor: the product is unchanged, the outliers move into the weights (which
have per-channel scales) and the input's channels even out.

Here the division is folded into whatever produces the input, so the exported step
graph has no extra op and the smoothed model computes the same function in FP32:

- Q/K/V read ``input_layernorm``'s output: one factor per channel for the three (the
  norm has one output), divided out of the norm's weight.
- gate/up read ``post_attention_layernorm``'s output: the same, into that norm.
- down_proj reads ``silu(gate) * up``: linear in up's output, so up_proj's output rows
  take the division.
- o_proj reads the attention output, whose channel ``(h, d)`` is a weighted sum of
  v_proj's channel ``(h // group, d)``: v_proj's output rows take the division, so the
  q heads sharing one KV head share one factor (the largest input maximum of the group).

The maxima come from FP32 forwards of calibration text at positions 1.. : position 0
(the sink token, with its massive activations) runs in FP32 on the host and never
meets an int8 grid. lm_head (tied to the embeddings in SmolLM2) and the final norm
are left alone: smoothing them would change the embeddings the host looks up.
"""

from __future__ import annotations

import copy
from typing import Any

#: no maximum below this before the power (a dead channel would divide by zero)
FLOOR = 1e-5
#: the folds, by the input they smooth: Q/K/V's and gate/up's (into the norms), down_proj's
#: (into up_proj's rows) and o_proj's (into v_proj's rows)
FOLDS = ("qkv", "gate_up", "down", "o")
#: the linear layers of a decoder layer whose inputs are recorded
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def check_alpha(alpha: Any) -> float:
    """``alpha`` as a float in [0, 1] (the migration strength), or a ValueError naming it."""
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"smooth (SmoothQuant's alpha) must be a number in [0, 1], got "
                         f"{alpha!r}") from None
    if isinstance(alpha, bool) or not 0.0 <= a <= 1.0:   # NaN fails the comparison too
        raise ValueError(f"smooth (SmoothQuant's alpha) must be in [0, 1], got {alpha!r}")
    return a


def check_folds(folds: Any) -> tuple[str, ...]:
    """``folds`` as a tuple of names from :data:`FOLDS` (a string is one name), or a
    ValueError naming the unknown ones."""
    folds = (folds,) if isinstance(folds, str) else tuple(folds)
    bad = [f for f in folds if f not in FOLDS]
    if bad:
        raise ValueError(f"unknown smoothing folds {bad}: choose from {FOLDS}")
    return folds


def check_group(group: Any) -> int:
    """``group`` (input channels sharing one factor) as an int >= 1, or a ValueError."""
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"group (input channels sharing a smoothing factor) must be an "
                         f"integer >= 1, got {group!r}")
    return group


def linear_inputs(hf, texts: list[list[int]], fold, purpose: str) -> dict[str, Any]:
    """Per linear layer of every decoder layer (``"{i}.self_attn.q_proj"``, ...), its
    input rows over ``texts``' positions 1.. (one FP32 forward per text; position 0 is the
    host's sink token) folded by ``fold(so_far, rows)`` (``so_far`` None at first; rows
    (tokens, channels), detached). ``purpose`` names the caller in the error for text
    too short."""
    import torch

    acc: dict[str, Any] = {}

    def hook(name: str):
        def record(_m, inputs, _out) -> None:
            x = inputs[0][:, 1:]          # not the sink token
            if x.numel():
                acc[name] = fold(acc.get(name), x.detach().reshape(-1, x.shape[-1]))
        return record

    handles = [layer.get_submodule(lin).register_forward_hook(hook(f"{i}.{lin}"))
               for i, layer in enumerate(hf.model.layers) for lin in LINEARS]
    try:
        with torch.no_grad():
            for ids in texts:
                if len(ids) > 1:
                    hf(torch.tensor([list(ids)]))
    finally:
        for h in handles:
            h.remove()
    if len(acc) != len(handles):
        raise ValueError(f"{purpose} needs calibration text of at least two tokens (position "
                         f"0 is the host's sink token and is not recorded)")
    return acc


def input_maxima(hf, texts: list[list[int]]) -> dict[str, Any]:
    """Per linear layer, the absolute maximum of each input channel over ``texts``'
    positions 1.. (:func:`linear_inputs`)."""
    import torch

    def fold(so_far, rows):
        m = rows.abs().amax(0).float()
        return m if so_far is None else torch.maximum(so_far, m)

    return linear_inputs(hf, texts, fold, "smoothing")


def _factor(amax, wmax, alpha: float, group: int = 1):
    """``s = amax^a / wmax^(1-a)``, both clamped at :data:`FLOOR`; with ``group`` > 1 both
    are first the maximum of their run of ``group`` channels (along the last axis), so one
    factor serves each run."""
    amax, wmax = _group_max(amax, group), _group_max(wmax, group)
    return amax.clamp(min=FLOOR) ** alpha / wmax.clamp(min=FLOOR) ** (1.0 - alpha)


def _group_max(v, group: int):
    """Each channel of ``v`` (along the last axis) replaced by the maximum of its run of
    ``group`` (a shorter last run included)."""
    import torch

    if group <= 1:
        return v
    n = v.shape[-1]
    padded = torch.nn.functional.pad(v, (0, -n % group))    # maxima are >= 0: zeros are neutral
    runs = padded.reshape(*v.shape[:-1], -1, group).amax(-1)
    return runs.repeat_interleave(group, -1)[..., :n]


def smooth_llama(hf, texts: list[list[int]], alpha: float = 0.5,
                 folds: tuple[str, ...] = FOLDS, group: int = 1):
    """A deep copy of the FP32 ``LlamaForCausalLM`` ``hf`` with SmoothQuant's factors
    (strength ``alpha``, from ``texts``' token ids) folded into its weights, for the
    inputs named in ``folds`` (:data:`FOLDS`); ``hf`` is unchanged. The copy's logits
    equal ``hf``'s up to float rounding.

    ``group`` > 1: one factor per run of ``group`` input channels. A weight stored per
    group of input rows (GGUF Q4_1's 32: ``d * q + min``) then stays on a grid of the same
    form, each group scaled as a whole, so per-group weight scales can still hold it
    exactly."""
    import torch

    alpha = check_alpha(alpha)
    folds = check_folds(folds)
    group = check_group(group)
    amax = input_maxima(hf, texts)
    out = copy.deepcopy(hf)   # deepcopy keeps lm_head tied to the embeddings
    c = out.config
    heads = c.num_attention_heads
    hd = getattr(c, "head_dim", None) or c.hidden_size // heads
    if "o" in folds and hd % group:
        raise ValueError(f"the o fold's groups of {group} channels would straddle heads of "
                         f"{hd}: choose a group that divides {hd}, or leave out the o fold")
    with torch.no_grad():
        for i, layer in enumerate(out.model.layers):
            a = {lin.rsplit(".", 1)[1]: amax[f"{i}.{lin}"] for lin in LINEARS}
            if "qkv" in folds:
                _fold_qkv(layer, a, alpha, group)
            if "gate_up" in folds:
                _fold_gate_up(layer, a, alpha, group)
            if "down" in folds:             # after gate/up: both scale up_proj
                _fold_down(layer, a, alpha, group)
            if "o" in folds:
                _fold_o(layer, a, alpha, c.num_key_value_heads,
                        heads // c.num_key_value_heads, hd, group)
    return out


def _fold_qkv(layer, amax: dict, alpha: float, group: int = 1) -> None:
    """Q/K/V: one factor per channel of the input norm's output, divided out of its weight."""
    import torch

    att = layer.self_attn
    qkv = (att.q_proj, att.k_proj, att.v_proj)
    a = torch.stack([amax[f"{n}_proj"] for n in "qkv"]).amax(0)
    w = torch.stack([p.weight.abs().amax(0) for p in qkv]).amax(0)
    s = _factor(a, w, alpha, group)
    layer.input_layernorm.weight.div_(s)
    for p in qkv:
        p.weight.mul_(s)


def _fold_gate_up(layer, amax: dict, alpha: float, group: int = 1) -> None:
    """gate/up: the same, into the post-attention norm."""
    import torch

    mlp = layer.mlp
    a = torch.maximum(amax["gate_proj"], amax["up_proj"])
    w = torch.maximum(mlp.gate_proj.weight.abs().amax(0), mlp.up_proj.weight.abs().amax(0))
    s = _factor(a, w, alpha, group)
    layer.post_attention_layernorm.weight.div_(s)
    mlp.gate_proj.weight.mul_(s)
    mlp.up_proj.weight.mul_(s)


def _fold_down(layer, amax: dict, alpha: float, group: int = 1) -> None:
    """down_proj reads ``silu(gate) * up``: up_proj's output rows take the division."""
    mlp = layer.mlp
    s = _factor(amax["down_proj"], mlp.down_proj.weight.abs().amax(0), alpha, group)
    _scale_rows(mlp.up_proj, 1.0 / s)
    mlp.down_proj.weight.mul_(s)


def _fold_o(layer, amax: dict, alpha: float, kv_heads: int, group: int, hd: int,
            channels: int = 1) -> None:
    """o_proj reads the heads' attention outputs: v_proj's output rows take the division,
    one factor per KV-head channel, shared by the ``group`` q heads reading it (and by
    runs of ``channels`` within a head)."""
    att = layer.self_attn
    a = amax["o_proj"].reshape(kv_heads, group, hd).amax(1)
    w = att.o_proj.weight.abs().amax(0).reshape(kv_heads, group, hd).amax(1)
    s = _factor(a, w, alpha, channels)                      # (kv_heads, hd)
    _scale_rows(att.v_proj, 1.0 / s.reshape(-1))
    att.o_proj.weight.mul_(s[:, None, :].expand(kv_heads, group, hd).reshape(-1))


def _scale_rows(linear, factor) -> None:
    """Multiply ``linear``'s output channels (weight rows, and the bias) by ``factor``."""
    linear.weight.mul_(factor[:, None])
    if linear.bias is not None:
        linear.bias.mul_(factor)
