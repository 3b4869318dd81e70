"""Fixtures every test folder shares: the bundled hardware presets and a hang guard.

The device tests' reference machine and run helpers are modules of their own
(``tests/device/reference_machine.py``, ``tests/device/harness.py``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from hypothesis import settings

from dsa_tvm.hw.config import load_config, preset_names

from .device.harness import PRESETS

# CI runs the same examples every time (a failure there is reproducible, never luck);
# locally each run explores new ones.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


#: workers at most: each holds TVM, torch and a model or two (a few GB between them)
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config) -> int | None:
    """``-n auto`` (pyproject's addopts): the cores this process may run on, as the
    scheduler and a cgroup CPU quota allow (xdist's own count is the host's physical
    cores, which a container does not have), at most :data:`MAX_WORKERS`. xdist's
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores or 1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(1, min(cores or 1, MAX_WORKERS))


def _check_presets() -> None:
    # the suite is written for these three bundled presets
    assert set(PRESETS) <= set(preset_names())


_check_presets()


@pytest.fixture(scope="session")
def default_cfg():
    return load_config("default")


@pytest.fixture(scope="session")
def edge_cfg():
    return load_config("edge")


@pytest.fixture(scope="session", params=PRESETS)
def any_cfg(request):
    return load_config(request.param)


@pytest.fixture
def no_hang():
    """Fail (instead of hanging the suite) if the body takes more than 20 s."""

    def _alarm(signum, frame):
        raise TimeoutError("the simulator did not return within 20 s (hang?)")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
