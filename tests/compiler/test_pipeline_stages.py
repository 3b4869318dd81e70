"""Each stage of a DSA compile runs once per match, per region and per layer.

``dsa_tvm.pipeline.compile_for_dsa`` lists the stages; these tests count the calls on
a small CNN (conv, ReLU, max pool, residual add, Gemm) and fail when a stage runs twice
for the same thing: a match described or checked again (the partition report and the
FuseOpsByPattern checks share one verdict), a region function read twice, a layer's
recipe or a region's program computed twice.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest

pytest.importorskip("tvm")

from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

import dsa_tvm  # noqa: E402
from dsa_tvm import pipeline  # noqa: E402
from dsa_tvm.lowering import region as lowering_region  # noqa: E402
from dsa_tvm.models import get_model  # noqa: E402
from relay_passes import match_memo, partition, to_layers  # noqa: E402
from relay_passes.canonicalize import prepare  # noqa: E402
from relay_passes.kinds import common as dsa_supported  # noqa: E402


@pytest.fixture(scope="module")
def small_cnn():
    model = get_model("small_cnn", input_size=16, width=8, num_classes=10)
    return from_onnx(model, keep_params_in_input=False)


def _count(monkeypatch, module, name: str, key, counter: Counter) -> None:
    """Count calls of ``module.name`` by ``key(*args, **kwargs)``."""
    orig = getattr(module, name)

    def counted(*args, **kwargs):
        counter[(name, key(*args, **kwargs))] += 1
        return orig(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)


def _per(counter: Counter, name: str) -> Counter:
    return Counter({k: n for (what, k), n in counter.items() if what == name})


def test_each_stage_once_per_match_region_and_layer(small_cnn, monkeypatch):
    calls: Counter = Counter()
    root = lambda kind, root, *_: (kind, hash(root))  # noqa: E731 - the match: its kind and root
    _count(monkeypatch, match_memo, "describe", root, calls)          # report + fusion checks
    _count(monkeypatch, match_memo, "check", lambda m, cfg: (m.kind, hash(m.root)), calls)
    _count(monkeypatch, to_layers, "describe", root, calls)           # reading region functions
    _count(monkeypatch, partition, "region_from_function", lambda f, name, *_: name, calls)
    alive: list = []  # the stand-in layers stay alive, so no two of them share an id

    def layer_id(ly) -> int:
        alive.append(ly)
        return id(ly)

    _count(monkeypatch, dsa_supported, "lowering_supports", lambda ly, cfg: layer_id(ly), calls)
    _count(monkeypatch, lowering_region, "recipe",
           lambda ly, cfg, consts=True: (ly.name, consts) if consts else layer_id(ly), calls)
    _count(monkeypatch, lowering_region, "compile_region", lambda r, cfg, *_: r.name, calls)

    cfg = dsa_tvm.load_config("default")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an internal error would hide stages
        _, report = pipeline.compile_for_dsa(small_cnn, cfg)

    assert not report.error and report.regions, str(report)
    kinds = {ly.split(":")[-1] for d in report.regions for ly in d.layers}
    assert {"conv2d", "max_pool2d", "add", "dense_flat"} <= kinds, kinds  # the head: a flatten view
    layers = sum(len(d.layers) for d in report.regions)
    for name in ("describe", "check", "region_from_function", "lowering_supports", "recipe",
                 "compile_region"):
        per = _per(calls, name)
        assert per, f"{name} never ran: the counter is not on the compile path"
        twice = {k: n for k, n in per.items() if n > 1}
        assert not twice, f"{name} ran more than once for {twice}"
    checked = sum(_per(calls, "check").values())
    assert checked >= layers  # every layer of every region was checked (once)
    assert len(_per(calls, "region_from_function")) == len(report.partition.regions)
    assert len(_per(calls, "compile_region")) == len(report.regions)
    # the codegen constraint's recipe (no constants) once per checked match, the full one
    # once per layer of a compiled region
    assert sum(n for (what, k), n in calls.items() if what == "recipe" and isinstance(k, int)) \
        <= checked
    assert {k[0] for k in _per(calls, "recipe") if isinstance(k, tuple)} == \
        {ly for d in report.regions for ly in d.layers}


def test_fusion_checks_answered_from_the_report_verdicts(small_cnn, monkeypatch):
    """FuseOpsByPattern's check functions get the very nodes ``pattern_decisions`` walked
    (``annotated_expr["root"]``): every one is answered from the memo, none described again."""
    memo = match_memo.MatchMemo(dsa_tvm.load_config("default"))
    asked: list[tuple[int, int]] = []
    verdict = memo.verdict

    def counted(index, root, lookup):
        asked.append((index, hash(root)))
        return verdict(index, root, lookup)

    monkeypatch.setattr(memo, "verdict", counted)
    prepared = prepare(small_cnn)
    partition.pattern_decisions(prepared, memo)
    seen, n_report = len(memo), len(asked)
    part = partition.fuse_and_merge(prepared, memo)
    from_checks = asked[n_report:]
    assert from_checks, "FuseOpsByPattern asked nothing: the checks do not read the memo"
    assert len(memo) == seen, "a fusion check met a (pattern, root) the report never saw"
    assert set(from_checks) <= set(asked[:n_report])
    assert partition.region_functions(part)
