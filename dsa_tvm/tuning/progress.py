"""A progress bar over one task's measured candidates, fed by MetaSchedule.

:class:`TrialProgress` is a measure callback: after each batch MetaSchedule
measures, it advances the bar by the batch and shows the fastest cycles so far
and how many candidates failed to build or run (with the first error, so a
broken space is visible at once rather than as a silent "0 GFLOPS").
"""

from __future__ import annotations

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback


@derived_object
class TrialProgress(PyMeasureCallback):
    """Advance a tqdm bar per measured batch (see the module docstring)."""

    def __init__(self, name: str, total: int, mhz: float, best_cycles: int,
                 enabled: bool | None = None):
        super().__init__()
        from tqdm import tqdm

        self.mhz, self.best, self.failed, self.first_error = mhz, best_cycles, 0, None
        # enabled=None: a bar on a terminal, nothing in a log file
        self.bar = tqdm(total=total, desc=name[:40], unit="trial", leave=False,
                        disable=None if enabled is None else not enabled)
        self._show()

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        for b, r in zip(builder_results, runner_results):
            err = b.error_msg or r.error_msg
            if err:
                self.failed += 1
                self.first_error = self.first_error or str(err).splitlines()[0][:80]
            elif r.run_secs:
                self.best = min(self.best, int(round(float(r.run_secs[0]) * self.mhz * 1e6)))
        self.bar.update(len(measure_candidates))
        self._show()

    def _show(self) -> None:
        post = {"best cycles": f"{self.best:,}"}
        if self.failed:
            post["failed"] = f"{self.failed} ({self.first_error})"
        self.bar.set_postfix(post, refresh=True)

    def close(self) -> None:
        self.bar.close()
