"""Compile a Region (integer layers) into one DSA program.

Every tensor of the region gets a DRAM region in the DSA's blocked layout:
the region's inputs and outputs (the runtime packs and unpacks them), its
intermediates (scratch), and each layer's constants (weights, output-stage
table). Each layer becomes TIR, is scheduled (default knobs, or tuned ones)
and walked into instructions; the dependency tokens of the whole program are
derived at the end. Consecutive layers take disjoint scratchpad rows where both fit
(:func:`_walk_placed`), so the next layer's weights and tables load while this one
computes. What each layer kind needs is its room's recipe
(``tir_schedules.kinds``); :func:`lowering_supports` answers from the same
recipes, so the partitioner keeps on the CPU exactly the layers this module
cannot lower.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tir_schedules.kinds import UnsupportedLayer, layer_bounds, recipe
from tir_schedules.lower import lower_for_walker
from tir_schedules.nests import CodegenError
from tir_schedules.options import current_options

from ..codegen.walker import TirWalker
from ..gc_pause import paused_gc
from ..hw.config import HardwareConfig
from ..intmath import ceil_div
from ..isa.builder import ProgramBuilder
from ..isa.instructions import Sync
from ..isa.program import Program
from ..isa.sync import insert_dependencies
from ..layers.checks import weight_bytes
from ..layers.host_pack import COLSUM, PARAMS, PLANES, ROWSUM, batch_dims
from ..layers.ir import BatchMatmul, Layer, Permute, QTensor, Region, TilesAppend, layer_inputs
from ..layers.layouts import blocked_shape, same_bytes
from ..layers.rope_tables import IO_KEY as ROPE_TABLE
from ..layers.rope_tables import io_entries as rope_table_entries
from .cache_planes import cache_planes
from .cache_tiles import cache_appends
from .cache_tiles import io_entry as append_io_entry
from .fold_input import fold_region_inputs
from .host_tiles import host_tiled_inputs, io_entry, without_movements
from .int4_weights import pack_int4_weights
from .program_cache import PROGRAMS, WALKS, cache_enabled, content_key, lowering_view, restamp
from .sparse_weights import pack_sparse_weights

__all__ = ["CompiledRegion", "LayerPlan", "UnsupportedLayer", "compile_region",
           "lowering_supports"]


@dataclass
class LayerPlan:
    """What the codegen decided for one layer: its TIR shape and schedule knobs."""

    layer: Layer
    shape: object
    knobs: object
    seconds: float = 0.0


@dataclass
class CompiledRegion:
    program: Program
    plans: list[LayerPlan] = field(default_factory=list)


def lowering_supports(layer: Layer, cfg: HardwareConfig) -> str | None:
    """None if :func:`compile_region` can lower ``layer`` for ``cfg``, else why not.

    Cheap (no TIR is built): the layer's recipe, and at least one schedule whose
    tiles fit the scratchpads. A tuple (what a kind that makes several layers returns)
    is supported when each of its layers is."""
    if isinstance(layer, tuple):
        return next((why for why in (lowering_supports(ly, cfg) for ly in layer) if why), None)
    try:
        r = recipe(layer, cfg, consts=False)
    except UnsupportedLayer as e:
        return str(e)
    if not r.kind.candidates(cfg, r.shape):
        try:
            r.kind.default(cfg, r.shape)
        except ValueError as e:
            return str(e)
        return "no schedule fits the scratchpads"
    return None


def host_rewrites(region: Region, cfg: HardwareConfig
                  ) -> tuple[Region, dict[str, tuple[QTensor, QTensor]], dict[str, Permute]]:
    """``region`` after the rewrites that hand work to the host, with what they hand over:
    int16 inputs only byte-plane splits read, split by the host (``cache_planes``: input
    name -> its two planes); cache concats whose new tiles the region writes in place
    (``cache_appends``: ``TilesAppend`` layers); inputs the host lays out as weight tiles
    (``host_tiled_inputs``: input name -> the movement it does instead)."""
    region, planes = cache_planes(region)
    region = cache_appends(region, cfg)
    tiled = host_tiled_inputs(region)
    if tiled:
        region = without_movements(region, tiled)
    return region, planes, tiled


def layers_supported(layers: tuple[Layer, ...], inputs: list[QTensor], output: QTensor,
                     cfg: HardwareConfig) -> str | None:
    """None if a region of ``layers`` (reading ``inputs``, writing ``output``) lowers for
    ``cfg``, else why not: each layer after :func:`host_rewrites`, as
    :func:`compile_region` lowers them, so a movement the host does in their place is not
    asked of the device."""
    region, _, _ = host_rewrites(Region("check", list(inputs), [output], list(layers)), cfg)
    return next((why for why in (lowering_supports(ly, cfg) for ly in region.layers) if why),
                None)


KnobChooser = Callable[[HardwareConfig, object], object]


def compile_region(region: Region, cfg: HardwareConfig,
                   choose_knobs: KnobChooser | None = None) -> CompiledRegion:
    """One program for the whole region; ``choose_knobs(cfg, shape)`` overrides the
    default schedule of a layer (the tuner's database plugs in here; returning None
    keeps the default)."""
    _check_views(region)
    io = {t.name: {"shape": list(t.shape), "scale": t.scale, "zero_point": t.zero_point,
                   **({} if t.dtype == "int8" else {"dtype": t.dtype})}
          for t in region.inputs + region.outputs}   # as the runtime sees them, before folding
    inputs = [t.name for t in region.inputs]
    region, folded = fold_region_inputs(region, cfg)
    region, planes, tiled = host_rewrites(region, cfg)
    for name, pair in planes.items():   # split by the host: the planes are its inputs
        for t in pair:
            io[t.name] = {"shape": list(t.shape), "scale": t.scale, "zero_point": 0}
        io[name][PLANES] = {t.name: io[t.name] for t in pair}
    for name, note in rope_table_entries(region.layers).items():  # float, packed by the host
        io[name][ROPE_TABLE] = note
    for ly in region.layers:
        if isinstance(ly, TilesAppend):   # the host lays the cache out in the joined tiles
            io[ly.cache.name]["weight_tiles"] = append_io_entry(ly)
    for name, p in tiled.items():   # the host lays these inputs out as weight tiles
        io[name]["weight_tiles"] = io_entry(p)
    chosen = []
    for layer in region.layers:
        t0 = time.perf_counter()
        r = recipe(layer, cfg)
        knobs = choose_knobs(cfg, r.shape) if choose_knobs else None
        if knobs is None:
            try:
                knobs = r.kind.default(cfg, r.shape)
            except ValueError as e:
                raise UnsupportedLayer(f"{layer.name}: {e}") from None
        chosen.append((r, knobs, time.perf_counter() - t0))
    key = _cache_key((region, io, folded), chosen, cfg)
    hit = PROGRAMS.get(key) if key is not None else None
    if hit is not None:   # the key holds every schedule: the plans are this region's own
        return CompiledRegion(restamp(hit, cfg), [LayerPlan(ly, r.shape, knobs, seconds)
                                                  for ly, (r, knobs, seconds)
                                                  in zip(region.layers, chosen)])
    out = _compile_chosen(region, inputs, io, folded, chosen, cfg)
    if key is not None:   # the program alone: its layers (weights) go with their report
        PROGRAMS.put(key, out.program)
    return out


def _cache_key(made_of: tuple, chosen: list, cfg: HardwareConfig) -> tuple | None:
    """What the region's program is made of (program_cache); None when the cache is off or
    a tuner's knobs are not hashable."""
    if not cache_enabled():
        return None
    schedules = tuple((getattr(r.kind.build, "__module__", ""),
                       getattr(r.kind.build, "__qualname__", repr(r.kind.build)), r.shape, knobs)
                      for r, knobs, _ in chosen)
    try:
        hash(schedules)
    except TypeError:
        return None
    # the offload policy decides where a program runs, not what it is
    return (content_key(made_of), schedules, lowering_view(cfg),
            replace(current_options(), offload="faster"))


