"""Run a sweep: every (model, design point) through :func:`evaluate_point`, on the cores.

Points go to a local process pool (spawned workers; each imports the models once) or,
with ``ray_address``, to a Ray cluster as remote tasks. Jobs are ordered so points that
share what the code generator sees (everything but timing-only fields) run one after
another in the same worker: its program cache (``lowering.program_cache``) then turns
their compiles into re-timings.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from ..hw.config import ConfigError, HardwareConfig
from ..lowering.program_cache import lowering_view, program_cache
from .evaluate import PointResult, evaluate_point
from .space import Axis, Point, config_of


@dataclass(frozen=True)
class Job:
    model: str          # as the user named it (bundled name or file)
    point: Point


def load_sweep_model(spec: str):
    """``(display name, int8 QDQ Relax module)`` of a bundled model name or a QDQ ONNX file."""
    from tvm.relax.frontend.onnx import from_onnx

    from ..frontend.onnx_graph import is_qdq
    from ..models.zoo import model_or_file

    if str(spec).endswith(".pt2"):
        raise ValueError(f"'{spec}' is a PyTorch program and sweeps take a QDQ ONNX file or a "
                         f"bundled model; export the model to ONNX (torch.onnx.export), quantize "
                         f"it (dsa-tvm quantize model.onnx --calib DATA) and sweep the int8 file")
    onnx_model, name = model_or_file(spec)
    if not is_qdq(onnx_model):
        raise ValueError(f"'{spec}' is an FP32 model: nothing of it would run on the DSA at any "
                         f"design point; quantize it first (dsa-tvm quantize {spec} --data ...)")
    return name, from_onnx(onnx_model, keep_params_in_input=False)


_MODELS: dict[str, tuple[str, object]] = {}


def model_module(spec: str):
    """The model ``spec`` names, imported once per process."""
    if spec not in _MODELS:
        _MODELS[spec] = load_sweep_model(spec)
    return _MODELS[spec]


def run_job(job: Job, base: HardwareConfig, axes: list[Axis], cache: bool = True) -> PointResult:
    """One job; a design the schema rejects or a compile that fails becomes its ``error``."""
    name, mod = model_module(job.model)
    values = dict(job.point.values)
    try:
        cfg, note = config_of(base, axes, job.point)
    except ConfigError as e:
        return PointResult(name, job.point.label, values, error=f"invalid design: {e}")
    with program_cache(cache):
        try:
            res = evaluate_point(mod, name, cfg, job.point.label, values)
            res.note = note
            return res
        except Exception as e:  # noqa: BLE001 - one bad point must not end a 27-point sweep
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            return PointResult(name, job.point.label, values, cfg.name,
                               error=f"{type(e).__name__}: {first}")


def _run_chunk(jobs: list[Job], base_dict: dict, axes: list[Axis], cache: bool
               ) -> list[PointResult]:
    from ..hw.config import config_from_dict
    from ..sim.simulator import one_blas_thread

    base = config_from_dict(base_dict)
    with one_blas_thread():
        return [run_job(j, base, axes, cache) for j in jobs]


def run_chunk_remote(jobs: list[Job], base_dict: dict, axes: list[Axis], cache: bool
                     ) -> list[PointResult]:
    """A chunk on a Ray worker (no pool initializer there: models load on first use)."""
    return _run_chunk(jobs, base_dict, axes, cache)


def _init_worker(models: list[str]) -> None:
    """Import the models once per worker; Ctrl-C is the parent's to handle."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for m in models:
        model_module(m)


def _group(job: Job | Point, base: HardwareConfig, axes: list[Axis]) -> str:
    """What a job shares programs by: its model and the description as code generation sees it."""
    point = job.point if isinstance(job, Job) else job
    try:
        view = repr(lowering_view(config_of(base, axes, point)[0]))
    except ConfigError:
        view = ""
    return f"{job.model if isinstance(job, Job) else ''}|{view}"


def ordered_jobs(models: Sequence[str], points: Sequence[Point], base: HardwareConfig,
                 axes: list[Axis]) -> list[Job]:
    """Jobs grouped by model, then by what the code generator sees of the design."""
    keyed = sorted(points, key=lambda p: _group(p, base, axes))
    return [Job(m, p) for m in models for p in keyed]


def run_jobs(jobs: list[Job], base: HardwareConfig, axes: list[Axis], workers: int = 1,
             cache: bool = True, ray_address: str | None = None, progress: bool = True,
             on_result: Callable[[PointResult], None] | None = None) -> list[PointResult]:
    """Results in job order; ``workers`` processes (1: in this process)."""
    from tqdm import tqdm

    bar = tqdm(total=len(jobs), desc="sweep", unit="point", disable=not progress,
               file=sys.stderr)
    out: list[PointResult | None] = [None] * len(jobs)

    def done(index: int, res: PointResult) -> None:
        out[index] = res
        bar.update(1)
        if on_result is not None:
            on_result(res)

    chunks = _chunks([_group(j, base, axes) for j in jobs], workers)
    if ray_address is not None:
        from .ray_runner import run_on_ray

        run_on_ray(ray_address, run_chunk_remote, jobs, chunks, base, axes, cache, done)
    elif workers <= 1:
        for i, job in enumerate(jobs):
            done(i, run_job(job, base, axes, cache))
    else:
        _run_pool(jobs, chunks, base, axes, workers, cache, done)
    bar.close()
    return [r for r in out if r is not None]


def _chunks(groups: list[str], workers: int) -> list[range]:
    """Contiguous runs of jobs, about four per worker (balance), cut where the group (model and what
    the code generator sees) changes when a cut is due, so one worker compiles a group's
    programs once."""
    n = len(groups)
    size = max(1, math.ceil(n / max(1, 4 * workers)))
    out, start = [], 0
    for k in range(1, n + 1):
        if k == n or (k - start >= size and groups[k] != groups[k - 1]) or k - start >= 2 * size:
            out.append(range(start, k))
            start = k
    return out


@contextmanager
def _chunk_pool(models: Sequence[str], workers: int) -> Iterator[Callable]:
    """A pool of spawned workers that have imported ``models``; yields ``submit(jobs, base,
    axes, cache)`` -> a future of the jobs' results."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(min(workers, os.cpu_count() or 1), mp_context=get_context("spawn"),
                             initializer=_init_worker, initargs=(list(models),)) as pool:
        yield lambda jobs, base, axes, cache: pool.submit(_run_chunk, jobs, base.as_dict(),
                                                          axes, cache)


def _run_pool(jobs, chunks, base, axes, workers, cache, done) -> None:
    from concurrent.futures import as_completed

    models = list(dict.fromkeys(j.model for j in jobs))
    with _chunk_pool(models, min(workers, len(chunks))) as submit:
        futures = {submit([jobs[i] for i in c], base, axes, cache): c for c in chunks}
        for fut in as_completed(futures):
            for i, res in zip(futures[fut], fut.result()):
                done(i, res)
