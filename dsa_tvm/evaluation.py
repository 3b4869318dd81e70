"""Accuracy at dataset scale: a model compiled for the DSA, run on the simulator over a
dataset, against a reference model on the same inputs (``dsa_tvm.evaluate``,
``dsa-tvm eval``).

The DSA side compiles once per worker process and runs every input through TVM's VM
(the simulator reuses each program's timing after its first run: it does not depend on
the data). The reference is the FP32 model when one is given, else the same QDQ graph in
onnxruntime (graph optimizations off). Reported: output cosine per input (the worst
inputs listed), top-1 / top-5 agreement with the reference and accuracy against labels
when the output is a row of class scores; for an embedder (a sentence encoder such as
MiniLM) what retrieval sees instead: whether each input's nearest neighbour in the set is
the reference's, and how far the pairwise similarities moved; the wall time per input.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .hw.config import HardwareConfig, load_config

#: inputs a worker runs at once by default: on ResNet-18 @224, 97 ms an image at 8 (189
#: ms one at a time); more threads cost more than their batch saves (177 ms at 32)
DEFAULT_BATCH = 8


@dataclass
class EvalReport:
    model: str
    reference: str
    hardware: str
    inputs: int
    cosine_mean: float
    cosine_min: float
    top1_agreement: float | None = None
    top5_agreement: float | None = None
    top1_accuracy: float | None = None          # the DSA model against the labels
    reference_top1_accuracy: float | None = None
    worst: list[dict[str, Any]] = field(default_factory=list)  # lowest cosine first
    seconds_per_input: float = 0.0             # wall time over the inputs, compiling included
    workers: int = 1
    task: str = "classify"                      # classify | embed | other (what was scored)
    batch: int = 1                              # inputs per batched simulation, per worker
    neighbour_agreement: float | None = None    # embed: nearest other input, DSA vs reference
    similarity_error: float | None = None       # embed: mean |cos_dsa - cos_ref| over pairs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        lines = [f"evaluation of {self.model} on '{self.hardware}' against {self.reference}: "
                 f"{self.inputs} input(s), {self.seconds_per_input * 1e3:,.0f} ms of wall time "
                 f"each, compiling included ({self.workers} worker process(es), batch "
                 f"{self.batch})",
                 f"  output cosine: mean {self.cosine_mean:.6f}, worst {self.cosine_min:.6f}"]
        if self.top1_agreement is not None:
            lines.append(f"  top-1 agreement {self.top1_agreement:.2%}, top-5 agreement "
                         f"{self.top5_agreement:.2%}")
        if self.neighbour_agreement is not None:
            lines.append(f"  embeddings: nearest-neighbour agreement "
                         f"{self.neighbour_agreement:.2%}, pairwise cosine moved by "
                         f"{self.similarity_error:.5f} on average")
        if self.top1_accuracy is not None:
            lines.append(f"  top-1 accuracy against the labels: DSA {self.top1_accuracy:.2%}, "
                         f"reference {self.reference_top1_accuracy:.2%}")
        lines.append("  worst inputs: " + ", ".join(
            f"#{w['index']} (cosine {w['cosine']:.4f})" for w in self.worst))
        return "\n".join(lines)


def evaluate(model: str | Path, data: Any, reference: str | Path | None = None,
             hw: "str | Path | HardwareConfig | None" = None, labels: Any = None,
             limit: int | None = None, workers: int | None = None,
             preprocess: str = "imagenet", show_progress: bool = True,
             worst: int = 5, ray_address: str | None = None, task: str = "auto",
             batch: int = DEFAULT_BATCH) -> EvalReport:
    """Run the QDQ ``model`` compiled for ``hw`` over ``data`` (an image folder, ``.npz``
    or ``.npy`` file, arrays or feeds, as :func:`dsa_tvm.quantize` takes) and compare it
    with ``reference`` (an FP32 ONNX model; default: the QDQ graph in onnxruntime).
    ``labels``: class indices, one per input (a sequence or a ``.npy``/``.txt`` file).
    ``workers`` processes share the inputs (default: one per core, at most one per input);
    with ``ray_address`` they are that many Ray actors on the cluster (each compiles once).
    ``batch``: inputs each worker runs at once, its launches joined into one batched
    simulation per program (``dsa_tvm.launch_batch``; the same outputs bit for bit).
    ``task``: ``classify`` (top-1/top-5 of class scores), ``embed`` (retrieval metrics of
    one embedding per input), ``other`` (cosine only), or ``auto``: ``embed`` when the output
    is named like an embedding or every reference row has unit length, ``classify`` when it
    is one row of scores, else ``other``."""
    from .flow import load_model
    from .models.quantize import run_onnxruntime
    from .quant.api import input_dtypes, input_shapes
    from .quant.data import as_feeds

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a whole number >= 1 (or None for every input), got "
                         f"{limit!r}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    cfg = load_config(hw)
    qdq, name = load_model(model)
    if reference is not None:
        ref_model, ref_name = load_model(reference)
    else:
        ref_model, ref_name = qdq, "the QDQ graph in onnxruntime"
    feeds = as_feeds(data, input_shapes(qdq), preprocess, limit, input_dtypes(qdq),
                     what="evaluation data", keep_order=True)
    want = _labels(labels, len(feeds))
    workers = _workers(workers, len(feeds))
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a whole number >= 1, got {batch!r}")
    t0 = time.perf_counter()
    got = _run_dsa(qdq, cfg, feeds, workers, show_progress, ray_address, batch)
    secs = (time.perf_counter() - t0) / len(feeds)
    ref = [run_onnxruntime(ref_model, f, optimize=False)[0] for f in feeds]
    task = _task(task, qdq.graph.output[0].name, ref)
    return _report(name, ref_name if reference is None else str(reference), cfg, got, ref,
                   want, secs, workers, worst, task, batch)


#: what ``evaluate`` scores: class scores, embeddings, or the output cosine alone
TASKS = ("auto", "classify", "embed", "other")


def _task(task: str, output: str, ref: Sequence[np.ndarray]) -> str:
    """``task``, or the one the output looks like (``evaluate`` says how)."""
    if task != "auto":
        return task
    rows = [np.asarray(r, np.float64).reshape(-1) for r in ref]
    if all(_class_scores(r) is not None for r in ref) and (
            "emb" in output.lower() or all(abs(np.linalg.norm(r) - 1) < 1e-3 for r in rows)):
        return "embed"
    return "classify" if all(_class_scores(r) is not None for r in ref) else "other"


def _neighbours(got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> tuple[float, float]:
    """(share of inputs whose most similar other input is the same under both, mean
    absolute change of the pairwise cosine similarities)."""
    def sims(vs):
        m = np.stack([np.asarray(v, np.float64).reshape(-1) for v in vs])
        m = m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-30)
        s = m @ m.T
        np.fill_diagonal(s, -np.inf)
        return s
    sg, sr = sims(got), sims(ref)
    agree = float((sg.argmax(1) == sr.argmax(1)).mean())
    upper = np.triu_indices(len(got), 1)
    return agree, float(np.abs(sg[upper] - sr[upper]).mean())


def _labels(labels: Any, n: int) -> np.ndarray | None:
    if labels is None:
        return None
    if isinstance(labels, (str, Path)):
        p = Path(labels)
        if not p.exists():
            raise FileNotFoundError(f"labels '{p}' do not exist")
        labels = np.load(p) if p.suffix == ".npy" else np.loadtxt(p, dtype=np.int64, ndmin=1)
    arr = np.asarray(labels)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"labels must be one class index per input, got {arr.dtype}"
                         f"{list(arr.shape)}")
    if len(arr) < n:
        raise ValueError(f"{len(arr)} labels for {n} inputs: give one per input")
    return arr[:n]


def _workers(workers: int | None, n: int) -> int:
    if workers is None:
        workers = os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a whole number >= 1, got {workers!r}")
    return max(1, min(workers, n))


def _run_dsa(qdq, cfg: HardwareConfig, feeds: list[dict], workers: int,
             show_progress: bool, ray_address: str | None = None,
             batch: int = 1) -> list[np.ndarray]:
    """The model's first output for every feed: in this process, or split over
    ``workers`` fresh processes (or Ray actors) that each compile the model once."""
    from tqdm import tqdm

    bar = tqdm(total=len(feeds), desc="DSA", unit="input", disable=not show_progress)
    if ray_address is not None:
        out = _run_on_ray(ray_address, qdq, cfg, feeds, workers, bar.update, batch)
        bar.close()
        return out
    if workers == 1:
        run = _Runner(qdq.SerializeToString(), json.dumps(cfg.as_dict()))
        out = run.run_many(feeds, batch, bar.update)
        bar.close()
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    out: list[np.ndarray | None] = [None] * len(feeds)
    chunks = _chunks(len(feeds), workers, batch)   # each worker compiles once (initializer)
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_start_worker,
                             initargs=(qdq.SerializeToString(), json.dumps(cfg.as_dict()))) as pool:
        jobs = {pool.submit(_run_chunk, [feeds[i] for i in chunk], batch): chunk
                for chunk in chunks}
        for job in as_completed(jobs):
            for i, y in zip(jobs[job], job.result()):
                out[i] = y
            bar.update(len(jobs[job]))
    bar.close()
    return [y for y in out if y is not None]


def _chunks(n: int, workers: int, batch: int) -> list[list[int]]:
    """Input indices in chunks for the workers: small, so the bar moves as inputs finish,
    but at least one batch each."""
    size = max(batch, min(8, n // (4 * workers)))
    return [list(range(k, min(k + size, n))) for k in range(0, n, size)]


class _Runner:
    """The model compiled for the DSA once, run one feed at a time through the VM."""

    def __init__(self, model_bytes: bytes, hw_json: str):
        import onnx
        import tvm
        from tvm import relax
        from tvm.relax.frontend.onnx import from_onnx

        from .hw.config import config_from_dict
        from .target import target

        cfg = config_from_dict(json.loads(hw_json))
        mod = from_onnx(onnx.load_from_string(model_bytes), keep_params_in_input=False)
        self.ex = tvm.compile(mod, target=target(cfg))
        self.vm = relax.VirtualMachine(self.ex, tvm.cpu())
        self.tvm, self.relax = tvm, relax

    def __call__(self, feed: dict, vm=None) -> np.ndarray:
        out = (vm or self.vm)["main"](*[self.tvm.runtime.tensor(v) for v in feed.values()])
        return (out.numpy() if hasattr(out, "numpy") else out[0].numpy()).copy()

    def run_many(self, feeds: list[dict], batch: int = 1, advance=None) -> list[np.ndarray]:
        """A chunk of feeds (a Ray actor's method: one call per chunk), ``batch`` at a time:
        that many threads, each with its own VM, their launches batched together."""
        from .sim.simulator import one_blas_thread

        with one_blas_thread():
            if batch == 1 or len(feeds) == 1:
                out = []
                for f in feeds:
                    out.append(self(f))
                    if advance is not None:
                        advance(1)
                return out
            from .launch_batch import run_joined

            return run_joined(lambda: self.relax.VirtualMachine(self.ex, self.tvm.cpu()),
                              lambda vm, f: self(f, vm), feeds, batch, advance)



_WORKER: "_Runner | None" = None


def _run_on_ray(address: str, qdq, cfg: HardwareConfig, feeds: list[dict], workers: int,
                advance, batch: int = 1) -> list[np.ndarray]:
    """``workers`` Ray actors, each holding the compiled model, share the feeds in chunks."""
    from .sweep.ray_runner import ray_session

    with ray_session(address) as ray:
        actor = ray.remote(_Runner)
        runners = [actor.remote(qdq.SerializeToString(), json.dumps(cfg.as_dict()))
                   for _ in range(workers)]
        out: list[np.ndarray | None] = [None] * len(feeds)
        pending = {runners[n % workers].run_many.remote([feeds[i] for i in c], batch): c
                   for n, c in enumerate(_chunks(len(feeds), workers, batch))}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                chunk = pending.pop(ref)
                for i, y in zip(chunk, ray.get(ref)):
                    out[i] = y
                advance(len(chunk))
    return [y for y in out if y is not None]


def _start_worker(model_bytes: bytes, hw_json: str) -> None:
    """Compile the model once in a worker process; Ctrl-C is the parent's to handle."""
    import signal

    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER = _Runner(model_bytes, hw_json)


def _run_chunk(feeds: list[dict], batch: int = 1) -> list[np.ndarray]:
    assert _WORKER is not None
    return _WORKER.run_many(feeds, batch)


def _report(name: str, ref_name: str, cfg: HardwareConfig, got: Sequence[np.ndarray],
            ref: Sequence[np.ndarray], labels: np.ndarray | None, secs: float, workers: int,
            worst: int, task: str = "classify", batch: int = 1) -> EvalReport:
    from .quant.metrics import cosine

    cos = np.array([cosine(g.astype(np.float64), r.astype(np.float64))
                    for g, r in zip(got, ref)])
    order = np.argsort(cos, kind="stable")[:worst]
    rep = EvalReport(name, ref_name, cfg.name, len(got), float(cos.mean()), float(cos.min()),
                     worst=[{"index": int(i), "cosine": float(cos[i])} for i in order],
                     seconds_per_input=secs, workers=workers, task=task, batch=batch)
    if task == "embed":
        if labels is not None:
            raise ValueError("labels were given but the model is scored as an embedder "
                             "(task embed): give --task classify if its output is class scores")
        if len(got) >= 2:
            rep.neighbour_agreement, rep.similarity_error = _neighbours(got, ref)
        return _finite(rep)
    scores = [_class_scores(g) for g in got]
    if task == "classify" and all(s is not None for s in scores):
        ref_scores = [_class_scores(r) for r in ref]
        g1 = np.array([int(np.argmax(s)) for s in scores])
        r1 = np.array([int(np.argmax(r)) for r in ref_scores])
        rep.top1_agreement = float((g1 == r1).mean())
        # the reference's top class among the DSA's five best
        rep.top5_agreement = float(np.mean([int(r) in set(np.argsort(-s)[:5])
                                            for s, r in zip(scores, r1)]))
        if labels is not None:
            rep.top1_accuracy = float((g1 == labels).mean())
            rep.reference_top1_accuracy = float((r1 == labels).mean())
    elif labels is not None:
        raise ValueError("labels were given but the model's output is not one row of class "
                         "scores per input")
    return _finite(rep)


def _finite(rep: EvalReport) -> EvalReport:
    if not math.isfinite(rep.cosine_mean):
        raise ValueError("the outputs hold NaN or Inf: no cosine to report")
    return rep


def _class_scores(y: np.ndarray) -> np.ndarray | None:
    """The class-score row of a one-input output ((1, C) or (C,)), else None."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[0] == 1 and y.shape[1] > 1:
        return y[0]
    if y.ndim == 1 and y.shape[0] > 1:
        return y
    return None