def _compile_chosen(region: Region, inputs: list[str], io: dict, folded: dict,
                    chosen: list, cfg: HardwareConfig) -> CompiledRegion:
    """The program of a (folded) region whose layers' recipes and knobs are chosen;
    ``inputs``: the tensors the runtime hands it (a cache's planes are the host's)."""
    block = cfg.block_in
    for name, spec in folded.items():
        io[name]["im2col"] = spec
    for name, spec in _matmul_operands(region).items():
        io[name].update(spec)
    b = ProgramBuilder(cfg, region.name)
    tensors: dict[str, object] = {}

    def dram(t: QTensor, kind: str):
        if t.name not in tensors:
            tensors[t.name] = b.region(t.name, kind, blocked_shape(t.shape, block), t.dtype)
        return tensors[t.name]

    bi, bo = cfg.block_in, cfg.block_out
    for t in region.inputs:
        if "weight_tiles" in io[t.name]:  # an on-device matmul's operand, tiled by the host
            spec = io[t.name]["weight_tiles"]
            bt, k, n = batch_dims(tuple(spec["shape"]))
            nb, kb = ceil_div(n, bo), ceil_div(k, bi)
            tensors[t.name] = tensors[spec["tiles"]] = b.region(
                t.name, "input", (bt, nb, kb, bo, bi), "int8")
            if spec["column_sums"]:
                tensors[spec["tiles"] + COLSUM] = b.region(t.name + COLSUM, "input",
                                                           (bt * nb, bo), "int32")
        elif ROPE_TABLE in io[t.name]:  # a float rotary table, as the room's int32 rows
            note = io[t.name][ROPE_TABLE]
            rows = note["positions"] * ceil_div(note["width"], bo)
            tensors[t.name] = b.region(t.name, "input", (rows, bo), "int32")
        elif "matmul_b" in io[t.name]:  # the host packs weight tiles and their table
            bt, k, n = batch_dims(t.shape)
            nb, kb = ceil_div(n, bo), ceil_div(k, bi)
            tensors[t.name] = b.region(t.name, "input", (bt, nb, kb, bo, bi), "int8")
            tensors[t.name + PARAMS] = b.region(t.name + PARAMS, "input", (bt, nb, 3, bo),
                                                "int32")
        else:
            dram(t, "input")
        if "matmul_a" in io[t.name]:
            bt, m, _ = batch_dims(t.shape)
            tensors[t.name + ROWSUM] = b.region(t.name + ROWSUM, "input", (bt * m, bo), "int32")
    for t in region.outputs:
        dram(t, "output")
    plans, layers_meta = [], []
    used: dict[str, tuple[int, int]] | None = None  # the previous layer's scratchpad rows
    for layer, (r, knobs, choice_s) in zip(region.layers, chosen):
        t0 = time.perf_counter() - choice_s
        if getattr(layer, "weight_tiles", False) and layer.output.name not in tensors:
            bt, k, n = batch_dims(layer.output.shape)   # an on-device matmul's weight tiles
            tensors[layer.output.name] = b.region(
                layer.output.name, "scratch", (bt, ceil_div(n, bo), ceil_div(k, bi), bo, bi),
                "int8")
            if layer.column_sums:  # written by the movement, read by the matmul
                name = layer.output.name + COLSUM
                tensors[name] = b.region(name, "scratch", (bt * ceil_div(n, bo), bo), "int32")
        regions = {}
        for name, data in r.consts.items():
            regions[name] = b.region(f"{layer.name}.{name}", "const", data.shape,
                                     data.dtype.name, data=data)
        for name, shape in r.scratch.items():
            regions[name] = b.region(f"{layer.name}.{name}", "scratch", shape, "int8")
        for name, t in r.inputs.items():
            regions[name] = dram(t, "scratch")
        for name, region_name in r.host.items():
            regions[name] = tensors[region_name]
        regions["y"] = dram(layer.output, "scratch")
        first = len(b.instructions)
        if r.kind.emit is not None:  # a data-movement room emits its DMA itself
            r.kind.emit(b, cfg, r.shape, knobs, regions)
            used = None
        else:
            used = _walk_cached(b, cfg, r, knobs, regions, used)
        layers_meta.append({"name": layer.name, "op": type(layer).__name__, "first": first,
                            "last": len(b.instructions) - 1, "macs": layer.macs,
                            **dict(zip(("min_read_bytes", "min_write_bytes"),
                                       layer_bounds(layer))),
                            "weight_bytes": weight_bytes(layer),
                            "input_zp": int(getattr(getattr(layer, "input", None),
                                                    "zero_point", 0)),
                            "knobs": dict(knobs.__dict__)})
        plans.append(LayerPlan(layer, r.shape, knobs, time.perf_counter() - t0))
    b.finish()
    made_by_host = {t.name for t in region.inputs} - set(inputs)   # noted under their source
    with paused_gc():
        b.instructions = insert_dependencies(b.instructions, cfg)
        prog = b.build()
    _renumber_layers(prog, layers_meta)
    prog.meta.update(
        kind="region", layers=layers_meta, hardware=cfg.as_dict(),
        io={k: v for k, v in io.items() if k not in made_by_host},
        inputs=inputs, outputs=[t.name for t in region.outputs])
    pack_sparse_weights(prog, cfg)
    pack_int4_weights(prog, cfg)
    return CompiledRegion(prog, plans)


