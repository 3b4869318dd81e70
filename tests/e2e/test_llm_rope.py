"""The tiny Llama's rotary chains and KV-cache concats on the DSA.

The decode and prefill steps read ``cos``/``sin`` as inputs (positions change every
token); the ``rope`` room takes them as float region inputs the host packs. On ``edge``
(8-lane blocks: half the tiny model's 16-code head is a whole block) the query rotary
chains run on the DSA: the compile report lists them, every launch equals the integer
reference bit for bit, and each rope's output is within one step of the float chain
(the quantizer's semantics, as the CPU build computes it) on the same codes and tables.
The cache concat (cache rows, then the new token's rows, per KV head) is a copy in the
movement room, so the step's launches drop from 17 to 11 on edge (its norms and softmax
stay on the host: edge has no norm units).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dsa_tvm.layers.ir import Concat, Rope  # noqa: E402
from dsa_tvm.llm import load  # noqa: E402
from tir_schedules.kinds import run_layer  # noqa: E402

from .test_llm_decode import BUCKETS, PROMPT, assert_steps_bit_exact  # noqa: E402


@pytest.fixture(scope="module", params=[True, False], ids=["int16-qkv", "int8-qkv"])
def edge(request):
    """The default (Q, K, V and the cache on int16, ``wide_qkv``) and the int8 path."""
    return load("tiny", hw="edge", wide_qkv=request.param, **BUCKETS)


def _ropes(model) -> dict[tuple, list[Rope]]:
    """(compile id, region name) -> the region's runtime-table Rope layers."""
    out = {}
    for crep in model.reports.values():
        for d in crep.regions:
            if d.target == "dsa":
                ropes = [ly for ly in d.region.layers if isinstance(ly, Rope) and ly.tables]
                if ropes:
                    out[crep.compile_id, d.name] = (d.region, ropes)
    return out


def _float_rope(codes, ly: Rope, cos, sin) -> np.ndarray:
    """The QDQ chain as the quantizer defines it: dequantize, x*cos + rotate_half(x)*sin
    in float, quantize (round half to even, as onnxruntime and the CPU build)."""
    x = (codes.astype(np.float64).reshape(ly.input.shape) - ly.input.zero_point) \
        * ly.input.scale
    p, d = ly.table_shape
    x = x.reshape(-1, p, d)
    c = np.asarray(cos, np.float64).reshape(p, d)
    s = np.asarray(sin, np.float64).reshape(p, d)
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
    y = np.round((x * c + rot * s) / ly.output.scale) + ly.output.zero_point
    info = np.iinfo(ly.output.dtype)
    return np.clip(y, info.min, info.max).reshape(ly.output.shape)


def test_rotary_chains_run_on_the_dsa_bit_exact(edge):
    gen = edge.generate(PROMPT, max_new_tokens=3)
    assert [s.kind for s in gen.steps] == ["sink", "prefill", "decode", "decode"]
    ropes = _ropes(edge)
    decode = edge.reports[(1, 16)]
    layers = [ly for d in decode.regions if d.target == "dsa" for ly in d.region.layers]
    # every layer's query and key rotary chains, and its K and V cache concats
    assert sum(isinstance(ly, Rope) and bool(ly.tables) for ly in layers) \
        == 2 * edge.arch.layers
    cats = cache_concats(layers)
    assert len(cats) == 2 * edge.arch.layers
    assert all(c.inputs[0].shape[1] == 16 and c.inputs[1].shape[1] == 1 for c in cats)
    assert "runtime tables" in str(decode)
    # with Q, K and V on int16 a table reads QK^T's joined byte planes (edge has no norm
    # units: the softmax is the host's) as rows, the join's form; a 4-D view beside them
    # once made the region fail to lower and run on the CPU
    assert "lowering failed" not in str(decode), str(decode)
    assert gen.steps[-1].launches <= 11   # 17 with both on the host
    assert_steps_bit_exact(edge, gen.ids[:1])
    checked = 0
    for launch in edge.last_launches:
        hit = ropes.get((launch.compile_id, launch.program.name))
        if hit is None:
            continue
        region, layers = hit
        env = {t.name: np.asarray(launch.inputs[t.name]).reshape(t.shape)
               for t in region.inputs}
        for ly in region.layers:   # the integer reference, every intermediate kept
            env[ly.output.name] = run_layer(ly, env)
        for ly in layers:
            cos, sin = (env[t.name] for t in ly.tables)
            want = _float_rope(env[ly.input.name], ly, cos, sin)
            assert np.abs(env[ly.output.name].astype(np.float64) - want).max() <= 1
            checked += 1
    assert checked
    assert all(ly.input.dtype == ("int16" if edge.wide_qkv else "int8")
               for _, layers in ropes.values() for ly in layers)


