"""Sweep points on a Ray cluster: each chunk of jobs is one remote task.

Ray is an optional extra (``pip install 'dsa-tvm[ray]'``). ``address`` is what
``ray.init`` takes: ``"auto"`` for a cluster started with ``ray start --head`` on this
machine, ``"host:port"`` for another, ``"local"`` to start a private one. Workers import
the project from their own environment (the cluster's machines need dsa-tvm installed);
results come back as the same :class:`PointResult` objects a local pool gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..hw.config import HardwareConfig
from .evaluate import PointResult
from .space import Axis


def _ray():
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs Ray, which is not installed; pip install 'dsa-tvm[ray]' "
                         "(or drop --ray to use the local process pool)") from None
    return ray


@contextmanager
def ray_session(address: str) -> Iterator[object]:
    """The ``ray`` module connected to the cluster at ``address`` for the block (a
    connection this process already has is used and left open)."""
    ray = _ray()
    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=None if address == "local" else address, log_to_driver=False,
                     include_dashboard=False, ignore_reinit_error=True)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ValueError(f"--ray {address}: cannot reach a Ray cluster ({e}); start one "
                             f"with 'ray start --head' or give its host:port") from None
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


def run_on_ray(address: str, run_chunk: Callable[..., list[PointResult]], jobs: list,
               chunks: list[range], base: HardwareConfig, axes: list[Axis], cache: bool,
               done: Callable[[int, PointResult], None]) -> None:
    """Run ``chunks`` of ``jobs`` as Ray tasks (``run_chunk(jobs, base_dict, axes, cache)``)
    on the cluster at ``address``; ``done(index, result)`` for each job as its chunk ends."""
    with ray_session(address) as ray:
        task = ray.remote(run_chunk)
        base_dict = base.as_dict()
        pending = {task.remote([jobs[i] for i in c], base_dict, axes, cache): c for c in chunks}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                for i, res in zip(pending.pop(ref), ray.get(ref)):
                    done(i, res)
