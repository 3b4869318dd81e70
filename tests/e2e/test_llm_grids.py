"""Where the decoder's int16 grids run on the DSA (``llm.residual``): the residual stream,
down_proj's and gate/up's inputs as byte planes, the attention's probabilities, the logits,
the MLP's interior, Q, K and V with their int16 cache; each default, each int8 path when
asked, every launch bit-exact against the integer reference (the tiny Llama of
``test_llm_decode``)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dsa_tvm.llm import load  # noqa: E402
from tir_schedules.kinds import run_region  # noqa: E402

from .test_llm_decode import BUCKETS, PROMPT, assert_steps_bit_exact  # noqa: E402


@pytest.fixture(scope="module")
def w8a8():
    return load("tiny", **BUCKETS)


def test_residual_stream_is_int16_on_the_dsa(w8a8):
    """The default W8A8 keeps the residual stream on int16 grids (``llm.residual``): the
    branch denses write int16, the residual adds add int16 codes and the norms read them,
    all inside the regions; ``wide_residual=False`` puts the stream on int8."""
    from dsa_tvm.frontend.intake import load_onnx
    from dsa_tvm.llm.residual import residual_stream
    from dsa_tvm.llm.step import export_step

    w8a8.generate(PROMPT, max_new_tokens=1)
    layers = [ly for crep in w8a8.reports.values() for d in crep.regions if d.target == "dsa"
              for ly in d.region.layers]
    adds = [ly for ly in layers if type(ly).__name__ == "Add" and ly.output.dtype == "int16"]
    norms = [ly for ly in layers if type(ly).__name__ == "RMSNorm"]
    assert len(adds) >= 2 * w8a8.arch.layers       # both residual adds of every layer
    assert all(ly.a.dtype == ly.b.dtype == "int16" for ly in adds)
    assert any(ly.input.dtype == "int16" for ly in norms)   # (bit-exact: the test above)
    # the stream the quantizer widened: x, two adds a layer, their branch inputs
    stream = residual_stream(load_onnx(export_step(w8a8.step_model, 1, 16)).model)
    assert "x" in stream and len(stream) == 1 + 2 * 2 * w8a8.arch.layers
    narrow = load("tiny", wide_residual=False, wide_down=False, wide_attention=False,
                  wide_logits=False, wide_mlp=False, wide_qkv=False, wide_mlp_inputs=False,
                  **BUCKETS)
    narrow.generate(PROMPT, max_new_tokens=2)
    assert not [ly for crep in narrow.reports.values() for d in crep.regions
                if d.target == "dsa" for ly in d.region.layers
                if getattr(getattr(ly, "output", None), "dtype", "int8") == "int16"]


def test_down_proj_reads_the_gate_product_on_int16(w8a8):
    """The default W8A8 puts down_proj's input (the SiLU-gate product) on an int16 grid
    (``llm.residual.gate_products``): the product room writes int16 and down_proj runs as
    two int8 byte planes through one dense that joins them in its accumulator, inside the
    regions (bit-exact: the launch test above); ``wide_down=False`` keeps the product
    int8."""
    from dsa_tvm.frontend.intake import load_onnx
    from dsa_tvm.llm.residual import gate_products
    from dsa_tvm.llm.step import export_step

    products = gate_products(load_onnx(export_step(w8a8.step_model, 1, 16)).model)
    assert len(products) == w8a8.arch.layers and all("Mul" in t for t in products)
    w8a8.generate(PROMPT, max_new_tokens=1)

    def layers_of(model):
        return [ly for crep in model.reports.values() for d in crep.regions
                if d.target == "dsa" for ly in d.region.layers]

    regions = [d.region.layers for crep in w8a8.reports.values() for d in crep.regions
               if d.target == "dsa"]
    muls = [ly for layers in regions for ly in layers if type(ly).__name__ == "Mul"]
    assert muls and all(ly.output.dtype == "int16" for ly in muls)
    planes = []     # the plane denses that read a product (gate and up read the norm's)
    for layers in regions:       # (tensor names are a region's own)
        split = {ly.output.name: ly.input.name for ly in layers
                 if type(ly).__name__ == "BytePlanes"}
        products = {ly.output.name: ly for ly in layers if type(ly).__name__ == "Mul"}
        planes += [(products[split[ly.input.name]], ly) for ly in layers
                   if type(ly).__name__ == "Dense" and ly.planes
                   and split.get(ly.input.name) in products]
    assert len(planes) == len(muls)
    for mul, pl in planes:     # both byte planes of every product row
        assert np.prod(pl.input.shape[:-1]) == 2 * np.prod(mul.output.shape[:-1])
    # an analog part keeps the product int8 (its per-column bias correction would mix the
    # planes' rows), unless asked; the CIM study's digital model too
    assert w8a8.wide_down and not load("tiny", hw="cim-pcm", **BUCKETS).wide_down
    assert load("tiny", hw="cim-pcm", wide_down=True, **BUCKETS).wide_down
    narrow = load("tiny", wide_down=False, wide_mlp_inputs=False, **BUCKETS)
    narrow.generate(PROMPT, max_new_tokens=2)
    assert not [ly for ly in layers_of(narrow) if type(ly).__name__ == "Dense" and ly.planes]
    assert all(ly.output.dtype == "int8" for ly in layers_of(narrow)
               if type(ly).__name__ == "Mul")


def test_attention_probabilities_are_int16_and_p_at_v_runs_as_byte_planes(w8a8):
    """The default W8A8 puts the softmax's output on an int16 grid
    (``llm.residual.attention_probabilities``): the softmax computes int16 codes (NORM's
    out_wide) and writes them as int8 byte planes, which P @ V joins in one batch matmul
    against V's tiles, in the regions (bit-exact: the launch test above);
    ``wide_attention=False`` keeps int8 probabilities and a plain P @ V."""
    from dsa_tvm.layers.ir import BatchMatmul, Softmax
    from dsa_tvm.quant.api import SOFTMAX_OUT_WIDE

    def regions_of(model):
        model.generate(PROMPT, max_new_tokens=1)
        return [d.region.layers for crep in model.reports.values() for d in crep.regions
                if d.target == "dsa"]

    regions = regions_of(w8a8)
    soft = [ly for layers in regions for ly in layers if isinstance(ly, Softmax)]
    assert soft and all(ly.planes and ly.output.dtype == "int8" for ly in soft)
    assert all(ly.output.scale == pytest.approx(SOFTMAX_OUT_WIDE.scale) for ly in soft)
    for layers in regions:
        planes = {ly.output.name for ly in layers if isinstance(ly, Softmax)}
        pv = [ly for ly in layers if isinstance(ly, BatchMatmul) and ly.planes
              and ly.a.name in planes]
        assert {ly.a.name for ly in pv} == planes              # each softmax's P @ V
    # (QK^T runs on byte planes too with Q and K on int16, ``wide_qkv``)
    narrow = [ly for layers in regions_of(load("tiny", wide_attention=False, wide_qkv=False,
                                               **BUCKETS))
              for ly in layers]
    assert all(ly.output.dtype == "int8" and not ly.planes for ly in narrow
               if isinstance(ly, Softmax))
    assert not [ly for ly in narrow if isinstance(ly, BatchMatmul) and ly.planes]


def test_the_logits_are_int16_unless_asked(w8a8):
    """The default W8A8 puts the head's output on an int16 grid (``llm.residual.logits``):
    the head's dense writes int16 (REQUANT's wide mode) and the host reads the logits on
    that grid; ``wide_logits=False`` keeps them int8."""
    from dsa_tvm.layers.ir import Dense

    def heads(model):
        model.generate(PROMPT, max_new_tokens=1)
        return [ly for crep in model.reports.values() for d in crep.regions
                if d.target == "dsa" for ly in d.region.layers
                if isinstance(ly, Dense) and ly.output.shape[-1] == model.arch.vocab]

    assert heads(w8a8) and all(ly.output.dtype == "int16" for ly in heads(w8a8))
    narrow = load("tiny", wide_logits=False, **BUCKETS)
    assert heads(narrow) and all(ly.output.dtype == "int8" for ly in heads(narrow))


def test_wide_mlp_runs_the_silu_as_an_int16_table_bit_exact():
    """The default W8A8 (``wide_mlp``) puts the gated MLP's interior on int16 grids
    (``llm.residual.mlp_interior``: gate's and up's outputs, the SiLU's ops): the two
    denses write int16, the SiLU is one interpolated int16 table (``WideTable``) and the
    product reads int16 operands, every step in one region per chunk as before and every
    launch bit-exact against the integer reference."""
    from dsa_tvm.frontend.intake import load_onnx
    from dsa_tvm.layers.ir import Dense, Mul, WideTable
    from dsa_tvm.llm.residual import mlp_interior
    from dsa_tvm.llm.step import export_step

    model = load("tiny", **BUCKETS)
    step = load_onnx(export_step(model.step_model, 1, 16)).model
    interior = mlp_interior(step)
    made = {o: n for n in step.graph.node for o in n.output}
    kinds = sorted(made[t].op_type for t in interior)
    layers = model.arch.layers
    assert kinds == sorted(["MatMul"] * 2 * layers + ["Sigmoid", "Mul"] * layers), kinds
    gen = model.generate(PROMPT, max_new_tokens=3)
    assert_steps_bit_exact(model, gen.ids[:1])
    regions = [d for crep in model.reports.values() for d in crep.regions]
    assert all(d.target == "dsa" for d in regions)
    got = [ly for d in regions for ly in d.region.layers]
    tables = [ly for ly in got if isinstance(ly, WideTable)]
    assert len(tables) == layers * len(model.reports) and all(t.error <= 8 for t in tables)
    assert all(ly.a.dtype == ly.b.dtype == "int16" for ly in got if isinstance(ly, Mul))
    ffn = model.hf.config.intermediate_size
    assert all(ly.output.dtype == "int16" for ly in got
               if isinstance(ly, Dense) and ly.output.shape[-1] == ffn)
    assert not load("tiny", wide_mlp=False, **BUCKETS).wide_mlp   # off when asked
    assert not load("tiny", hw="cim-pcm", **BUCKETS).wide_mlp      # and on an analog part


def test_wide_inputs_run_every_projection_on_byte_planes_bit_exact():
    """``wide_inputs=True`` puts every linear layer's input but the head's on an int16
    grid (``llm.residual.linear_inputs``): q/k/v, o, gate/up and down run as byte-plane
    denses, the attention's output moves to o_proj as int16 (the permute room's ACC16
    copy), and every launch stays bit-exact against the integer reference."""
    from dsa_tvm.frontend.intake import load_onnx
    from dsa_tvm.layers.ir import Dense
    from dsa_tvm.llm.residual import linear_inputs, mlp_inputs
    from dsa_tvm.llm.step import export_step

    model = load("tiny", wide_inputs=True, **BUCKETS)
    step = load_onnx(export_step(model.step_model, 1, 16)).model
    readers = {n.input[0]: n for n in step.graph.node if n.op_type == "MatMul"}
    inputs = linear_inputs(step)
    assert len(inputs) == 4 * model.arch.layers            # norm x2, attention, product
    assert all(readers[t].output[0] != "logits" for t in inputs)
    gen = model.generate(PROMPT, max_new_tokens=3)
    assert_steps_bit_exact(model, gen.ids[:1])
    denses = [ly for crep in model.reports.values() for d in crep.regions
              if d.target == "dsa" for ly in d.region.layers if isinstance(ly, Dense)]
    vocab = model.arch.vocab
    assert all(ly.planes for ly in denses if ly.output.shape[-1] != vocab)
    assert not any(ly.planes for ly in denses if ly.output.shape[-1] == vocab)
    # wide_mlp_inputs widens only gate's and up's input (the one shared norm output)
    only = mlp_inputs(step)
    assert only <= inputs and len(only) == model.arch.layers
    assert all(sorted(n.name.split("/")[-2] for n in step.graph.node if t in n.input)
               == ["gate_proj", "up_proj"] for t in only)
    wide = load("tiny", **BUCKETS).quantize_options(step)["wide_tensors"]   # the default
    narrow = load("tiny", wide_mlp_inputs=False, **BUCKETS).quantize_options(step)
    assert wide - narrow["wide_tensors"] == only
    cim = load("tiny", hw="cim-pcm", **BUCKETS)     # an analog part keeps int8 there
    assert not cim.wide_mlp_inputs and not cim.wide_qkv


def test_wide_qkv_keeps_an_int16_cache_and_decodes_in_one_launch_bit_exact():
    """``wide_qkv=True`` puts Q, K and V with their cache on int16 grids
    (``llm.residual.attention_operands``): the host keeps int16 codes and hands each cache
    over as two byte planes (``lowering.cache_planes``), a decode step splits only the new
    rows and appends each plane's tiles in place, QK^T and P @ V run one planes matmul per
    plane of the cache (Q's planes interleaved by a move, P's written by the softmax), one
    launch a step, every launch bit-exact."""
    from dsa_tvm.layers.ir import BatchMatmul, TilesAppend
    from dsa_tvm.llm.model import CompiledLLM
    from dsa_tvm.llm.source import TINY, Source, tiny_llama

    # head width 32: whole 16-lane blocks, so the rotary chain and the cache are the DSA's
    model = CompiledLLM(Source(TINY, tiny_llama(0, heads=2, kv_heads=1), None), wide_qkv=True,
                        **BUCKETS)
    gen = model.generate(PROMPT, max_new_tokens=3)
    assert_steps_bit_exact(model, gen.ids[:1])
    decode = model.reports[(1, BUCKETS["context_buckets"][0])]
    (d,) = decode.regions
    assert d.target == "dsa"
    inputs = {t.name: t for t in d.region.inputs}
    planes = {name: io for name, io in d.program.meta["io"].items() if "planes" in io}
    assert len(planes) == 2 * model.arch.layers               # K and V of each layer
    assert all(inputs[name].dtype == "int16" and inputs[name].zero_point == 0
               for name in planes)
    ops = [ly["op"] for ly in d.program.meta["layers"]]
    assert ops.count("TilesAppend") == 4 * model.arch.layers and "Concat" not in ops
    mms = [ly for ly in d.region.layers if isinstance(ly, BatchMatmul)]
    assert len(mms) == 4 * model.arch.layers and all(ly.planes for ly in mms)
    assert all(ly.input.dtype == "int16" for ly in d.region.layers if type(ly).__name__ == "Rope")
    narrow = CompiledLLM(Source(TINY, tiny_llama(0, heads=2, kv_heads=1), None),
                         wide_qkv=False, **BUCKETS)
    thin = narrow.generate(PROMPT, max_new_tokens=2)
    (nd,) = narrow.reports[(1, BUCKETS["context_buckets"][0])].regions
    assert not any("planes" in io for io in nd.program.meta["io"].values())
    assert not any(isinstance(ly, TilesAppend) for ly in nd.region.layers)
    # a decode step reads each plane's tiles once, counted as the cache (llm.traffic): the
    # cache's bytes doubled, less K's column sums (Q on int16 has zero point 0)
    wide_step, thin_step = (next(s for s in g.steps if s.kind == "decode") for g in (gen, thin))
    planes = sum(r.nbytes for r in d.program.regions if r.kind == "input"
                 and r.name.endswith(("#hi", "#lo")))
    assert wide_step.context == thin_step.context and wide_step.read_kv == planes
    # the roofline's must-read counts two bytes a code, never more than the step reads
    slots = wide_step.bucket[1] + 1
    assert model.dram_kv_bytes(slots) == 2 * narrow.dram_kv_bytes(slots) <= planes
    assert thin_step.read_kv < planes <= 2 * thin_step.read_kv


def test_q_on_int16_runs_its_rotary_embedding_and_qk_on_the_dsa():
    """Q on an int16 grid (q_proj's output, its head split, its rotary chain; not an option
    yet, a study's widening): the rotary embedding reads and writes int16 (zero point 0),
    QK^T runs on Q's byte planes, every step stays one region per chunk and bit-exact."""
    import re

    from dsa_tvm.layers.ir import Rope
    from dsa_tvm.llm.model import CompiledLLM
    from dsa_tvm.llm.source import TINY, Source, tiny_llama

    names = (r"blocks\.[0-9]+/q_proj/MatMul$", r"blocks\.[0-9]+/(Reshape|Transpose)$", "rope_q/")

    class WideQ(CompiledLLM):
        def quantize_options(self, step):
            opts = super().quantize_options(step)
            q = {o for n in step.graph.node if any(re.search(p, n.name) for p in names)
                 for o in n.output}
            return {**opts, "wide_tensors": set(opts["wide_tensors"]) | q}

    # head width 32: half a row is whole 16-lane blocks, so the rotary chain is the DSA's
    model = WideQ(Source(TINY, tiny_llama(0, heads=2, kv_heads=1), None), wide_qkv=False,
                  **BUCKETS)
    gen = model.generate(PROMPT, max_new_tokens=3)
    assert_steps_bit_exact(model, gen.ids[:1])
    regions = [d for crep in model.reports.values() for d in crep.regions]
    assert all(d.target == "dsa" for d in regions)
    ropes = [ly for d in regions for ly in d.region.layers if isinstance(ly, Rope)]
    wide = [ly for ly in ropes if ly.input.dtype == "int16"]
    # a decode step's Q in each layer (the names are the calibration step's, a decode one)
    assert len(wide) >= model.arch.layers and len(wide) <= len(ropes) // 2
    assert all(ly.output.dtype == "int16" and ly.input.zero_point == 0 for ly in wide)


def test_wide_qkv_prefill_keeps_the_attention_on_the_dsa_bit_exact():
    """A prefill chunk's K^T arrives transposed from the host as a region input; with K on
    int16 the host splits it into byte planes and lays each out as weight tiles
    (``lowering.cache_planes``). The match's codegen check asks the same of the region
    (``lowering.region.layers_supported``), so a joined length that is no whole number
    of blocks (15 new rows + 16 cached) keeps the attention's matmuls on the DSA: with two
    KV heads they once fell back to the CPU ("a weight tile row is not one input block's
    lanes in order"). Every launch bit-exact."""
    from dsa_tvm.llm.model import CompiledLLM
    from dsa_tvm.llm.source import TINY, Source, tiny_llama

    model = CompiledLLM(Source(TINY, tiny_llama(0, layers=1, hidden=128, heads=4, kv_heads=2,
                                                ffn=64), None),
                        wide_qkv=True, prefill_buckets=(15,), context_buckets=(16,))
    kv = model.new_cache()
    ids = model.token_ids((PROMPT + " ") * 2)[:16]
    model.run_step(ids[:1], kv)
    model.run_step(ids[1:], kv, "prefill")
    rep = model.reports[(15, 16)]
    assert not [line for line in str(rep).splitlines()
                if line.strip().startswith("CPU") and "relax.matmul" in line], str(rep)
    regions = {(rep.compile_id, d.name): d.region for d in rep.regions if d.target == "dsa"}
    assert model.last_launches
    for launch in model.last_launches:
        want = run_region(regions[launch.compile_id, launch.program.name], launch.inputs)
        for name, got in launch.outputs.items():
            np.testing.assert_array_equal(got, want[name])