def cache_concats(layers: list) -> list:
    """The KV-cache concats among ``layers`` (not down_proj's byte planes, also a Concat)."""
    return [ly for ly in layers if isinstance(ly, Concat) and not ly.name.endswith("/planes")]


def test_a_decode_step_is_one_launch_on_default():
    """A tiny Llama whose half head (16 codes) is a whole block on ``default``: with the
    rotary chains, the cache concats and the head moves in the region, the decode step is
    one DSA launch, bit-exact against the integer reference. The concats write the new
    token's K and V tiles among the cache's, which the host laid out (``TilesAppend``):
    the cache is read as often as when the host joins it (``rows_concat="host"``), plus
    the new K tiles read back for their column sums, and never copied."""
    from dsa_tvm.llm.model import CompiledLLM
    from dsa_tvm.llm.source import TINY, Source, tiny_llama

    source = Source(TINY, tiny_llama(0, heads=2, kv_heads=1), None)
    model = CompiledLLM(source, "default", "w8a8", **BUCKETS)
    assert model.rows_concat == "dsa"
    gen = model.generate(PROMPT, max_new_tokens=3)
    assert [s.launches for s in gen.decode] == [1, 1]
    assert_steps_bit_exact(model, gen.ids[:1])
    ops = [ly["op"] for launch in model.last_launches
           for ly in launch.program.meta["layers"]]
    planes = 2 if model.wide_qkv else 1      # (the default: an int16 cache, two byte planes)
    assert ops.count("TilesAppend") == 2 * planes * model.arch.layers and "Concat" not in ops
    # the concats on the host: the report says so, the tokens and the launches' bits are
    # the same
    host = CompiledLLM(source, "default", "w8a8", rows_concat="host", **BUCKETS)
    hgen = host.generate(PROMPT, max_new_tokens=3)
    assert hgen.ids == gen.ids
    assert all(s.launches > 1 for s in hgen.decode)
    tile = model.cfg.wgt_tile_bytes * model.arch.head_dim // model.cfg.block_in
    for d, h in zip(gen.decode, hgen.decode):
        assert 0 <= d.read_kv - h.read_kv <= model.arch.layers * model.arch.kv_heads * tile
    decode = host.reports[(1, 16)]
    assert not cache_concats([ly for d in decode.regions if d.target == "dsa"
                              for ly in d.region.layers])
    assert "rows_concat='host'" in str(decode)
    assert_steps_bit_exact(host, hgen.ids[:1])
    # tables beyond the bound they were compiled for: an error naming them, not numbers
    import tvm

    from dsa_tvm.llm.feeds import step_feeds

    _, vm = model.executable(1, 16)
    feeds = step_feeds(model.hf, model.arch, [5], 3, 1, 16, model.new_cache())
    feeds["sin"] = feeds["sin"] * 1.5
    args = [tvm.runtime.tensor(np.ascontiguousarray(feeds[n]))
            for n in model.arch.input_names(16)]
    with pytest.raises(Exception, match="rotary table 'sin' .* beyond the bound 1"):
        vm["main"](*args)

