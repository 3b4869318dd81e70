"""Calibration: run the FP32 model on the calibration feeds and feed every planned
tensor to its observer.

onnxruntime is only the FP32 execution engine here (it computes the intermediates,
~100x faster than an untuned LLVM build of the same graph); what is observed and how
ranges become scales is ours (``observers.py``, ``qparams.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..frontend.onnx_graph import Graph
from ..isa.intnorm import EXP_ZERO_SPAN
from ..ort_session import session
from .observers import ChannelMeanObserver, Observer, SoftmaxInputObserver, make_observer

Feed = dict[str, np.ndarray]


def with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also returns the tensors ``names`` (float32)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output} | {i.name for i in m.graph.input}
    for n in names:
        if n not in have:
            m.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
            have.add(n)
    return m


def progress(iterable, total: int, desc: str, enabled: bool = True):
    """tqdm when it is installed and ``enabled`` (stderr), else the iterable itself."""
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, leave=False)


def run_with_intermediates(model: onnx.ModelProto, feeds: Sequence[Feed], names: Sequence[str],
                           optimize: bool = True, desc: str = "run", show_progress: bool = False):
    """Yield ``{name: value}`` of ``names`` (and the graph outputs) for every feed."""
    g = Graph(model)
    wanted = [n for n in names if n not in g.inputs]
    m = with_outputs(model, wanted)
    sess = session(m, optimize)
    out_names = [o.name for o in sess.get_outputs()]
    for feed in progress(feeds, len(feeds), desc, show_progress):
        vals = dict(zip(out_names, sess.run(None, feed)))
        for n in names:
            if n in feed:
                vals[n] = feed[n]
        yield vals


def check_finite(v: np.ndarray, tensor: str, batch: int) -> None:
    """A NaN or Inf would poison every range and bias it reaches: stop, naming where."""
    if not np.isfinite(v).all():
        kind = "NaN" if np.isnan(v).any() else "Inf"
        raise ValueError(f"calibration: tensor '{tensor}' is {kind} on batch {batch} although the "
                         "inputs are finite: the FP32 model overflows float32 on this data (values "
                         "far too large? check the preprocessing) or computes NaN (log/sqrt of "
                         "negatives)")


def calibrate(model: onnx.ModelProto, feeds: Sequence[Feed], tensors: Sequence[str],
              method: str = "minmax", show_progress: bool = True,
              channel_means: dict[str, int] | None = None,
              softmax_inputs: frozenset[str] = frozenset(), **observer_options
              ) -> tuple[dict[str, Observer], dict[str, ChannelMeanObserver]]:
    """One range observer per tensor in ``tensors`` and one per-channel observer per
    ``channel_means`` entry (tensor -> channel axis), updated with every calibration feed.
    ``softmax_inputs``: tensors an integer softmax reads; their ranges stop where the
    [norm] unit's exponential is 0 (:class:`~.observers.SoftmaxInputObserver`)."""
    observers = {t: make_observer(method, **observer_options) for t in tensors}
    for t in softmax_inputs.intersection(observers):
        observers[t] = SoftmaxInputObserver(observers[t], EXP_ZERO_SPAN)
    means = {t: ChannelMeanObserver(ax) for t, ax in (channel_means or {}).items()}
    names = list(dict.fromkeys(list(tensors) + list(means)))
    for i, vals in enumerate(run_with_intermediates(model, feeds, names,
                                                    desc=f"calibrating ({method})",
                                                    show_progress=show_progress)):
        for t in names:
            v = vals.get(t)
            if v is None:
                raise KeyError(f"tensor '{t}' was not computed during calibration")
            v = np.asarray(v, np.float32)
            # a softmax input may hold -inf: an attention mask's, which the observer leaves out
            masks = t in softmax_inputs
            check_finite(np.nan_to_num(v, nan=np.nan, posinf=np.inf, neginf=0.0) if masks else v,
                         t, i)
            if t in observers:
                observers[t].update(v)
            if t in means:
                means[t].update(v)
    return observers, means