def _walk_cached(b: ProgramBuilder, cfg: HardwareConfig, r, knobs, regions: dict,
                 prev: dict[str, tuple[int, int]] | None) -> dict[str, tuple[int, int]]:
    """:func:`_walk_placed`, or the instructions the same walk gave before: a layer's
    instructions are a function of its lowered TIR (kind, shape, knobs, the description as
    the code generator sees it), the DRAM regions it reads and writes (where they are) and
    the scratchpad rows the previous layer left it (``prev``)."""
    key, func = _lowered(r, cfg, knobs, lower_for_walker)
    if key is not None and cache_enabled():
        key = (key, tuple(sorted((k, v.name, v.offset, v.dtype, tuple(v.shape))
                                 for k, v in regions.items())),
               tuple(sorted(prev.items())) if prev else None)
        hit = WALKS.get(key)
        if hit is not None:
            b.instructions.extend(hit[0])
            return dict(hit[1])
    else:
        key = None
    first = len(b.instructions)
    used = _walk_placed(b, cfg, func, regions, prev)
    if key is not None:
        WALKS.put(key, (tuple(b.instructions[first:]), dict(used)))
    return used


def _walk_placed(b: ProgramBuilder, cfg: HardwareConfig, func, regions: dict,
                 prev: dict[str, tuple[int, int]] | None) -> dict[str, tuple[int, int]]:
    """Walk a layer's TIR into ``b`` with its tile buffers in rows the previous layer did
    not use where they fit: just above them, else (per scratchpad) below them or against
    the top of the scratchpad, else from row 0; the rows it used.

    Dependency tokens follow scratchpad footprints, so a layer whose buffers share rows
    with the previous layer's waits for it to finish with them: its first loads cannot
    overlap the previous layer's last tiles. Disjoint rows let them, and choosing them per
    scratchpad keeps identical layers placed alike wherever they sit in a network."""
    first = len(b.instructions)

    zero = {"inp": 0, "wgt": 0, "acc": 0}

    def walk(base: dict[str, int], may_fail: bool = True) -> dict[str, tuple[int, int]] | None:
        """The rows used from ``base``; None if the tiles do not fit there (``may_fail``:
        else the walker's error, naming the buffer, stands)."""
        walker = TirWalker(cfg, b, regions, base)
        try:
            with paused_gc():
                walker.run(func)
        except CodegenError:
            if not may_fail:
                raise
            del b.instructions[first:]
            return None
        return {s: (base[s], walker.peak[s]) for s in base}

    if prev:
        used = walk({s: hi for s, (_, hi) in prev.items()})
        if used is not None:
            return used
    used = walk(zero, may_fail=False)
    if not prev:
        return used
    depth = {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "acc": cfg.acc_depth}
    base = {}
    for s, (lo, hi) in prev.items():
        need = used[s][1]
        top = depth[s] - need
        base[s] = 0 if need <= lo or top < hi else top  # below, else against the top
    if all(v == 0 for v in base.values()):
        return used
    del b.instructions[first:]
    return walk(base) or walk(zero, may_fail=False)


