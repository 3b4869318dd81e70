"""``dsa_tvm.tune(mod, work_dir=..., trials=..., hw=...)``: tune every DSA task of a model.

Tasks are the distinct layer shapes the DSA would run (zero points and clip
bounds aside), found the way the compiler finds them: partition for the
hardware, lower each region to integer layers, fold few-channel input convs
into their im2col channels where the compiler would, take each layer's recipe. Each
task is tuned in turn (:func:`.tuner.tune_task`) into one JSON database in
``work_dir``; compile with it afterwards with ``with dsa_tvm.tuned(work_dir):``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..hw.config import HardwareConfig, load_config
from .apply import open_database
from .task import Task
from .tuner import TaskResult, check_budget, tune_task


@dataclass
class TuneReport:
    """Per-task results of a tuning run; ``str()`` is the final table."""

    hardware: str
    work_dir: str
    results: list[TaskResult] = field(default_factory=list)
    layers: dict[str, list[str]] = field(default_factory=dict)   # task name -> layer names
    seconds: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)  # layer/op -> why it has no task

    def __str__(self) -> str:
        head = (f"{'task':<58} {'layers':>6} {'default cyc':>12} {'tuned cyc':>12} "
                f"{'speedup':>7} {'trials':>6} {'time s':>7}")
        lines = [f"DSA tuning for '{self.hardware}' -> {self.work_dir}", head, "-" * len(head)]
        for r in self.results:
            lines.append(f"{r.task.name[:58]:<58} {len(self.layers.get(r.task.name, [])):>6} "
                         f"{r.default_cycles:>12,} {r.best_cycles:>12,} {r.speedup:>7.3f} "
                         f"{r.trials:>6} {r.seconds:>7.1f}")
        d = sum(r.default_cycles * len(self.layers.get(r.task.name, [1])) for r in self.results)
        t = sum(r.best_cycles * len(self.layers.get(r.task.name, [1])) for r in self.results)
        if t:
            lines.append(f"all layers (each task x its layers): {d:,} -> {t:,} cycles, "
                         f"speedup {d / t:.3f}, {self.seconds:.1f} s")
        return "\n".join(lines)


def extract_tasks(mod, hw: "str | Path | HardwareConfig | None" = None,
                  skipped: dict[str, str] | None = None
                  ) -> tuple[list[Task], dict[str, list[str]]]:
    """The distinct DSA tasks of a Relax module and which layers each one covers.

    ``skipped`` (when given) collects what has no task and why: layers whose DSA pattern
    was refused (a symbolic or zero-size shape, a constraint), regions that do not
    lower, layers without a recipe."""
    from relay_passes import partition_for_dsa, region_from_function
    from relay_passes.partition import region_functions
    from tir_schedules.kinds import UnsupportedLayer, recipe
    from tir_schedules.kinds.space import perf_shape

    from ..lowering.fold_input import fold_region_inputs

    skipped = skipped if skipped is not None else {}
    cfg = load_config(hw)
    part, report = partition_for_dsa(mod, cfg)
    for op in report.cpu_ops:
        if " not supported: " in op.reason and not op.reason.startswith("part of "):
            skipped[op.var] = op.reason  # a DSA pattern that its check (or shape) refused
    tasks: dict[Task, list[str]] = {}
    for i, (_gv, func) in enumerate(region_functions(part)):
        try:
            region = region_from_function(func, f"dsa_region{i}", cfg)
        except Exception as e:  # noqa: BLE001 - stays on the CPU (the compile report says why)
            skipped[f"dsa_region{i}"] = f"lowering failed: {type(e).__name__}: {e}"
            continue
        region, _ = fold_region_inputs(region, cfg)  # the layers as the compiler lowers them
        for layer in region.layers:
            try:
                r = recipe(layer, cfg, consts=False)
            except UnsupportedLayer as e:
                skipped[layer.name] = f"no DSA recipe: {e}"
                continue
            try:
                task = Task(cfg, perf_shape(r.shape))
            except TypeError:  # a layer kind without a tuning space keeps its default
                continue
            tasks.setdefault(task, []).append(layer.name)
    return [t for t in tasks if _tunable(t)], {t.name: names for t, names in tasks.items()}


def _tunable(task: Task) -> bool:
    """The task's knobs can be sampled on its compute (a layer kind whose stages the
    space does not know keeps its default schedule instead of failing the run)."""
    from tvm import s_tir

    from tir_schedules.kinds.space import sample_knobs

    try:
        sample_knobs(s_tir.Schedule(task.workload()), task.shape, fixed=task.default_knobs())
    except Exception:  # noqa: BLE001 - any failure means: not tunable, keep the default
        return False
    return True


def tune(mod, work_dir: str | Path, trials: int = 64,
         hw: "str | Path | HardwareConfig | None" = None, runner=None, seed: int | None = 0,
         progress: Callable[[str], None] | None = None,
         workers: int | None = None) -> TuneReport:
    """Tune every DSA task of ``mod`` (a Relax module, e.g. from ``from_onnx``) with
    ``trials`` measured candidates each; results go to ``work_dir``'s JSON database.

    ``runner``: None measures in this process; ``dsa_tvm.tuning.rpc.rpc_runner(...)``
    measures on RPC servers. ``progress`` gets one line per task (default: stderr).
    ``workers``: processes that build (and, locally, measure) candidates; default one
    per core. ``seed``: the same seed repeats the run exactly, with one worker (what
    was random, :mod:`.isolate`); None: a different run each time. ``trials`` and
    ``workers`` below 1 are a ValueError."""
    check_budget(trials, workers)
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    cfg = load_config(hw)
    work_dir = Path(work_dir)
    db = open_database(work_dir)   # a bad work_dir fails before the task extraction
    t0 = time.perf_counter()
    skipped: dict[str, str] = {}
    tasks, layers = extract_tasks(mod, cfg, skipped=skipped)
    report = TuneReport(cfg.name, str(work_dir), layers=layers, skipped=skipped)
    say(f"{len(tasks)} DSA tasks for '{cfg.name}', {trials} trials each")
    for what, why in skipped.items():
        say(f"no task for {what}: {why}")
    for i, task in enumerate(tasks):
        r = tune_task(task, trials, db, work_dir / "tasks" / f"{i:03d}", runner=runner, seed=seed,
                      workers=workers)
        report.results.append(r)
        say(f"[{i + 1}/{len(tasks)}] {task.name}: {r.default_cycles:,} -> {r.best_cycles:,} "
            f"cycles (x{r.speedup:.3f}) in {r.trials} trials, {r.seconds:.1f} s")
    report.seconds = time.perf_counter() - t0
    return report
