"""A QDQ graph that joins a cache input to new rows along the second-to-last axis (an
LLM's KV cache, ranks 3-5): the quantizer plans the concat int8 on one grid with the
cache input, the partitioner takes it into the DSA region as a rows concat, every launch
equals the integer reference bit for bit and the output stays within one step of TVM's
LLVM build of the same quantized graph."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

import tvm  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tvm import relax  # noqa: E402

import dsa_tvm  # noqa: E402
from dsa_tvm.layers.ir import Concat  # noqa: E402
from dsa_tvm.quant import quantize_onnx  # noqa: E402
from dsa_tvm.runtime import take_launches  # noqa: E402
from tir_schedules.kinds import run_region  # noqa: E402

from ..qdq_models import make_model, node, rand  # noqa: E402
from .qop_harness import SLOW_HOST_GMACS  # noqa: E402


def cache_net(lead: tuple[int, ...], cached: int, new: int, d: int, seed: int):
    """new = x @ W1; y = concat(cache, new, axis=-2) @ W2."""
    rng = np.random.default_rng(seed)
    inits = {"W1": rand(rng, d, d, scale=d ** -0.5), "W2": rand(rng, d, d, scale=d ** -0.5)}
    nodes = [node("MatMul", ["x", "W1"], ["new"], name="proj"),
             node("Concat", ["cache", "new"], ["cat"], axis=-2, name="cat"),
             node("MatMul", ["cat", "W2"], ["y"], name="head")]
    return make_model(nodes, inits, {"x": (*lead, new, d), "cache": (*lead, cached, d)},
                      {"y": None})


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(rank=st.sampled_from([3, 4, 5]), heads=st.integers(1, 3), cached=st.integers(1, 20),
       new=st.integers(1, 3), d=st.sampled_from([16, 24, 32]), seed=st.integers(0, 99))
def test_cache_concat_runs_on_the_dsa_bit_exact(rank, heads, cached, new, d, seed):
    lead = {3: (heads,), 4: (1, heads), 5: (1, heads, 2)}[rank]
    model = cache_net(lead, cached, new, d, seed)
    rng = np.random.default_rng(seed)
    feeds = [{"x": rng.normal(0, 1, (*lead, new, d)).astype(np.float32),
              "cache": rng.normal(0, 1, (*lead, cached, d)).astype(np.float32)}
             for _ in range(4)]
    qm = quantize_onnx(model, feeds, show_progress=False)
    cfg = dsa_tvm.load_config("default").replace(cpu_gmacs=SLOW_HOST_GMACS,
                                                 launch_overhead_us=0.0)
    ex = tvm.compile(qm.to_relax(), target=dsa_tvm.target(cfg))
    rep = dsa_tvm.compile_report(ex)
    regions = {d_.name: d_.region for d_ in rep.regions}
    cats = [ly for r in regions.values() for ly in r.layers if isinstance(ly, Concat)]
    assert len(rep.regions) == 1 and rep.regions[0].target == "dsa", str(rep)
    assert len(cats) == 1 and cats[0].output.shape[-2:] == (cached + new, d), str(rep)
    args = [tvm.runtime.tensor(feeds[0][n]) for n in ("x", "cache")]
    take_launches()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy()
    launches = take_launches()
    assert launches
    for la in launches:
        want = run_region(regions[la.program.name], la.inputs)
        for name, arr in la.outputs.items():
            np.testing.assert_array_equal(arr, want[name])
    ref_ex = tvm.compile(qm.to_relax(), target="llvm")
    ref = relax.VirtualMachine(ref_ex, tvm.cpu())["main"](*args).numpy()
    inits = {i.name: i for i in qm.model.graph.initializer}
    step = float(np.frombuffer(inits["y/scale"].raw_data, np.float32)[0]) \
        if "y/scale" in inits else float(np.abs(ref).max() / 64)
    assert np.abs(got - ref).max() <= step * (1 + 1e-3)
