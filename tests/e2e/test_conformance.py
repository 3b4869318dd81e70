"""ONNX's node test suite through ``dsa_tvm.onnx_backend`` with target llvm and target dsa.

All 1,884 node cases (``onnx.backend.test.case.node``), each imported once and
compiled once per target. What llvm does with a case is TVM's business and is
pinned in ``tests/e2e/onnx_conformance_expected.json`` (regenerate it with
``python benchmarks/bench_conformance.py --write-expected``, never by hand); the
DSA's promise is checked case by case: the dsa target never breaks where llvm
builds, and every case llvm runs correctly runs correctly under dsa with the
same outputs (bit for bit when no region is offloaded).
"""

from __future__ import annotations

import os

import pytest

from dsa_tvm import conformance as C

# one worker sweeps, once (under pytest-xdist the module's tests would otherwise split)
pytestmark = pytest.mark.xdist_group("conformance")


@pytest.fixture(scope="module")
def results() -> list[C.CaseResult]:
    return C.sweep(workers=min(2, os.cpu_count() or 1))  # compile-bound: one case per core


def test_every_node_case_is_swept(results):
    assert len(results) == len(C.node_cases()) >= 1800
    assert sum(r.llvm == "ok" for r in results) >= 700  # TVM runs most of what it imports


def test_dsa_never_breaks_where_llvm_builds(results):
    breaks = [f"{r.name}: llvm {r.llvm}, dsa {r.dsa}: {r.dsa_reason}" for r in C.dsa_breaks(results)]
    assert not breaks, "\n".join(breaks)


def test_dsa_gives_llvms_answers(results):
    """Where llvm answers right, dsa does (same bits unless a region went to the DSA)."""
    wrong = [f"{r.name}: {r.dsa}: {r.dsa_reason}" for r in results
             if r.llvm == "ok" and r.dsa != "ok"]
    assert not wrong, "\n".join(wrong)


def test_llvm_matches_the_expectations_file(results):
    """A case TVM starts passing (or stops) is reported: regenerate the file when intended."""
    fixed, broken = C.compare_expected(results, C.load_expected())
    regen = "; regenerate with: python benchmarks/bench_conformance.py --write-expected"
    assert not fixed, "now pass under llvm" + regen + "\n" + "\n".join(fixed)
    assert not broken, "no longer pass under llvm" + regen + "\n" + "\n".join(broken)
    known = {r.name for r in results}
    stale = sorted(set(C.load_expected()) - known)
    assert not stale, f"expectations for cases the suite no longer has: {stale[:10]}"
