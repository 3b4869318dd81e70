"""ONNX's node test suite through :mod:`dsa_tvm.onnx_backend`, with target llvm and dsa.

Each case is imported once and compiled once per target. llvm's result against
the case's expected outputs is TVM's business (its importer and CPU build); the
dsa target's promise is that it never breaks where llvm runs and never changes
an answer: without an offloaded region its outputs equal llvm's bit for bit, with
one they meet the case's expected outputs. The cases llvm does not run correctly
are kept, with the reason, in ``tests/e2e/onnx_conformance_expected.json``, written by
``python benchmarks/bench_conformance.py --write-expected``.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import target as dsa_target
from .onnx_backend import compile_module, import_onnx

EXPECTED = Path(__file__).resolve().parent.parent / "tests" / "e2e" / "onnx_conformance_expected.json"

#: llvm statuses: ok, or where TVM stopped (the expectations file lists the others)
LLVM_STATUSES = ("ok", "import", "compile", "run", "wrong")


@dataclass
class CaseResult:
    name: str
    llvm: str                # one of LLVM_STATUSES
    llvm_reason: str = ""
    dsa: str = "-"   # ok | break | run (fails to run like llvm) | wrong | differs | - (not built)
    dsa_reason: str = ""
    offloaded: int = 0       # regions the dsa build launches on the DSA


@functools.cache
def node_cases() -> tuple:
    """ONNX's node test cases (model, inputs, expected outputs), generated once per process."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(collect_testcases(None))


def _reason(e: BaseException) -> str:
    """The exception as one stable line (no timestamps, no source locations)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    msg = next((ln for ln in reversed(lines) if re.match(r"^\w*(Error|Exception)\b", ln)), None)
    msg = msg or (lines[0] if lines else "")
    msg = re.sub(r"^\[\d\d:\d\d:\d\d\] ", "", msg)
    return f"{type(e).__name__}: {msg}"[:200]


def mismatch(expected: Any, got: Any, rtol: float, atol: float, where: str = "output") -> str:
    """Why ``got`` is not ``expected`` under the case's tolerances ('' when it is)."""
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return f"{where}: expected a sequence of {len(expected)}, got {type(got).__name__}"
        for i, (e, g) in enumerate(zip(expected, got)):
            why = mismatch(e, g, rtol, atol, f"{where}[{i}]")
            if why:
                return why
        return ""
    e, g = np.asarray(expected), np.asarray(got) if not isinstance(got, list) else None
    if g is None:
        return f"{where}: expected a tensor, got a sequence"
    if e.dtype != g.dtype:
        return f"{where}: dtype {g.dtype}, expected {e.dtype}"
    if e.shape != g.shape:
        return f"{where}: shape {g.shape}, expected {e.shape}"
    if e.dtype == object or e.dtype.kind in "USb":
        return "" if np.array_equal(e, g) else f"{where}: values differ"
    if e.dtype.kind not in "fciu":  # float8/4-bit custom dtypes: compare as float
        e, g = e.astype(np.float32), g.astype(np.float32)
    close = np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return ""
    err = np.abs(g.astype(np.float64) - e.astype(np.float64))
    return (f"{where}: {int((~close).sum())} of {close.size} elements off "
            f"(max abs err {float(np.nanmax(np.where(close, 0, err))):.3g}, rtol {rtol}, "
            f"atol {atol})")


