"""Fine-tuning without labels: distillation from the FP32 model on the user's own inputs.

The prepared module (the DSA's integers forward, straight-through gradients back)
learns to reproduce the FP32 teacher's outputs on unlabeled inputs: no labels, no
dataset beyond what calibration already needs. A run is seeded (batch order, any
randomness in the module), shows a progress bar, checks a held-out set every
``eval_every`` steps, keeps the best weights and stops early when the held-out loss
stops improving. A non-finite loss stops the run with its step number and the last
good weights restored.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..quant.calibrate import progress
from .augment import Augment
from .errors import NonFiniteError, QatError
from .features import captured, feature_loss, fp32_copy

Batch = tuple[torch.Tensor, ...]
LOSSES = ("mse", "kl", "cosine")


@dataclass
class TrainResult:
    """What a run did: steps taken, why it stopped, the held-out losses along the way."""

    steps: int
    stopped: str                      # "steps" | "early stop" | "non-finite loss at step N"
    best_step: int
    best_heldout: float
    heldout: list[tuple[int, float]] = field(default_factory=list)   # (step, loss)
    train: list[tuple[int, float]] = field(default_factory=list)     # (step, loss)

    def summary(self) -> str:
        first = self.heldout[0][1] if self.heldout else float("nan")
        return (f"{self.steps} steps ({self.stopped}); held-out loss {first:.4g} -> "
                f"{self.best_heldout:.4g} (best at step {self.best_step})")


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, kind: str = "mse",
                 temperature: float = 1.0) -> torch.Tensor:
    """How far the student's outputs are from the teacher's: ``mse`` (normalized by the
    teacher's mean square, so 1.0 means "no better than zeros"), ``kl`` (softmax over the
    last axis at ``temperature``; for classifier logits), ``cosine`` (1 - cosine per row;
    for embeddings)."""
    if kind == "mse":
        return ((student - teacher) ** 2).mean() / teacher.pow(2).mean().clamp_min(1e-12)
    if kind == "kl":
        t = temperature
        return nn.functional.kl_div(torch.log_softmax(student / t, -1),
                                    torch.log_softmax(teacher / t, -1), log_target=True,
                                    reduction="batchmean") * t * t
    if kind == "cosine":
        s, r = student.flatten(1), teacher.flatten(1)
        return (1 - nn.functional.cosine_similarity(s, r, dim=1)).mean()
    raise QatError(f"loss {kind!r} is not one of {LOSSES}")


def _is_scale(name: str) -> bool:
    """A learned scale's gain (an activation grid's, or a layer's per-channel weight
    scales'): trained at ``scale_lr``."""
    return name.endswith(".gain") or name.endswith(".weight_gain")


def _batches(data: Sequence[Batch], size: int, gen: torch.Generator) -> Batch:
    """A random mini-batch of ``size`` examples drawn from the list of batches."""
    idx = torch.randint(len(data), (size,), generator=gen)
    rows = [tuple(t[int(torch.randint(t.shape[0], (1,), generator=gen))][None] for t in data[i])
            for i in idx]
    return tuple(torch.cat([r[k] for r in rows]) for k in range(len(rows[0])))


def _heldout_loss(student: nn.Module, targets: list[torch.Tensor], data: Sequence[Batch],
                  kind: str) -> float:
    with torch.no_grad():
        losses = [float(distill_loss(student(*b), t, kind)) for b, t in zip(data, targets)]
    return sum(losses) / len(losses)


def _step_loss(student: nn.Module, layer_teacher: nn.Module | None, x: Batch,
               target: torch.Tensor, kind: str, features: float) -> torch.Tensor:
    """The outputs' loss, plus ``features`` x the layers' (with a layer teacher)."""
    if layer_teacher is None:
        return distill_loss(student(*x), target, kind)
    with torch.no_grad(), captured(layer_teacher) as fp32:
        layer_teacher(*x)
    with captured(student) as ours:
        out = student(*x)
    return distill_loss(out, target, kind) + features * feature_loss(ours, fp32)


