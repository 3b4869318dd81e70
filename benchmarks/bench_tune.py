"""Tuning benchmark: MetaSchedule on the DSA tasks of an int8 ResNet-18, per hardware preset.

For every distinct DSA task (layer shape; zero points aside) of the bundled
ResNet-18 (QDQ int8), on each preset, prints (never asserts):

* the default schedule's cycles (the analytic heuristic's pick, simulated);
* the tuned cycles after ``--trials`` measured candidates (the default among them,
  as the search's seed) and the wall time of tuning the task;
* for tasks with at most ``--exhaustive-max`` settings to enumerate, the exhaustive
  optimum and tuned / optimum: every setting within the search's budget simulated
  (it fits, and the analytic estimate is within ``tuning.search.BUDGET`` times the
  default's; the settings the search skips for a leaner twin, ``LEANER``, are
  enumerated too, so the optimum can be one the search never sees), or with
  ``--exhaustive-full`` every setting that fits;
* the cost model's rank correlation (Spearman, Kendall) on held-out candidates of
  the ``--rank-tasks`` largest spaces of layers with at most 28x28 outputs, next
  to the analytic estimate's.

Goals: tuned within 5% of the optimum, never worse than the default, <= 60 s per
task on 2 cores.

    python benchmarks/bench_tune.py [--hw default edge] [--trials 64] [--size 224]
"""

from __future__ import annotations

import argparse
import tempfile
import time


def exhaustive(task, full: bool, workers: int) -> tuple[int, object, float]:
    """(best cycles, its knobs, seconds) over every setting of ``task`` within the budget
    (``full``: every fitting one), each simulated (on ``workers`` processes)."""
    from dsa_tvm.tuning.measure import measure_many
    from dsa_tvm.tuning.search import within_budget

    t0 = time.perf_counter()
    cands = task.candidates() if full else within_budget(task)
    cycles = measure_many(task, cands, workers)
    best = min(zip(cycles, range(len(cands)), cands))
    return best[0], best[2], time.perf_counter() - t0


def bench_preset(hw: str, size: int, trials: int, exhaustive_max: int, full: bool,
                 only: str | None, rank_tasks: int, seed: int, rank_only: bool = False,
                 workers: int | None = None) -> dict:
    from tvm.relax.frontend.onnx import from_onnx

    import dsa_tvm
    from dsa_tvm.models.zoo import get_model
    from dsa_tvm.tuning import extract_tasks, open_database, tune_task
    from dsa_tvm.tuning.rank import cost_model_check
    from dsa_tvm.tuning.search import default_estimate, searchable, within_budget
    from dsa_tvm.tuning.tuner import default_workers

    workers = default_workers() if workers is None else workers

    cfg = dsa_tvm.load_config(hw)
    mod = from_onnx(get_model("resnet18", input_size=size), keep_params_in_input=False)
    tasks, layers = extract_tasks(mod, cfg)
    if only:
        tasks = [t for t in tasks if only in t.name]
    # quickest first (by the default schedule's estimate): a cut-short run still covers most
    tasks.sort(key=default_estimate)
    work = tempfile.mkdtemp(prefix=f"bench-tune-{hw}-")
    db = open_database(work)
    print(f"\n== '{hw}': {len(tasks)} DSA tasks of resnet18 @ {size}, {trials} trials each, "
          f"{workers} worker processes (work dir {work})")
    nw = max([len(t.name) for t in tasks] + [4])
    head = (f"{'task':<{nw}} {'space':>5} {'budget':>6} {'search':>6} {'default':>10} "
            f"{'tuned':>10} {'speedup':>7} {'optimum':>10} {'tuned/opt':>9} {'trials':>6} "
            f"{'tune s':>6} {'enum s':>6}")
    print(head)
    print("-" * len(head))
    rows = []
    for i, task in enumerate([] if rank_only else tasks):
        n, b, m = len(task.candidates()), len(within_budget(task)), len(searchable(task))
        r = tune_task(task, trials, db, f"{work}/tasks/{i:03d}", seed=seed, workers=workers)
        opt = opt_s = None
        if (n if full else b) <= exhaustive_max:
            opt, _, opt_s = exhaustive(task, full, workers)
        rows.append({"task": task.name, "space": n, "default": r.default_cycles,
                     "tuned": r.best_cycles, "opt": opt, "s": r.seconds, "trials": r.trials})
        print(f"{task.name:<{nw}} {n:>5} {b:>6} {m:>6} {r.default_cycles:>10,} {r.best_cycles:>10,} "
              f"{r.speedup:>7.3f} {opt if opt is not None else '-':>10} "
              f"{(f'{r.best_cycles / opt:.3f}' if opt else '-'):>9} {r.trials:>6} "
              f"{r.seconds:>6.1f} {(f'{opt_s:.0f}' if opt_s is not None else '-'):>6}", flush=True)
    if rank_only:
        print("(--rank-only: no tuning)")
    enum = [r for r in rows if r["opt"]]
    w = sum(len(layers.get(r["task"], [1])) * r["default"] for r in rows)
    t = sum(len(layers.get(r["task"], [1])) * r["tuned"] for r in rows)
    if t:
        print(f"network (each task x its layers): default {w:,} -> tuned {t:,} cycles "
              f"(x{w / t:.3f})")
    print(f"never worse than the default: {sum(r['tuned'] <= r['default'] for r in rows)}/"
          f"{len(rows)}; within 5% of the optimum: "
          f"{sum(r['tuned'] <= 1.05 * r['opt'] for r in enum)}/{len(enum)} enumerated "
          f"(worst tuned/opt {max((r['tuned'] / r['opt'] for r in enum), default=1):.3f}); "
          f"tuning time per task: mean {sum(r['s'] for r in rows) / max(len(rows), 1):.1f} s, "
          f"max {max((r['s'] for r in rows), default=0):.1f} s")
    # the largest spaces among layers of at most 28x28 outputs (cheap to lower)
    small = [tk for tk in tasks if max(getattr(tk.shape, "out_hw", (0, 0))) <= 28]
    ranked = sorted(small, key=lambda tk: -len(tk.candidates()))[:rank_tasks]
    if ranked:
        print("cost model (XGBoost on KnobFeatures, 48 measured -> 48 held out) rank correlation "
              "with measured speed:")
        for task in ranked:
            c = cost_model_check(task, 48, 48, seed=seed, workers=workers)
            print(f"  {task.name:<{nw}} Spearman {c['spearman']:+.3f}  Kendall "
                  f"{c['kendall']:+.3f}  (analytic estimate alone: Spearman "
                  f"{c['estimate_spearman']:+.3f})", flush=True)
    return {"hw": hw, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hw", nargs="*", default=["default", "edge"])
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--exhaustive-max", type=int, default=800,
                    help="enumerate tasks with at most this many settings to enumerate")
    ap.add_argument("--exhaustive-full", action="store_true",
                    help="enumerate every fitting setting, not only those within the budget")
    ap.add_argument("--only", help="only tasks whose name contains this")
    ap.add_argument("--rank-tasks", type=int, default=2,
                    help="cost-model rank correlation on this many of the largest spaces")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rank-only", action="store_true",
                    help="only the cost model's rank correlation, no tuning")
    ap.add_argument("--workers", type=int, default=None,
                    help="processes that build and measure (default: one per core)")
    a = ap.parse_args()
    for hw in a.hw:
        bench_preset(hw, a.size, a.trials, a.exhaustive_max, a.exhaustive_full, a.only,
                     a.rank_tasks, a.seed, a.rank_only, a.workers)


if __name__ == "__main__":
    main()