def identical(a: Any, b: Any) -> bool:
    """Same outputs bit for bit (NaN where NaN), sequences element by element."""
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and \
            all(identical(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f" or a.dtype.kind == "c":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b)) or a.tobytes() == b.tobytes()


def _array(value: Any) -> Any:
    """An expected output as numpy (cases give some as TensorProto), sequences as lists."""
    import onnx
    import onnx.numpy_helper

    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, (list, tuple)):
        return [_array(v) for v in value]
    return value


def _run_all(rep, case) -> tuple[list, str]:
    """The rep's outputs on every data set of ``case``, and the first mismatch ('' if none)."""
    outs, why = [], ""
    for k, (inputs, expected) in enumerate(case.data_sets):
        expected = [_array(e) for e in expected]
        got = rep.run(inputs)
        outs.append(got)
        if not why:
            if len(got) != len(expected):
                why = f"{len(got)} outputs, expected {len(expected)}"
            for i, (e, g) in enumerate(zip(expected, got)):
                why = why or mismatch(e, g, case.rtol, case.atol, f"set {k} output {i}")
    return outs, why


def run_case(case, hardware: Any = None) -> CaseResult:
    """Import ``case`` once, build and run it with llvm and with the dsa target."""
    import tvm


    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = import_onnx(case.model)
    except Exception as e:  # noqa: BLE001 - TVM's importer rejects it: recorded, not ours
        return CaseResult(case.name, "import", _reason(e))
    res = CaseResult(case.name, "ok")
    llvm_outs = None
    try:
        rep = compile_module(mod, case.model, tvm.target.Target("llvm"))
    except Exception as e:  # noqa: BLE001 - TVM's llvm build: recorded as its status
        res.llvm, res.llvm_reason = "compile", _reason(e)
    else:
        try:
            llvm_outs, why = _run_all(rep, case)
            if why:
                res.llvm, res.llvm_reason = "wrong", why
        except Exception as e:  # noqa: BLE001
            res.llvm, res.llvm_reason = "run", _reason(e)
    try:
        rep = compile_module(mod, case.model, dsa_target(hardware))
    except Exception as e:  # noqa: BLE001 - a dsa break: the conformance test names it
        res.dsa, res.dsa_reason = "break", _reason(e)
        return res
    report = rep.compile_report
    res.offloaded = sum(r.target == "dsa" for r in report.regions) if report else 0
    try:
        dsa_outs, why = _run_all(rep, case)
    except Exception as e:  # noqa: BLE001
        # where llvm's build runs, a dsa build that does not is a break; else TVM's too
        res.dsa = "break" if res.llvm in ("ok", "wrong") else "run"
        res.dsa_reason = _reason(e)
        return res
    if llvm_outs is not None and not res.offloaded and not all(
            identical(o, p) for a, b in zip(llvm_outs, dsa_outs) for o, p in zip(a, b)):
        res.dsa, res.dsa_reason = "differs", "outputs differ from llvm's without an offloaded region"
    else:
        res.dsa, res.dsa_reason = ("wrong", why) if why else ("ok", "")
    return res


def sweep(cases: Iterable | None = None, hardware: Any = None,
          progress: Callable[[CaseResult], None] | None = None,
          workers: int = 1) -> list[CaseResult]:
    """:func:`run_case` over ``cases`` (default: every node case), in order.

    ``workers > 1`` shares batches of cases (pickled: 10 MB for all) among that many
    fresh (spawned) processes.
    """
    cases = list(node_cases() if cases is None else cases)
    out: list[CaseResult] = []
    if workers <= 1 or len(cases) < 2 * _BATCH:
        for case in cases:
            out.append(run_case(case, hardware))
            if progress is not None:
                progress(out[-1])
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    batches = [cases[i:i + _BATCH] for i in range(0, len(cases), _BATCH)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for batch in pool.map(_sweep_batch, batches, [hardware] * len(batches)):
            for r in batch:
                out.append(r)
                if progress is not None:
                    progress(r)
    return out


#: cases per batch a worker process runs (small enough to keep every worker busy to the end)
_BATCH = 24


def _sweep_batch(cases: list, hardware: Any) -> list[CaseResult]:
    """One worker's batch, in order."""
    return [run_case(c, hardware) for c in cases]


def dsa_breaks(results: Iterable[CaseResult]) -> list[CaseResult]:
    """Cases the dsa target breaks: its build raised where llvm's did not, it failed to run
    where llvm's ran, its outputs differ from llvm's without an offloaded region, or
    it answers wrong where llvm answers right."""
    return [r for r in results if r.llvm != "import" and (
        (r.dsa == "break" and r.llvm != "compile") or r.dsa == "differs"
        or (r.llvm == "ok" and r.dsa != "ok"))]


def expectations(results: Iterable[CaseResult]) -> dict[str, dict[str, str]]:
    """case -> {llvm status, reason} for every case llvm does not run correctly."""
    return {r.name: {"llvm": r.llvm, "reason": r.llvm_reason}
            for r in sorted(results, key=lambda r: r.name) if r.llvm != "ok"}


def load_expected(path: Path = EXPECTED) -> dict[str, dict[str, str]]:
    return json.loads(path.read_text())["cases"]


def write_expected(results: list[CaseResult], path: Path = EXPECTED) -> Path:
    import onnx
    import tvm

    doc = {"generated_by": "python benchmarks/bench_conformance.py --write-expected",
           "onnx": onnx.__version__, "tvm": tvm.__version__,
           "note": "node cases TVM's importer or llvm build does not run correctly (not the "
                   "DSA's: every case llvm runs must run identically with target dsa)",
           "cases": expectations(results)}
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    return path


def compare_expected(results: Iterable[CaseResult], expected: dict[str, dict[str, str]]
                     ) -> tuple[list[str], list[str]]:
    """(newly passing, newly failing): llvm statuses that differ from the expectations."""
    fixed, broken = [], []
    for r in results:
        want = expected.get(r.name, {}).get("llvm", "ok")
        if want == r.llvm:
            continue
        (fixed if r.llvm == "ok" else broken).append(
            f"{r.name}: llvm {r.llvm} (expected {want}){': ' + r.llvm_reason if r.llvm_reason else ''}")
    return fixed, broken


def summary(results: list[CaseResult]) -> dict[str, int]:
    llvm_runs = [r for r in results if r.llvm == "ok"]
    return {"cases": len(results),
            "imported": sum(r.llvm != "import" for r in results),
            "llvm builds": sum(r.llvm in ("ok", "wrong", "run") for r in results),
            "llvm runs": len(llvm_runs),
            "llvm wrong": sum(r.llvm == "wrong" for r in results),
            "dsa breaks": sum(r.dsa != "wrong" for r in dsa_breaks(results)),
            "dsa wrong": sum(r.dsa == "wrong" for r in llvm_runs),
            "cases with a region offloaded": sum(r.offloaded > 0 for r in results)}


def as_dicts(results: list[CaseResult]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]