def distill(student: nn.Module, teacher: nn.Module, data: Sequence[Batch],
            heldout: Sequence[Batch] | None = None, *, steps: int = 200, batch_size: int = 8,
            lr: float = 1e-5, scale_lr: float = 1e-3, loss: str = "mse", eval_every: int = 20,
            patience: int = 3, seed: int = 0, show_progress: bool = True,
            features: float = 0.0, augment: Augment | None = None) -> TrainResult:
    """Fine-tune ``student`` (from :func:`prepare`) to match ``teacher`` on ``data``.

    ``data`` and ``heldout`` are lists of input batches (tuples of tensors, one per
    forward argument); without ``heldout`` the last fifth of ``data`` is held out.
    Weights train at ``lr`` (Adam), learned scales at ``scale_lr`` (a share of the scale
    per step). ``features`` > 0 adds every weighted layer's output, matched to the FP32
    network's (:mod:`.features`), to the training loss at that weight; the held-out loss
    stays the outputs' alone. ``augment`` (e.g. :func:`.augment.mixup`) transforms every
    training batch, seeded by the run, before the teacher labels it. Stops after ``steps``,
    or when ``patience`` held-out checks in a row bring no improvement, or at a
    non-finite loss; the weights of the best held-out check are restored in every case.
    """
    if loss not in LOSSES:
        raise QatError(f"loss {loss!r} is not one of {LOSSES}")
    if steps < 0 or batch_size < 1 or eval_every < 1 or not features >= 0:
        raise QatError(f"steps ({steps}) and features ({features}) must be >= 0, batch_size "
                       f"({batch_size}) and eval_every ({eval_every}) >= 1")
    data = [tuple(b) if isinstance(b, (tuple, list)) else (b,) for b in data]
    if heldout is None:
        if len(data) < 2:
            raise QatError("distillation needs at least 2 input batches (one is held out), or "
                           "pass heldout=")
        cut = max(1, len(data) // 5)
        data, heldout = data[:-cut], data[-cut:]
    heldout = [tuple(b) if isinstance(b, (tuple, list)) else (b,) for b in heldout]
    if not data or not heldout:
        raise QatError("no training or held-out batches; pass some input batches")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    teacher.eval()
    with torch.no_grad():
        targets = [teacher(*b) for b in heldout]
    weights = [p for n, p in student.named_parameters() if not _is_scale(n)]
    scales = [p for n, p in student.named_parameters() if _is_scale(n) and p.requires_grad]
    groups = [{"params": weights, "lr": lr}] + ([{"params": scales, "lr": scale_lr}]
                                                if scales else [])
    opt = torch.optim.Adam(groups)
    best = _heldout_loss(student, targets, heldout, loss)
    result = TrainResult(0, "steps", 0, best, heldout=[(0, best)])
    best_state = copy.deepcopy(student.state_dict())
    bad_checks = 0
    layer_teacher = fp32_copy(student) if features else None
    # eval mode throughout: an FP32 batch norm or dropout the prepared module kept must
    # compute what the deployed model computes; the integer layers have no train mode
    student.eval()
    bar = progress(range(1, steps + 1), steps, "qat", show_progress)
    for step in bar:
        x = _batches(data, batch_size, gen)
        if augment is not None:
            x = augment(x, gen)
        with torch.no_grad():
            target = teacher(*x)
        try:
            value = _step_loss(student, layer_teacher, x, target, loss, features)
        except NonFiniteError as e:
            result.stopped = f"non-finite values at step {step}: {e}"
            break
        if not math.isfinite(float(value.detach())):
            result.stopped = f"non-finite loss at step {step}"
            break
        opt.zero_grad()
        value.backward()
        opt.step()
        result.steps = step
        result.train.append((step, float(value.detach())))
        if step % eval_every and step != steps:
            continue
        try:
            h = _heldout_loss(student, targets, heldout, loss)
        except NonFiniteError as e:
            result.stopped = f"non-finite values at step {step}: {e}"
            break
        result.heldout.append((step, h))
        if not math.isfinite(h):
            result.stopped = f"non-finite held-out loss at step {step}"
            break
        if h < best:
            best, bad_checks = h, 0
            result.best_step, result.best_heldout = step, h
            best_state = copy.deepcopy(student.state_dict())
        else:
            bad_checks += 1
            if bad_checks >= patience:
                result.stopped = "early stop"
                break
    student.load_state_dict(best_state)
    student.eval()
    return result