def _check_views(region: Region) -> None:
    """Every layer must see a tensor with one shape (the DRAM layout follows from it)."""
    shapes = {t.name: t.shape for t in region.inputs + region.outputs}
    for ly in region.layers:
        for t in layer_inputs(ly) + [ly.output]:
            seen = shapes.setdefault(t.name, t.shape)
            if not same_bytes(tuple(seen), tuple(t.shape)):
                raise UnsupportedLayer(f"{ly.name}: tensor '{t.name}' is {tuple(t.shape)} here "
                                       f"and {tuple(seen)} elsewhere in the region")


def _matmul_operands(region: Region) -> dict[str, dict]:
    """The host packing of batch-matmul operands (``host_pack``), as ``io`` entries.

    The host can only pack what it hands over: an operand computed inside the region
    makes the layer unsupported, as does a second operand other layers read too (it
    becomes weight tiles for this one)."""
    inputs = {t.name for t in region.inputs}
    readers = region.readers()
    out: dict[str, dict] = {}
    for ly in region.layers:
        if not isinstance(ly, BatchMatmul) or ly.on_device:
            continue
        for t in (ly.a, ly.b):
            if t.name not in inputs:
                raise UnsupportedLayer(f"{ly.name}: operand '{t.name}' is computed on the DSA; "
                                       f"batch matmul operands come from the host, which packs "
                                       f"them")
        if readers[ly.b.name] > 1 or ly.b.name in {t.name for t in region.outputs}:
            raise UnsupportedLayer(f"{ly.name}: second operand '{ly.b.name}' is read by other "
                                   f"layers too (it becomes this layer's weight tiles)")
        prev = out.get(ly.a.name, {}).get("matmul_a")
        if prev is not None and prev["b_zero_point"] != ly.b.zero_point:
            raise UnsupportedLayer(f"{ly.name}: '{ly.a.name}' is the first operand of two batch "
                                   f"matmuls with different zero points in the second")
        mult, shift = ly.requant.per_channel(ly.b.shape[-1])
        out.setdefault(ly.b.name, {})["matmul_b"] = {
            "a_zero_point": ly.a.zero_point, "multiplier": mult.tolist(),
            "shift": shift.tolist()}
        out.setdefault(ly.a.name, {})["matmul_a"] = {"b_zero_point": ly.b.zero_point}
    return out


#: (compute, schedule, shape, knobs, hardware) -> the scheduled and lowered PrimFunc.
#: Networks repeat layer shapes (ResNet stages); scheduling is deterministic and the
#: walker only reads the PrimFunc, so identical layers share one.
_LOWERED: dict[tuple, object] = {}
_MAX_LOWERED = 512


def _lowered(r, cfg: HardwareConfig, knobs, lower_for_walker) -> tuple[tuple | None, object]:
    """(key, lowered PrimFunc): the key names what the TIR is made of (None: not cacheable)."""
    try:
        key = (r.kind.build, r.kind.schedule, r.shape, knobs, lowering_view(cfg))
        hit = _LOWERED.get(key)
    except TypeError:  # unhashable knobs (a tuner's own type): no caching
        key, hit = None, None
    if hit is None:
        hit = lower_for_walker(r.kind.schedule(r.kind.build(r.shape), cfg, r.shape, knobs))
        if key is not None:
            if len(_LOWERED) >= _MAX_LOWERED:
                _LOWERED.clear()
            _LOWERED[key] = hit
    return key, hit


def _renumber_layers(prog: Program, layers_meta: list[dict]) -> None:
    """Map layer instruction ranges onto the program after relay SYNCs were inserted
    (a SYNC just before a layer's first instruction belongs to that layer)."""
    mapping = [i for i, ins in enumerate(prog.instructions) if not isinstance(ins, Sync)]
    for ly in layers_meta:
        ly["first"], ly["last"] = mapping[ly["first"]], mapping[ly["last"]]
        while ly["first"] > 0 and isinstance(prog.instructions[ly["first"] - 1], Sync):
            ly["first"] -= 1
