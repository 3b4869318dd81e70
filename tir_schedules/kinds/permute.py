"""Room: reshape and transpose inside a region (``Permute`` layers), DMA only.

Both tensors live in the blocked layout (``dsa_tvm.layers.layouts``): a row per pixel
of an NCHW image or per row of a ``(..., K)`` matrix, ``ceil(C / block)`` blocks of
``block`` lanes each. A movement is a copy of whole blocks when every output element
keeps its lane inside its block and every output block is one input block with the
same valid lanes: the head split ``(B*S, H*D) -> (B*H, S, D)`` with ``D`` a multiple of
the block, the merge back, a transpose of the row axes (``(B,S,H,D) -> (B,H,S,D)`` seen
as rows of ``D``), the flatten of an NCHW image to rows ``(N*H*W, C)``. The room works
out the block map once (``block_map``), cuts it into runs of consecutive source blocks
and emits each group of equal runs at a constant source stride as one strided LOAD and
one contiguous STORE through the accumulator scratchpad. A movement that moves lanes
(the K transpose of ``Q K^T`` with ``K`` rows of head width, a reshape that splits a
block) has no DMA form: the layer is unsupported and the region stays on the CPU with
the reason.

A :class:`TilesAppend` (a KV cache's concat and its weight-tiles movement, made one by
``lowering.cache_tiles``) is the same movement over the new rows alone, each tile stored
where it goes among the cache's tiles the host laid out (``PermShape.dest``).

Cost: DMA bytes at the DRAM bandwidth plus one latency per transfer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from dsa_tvm.hw.config import HardwareConfig
from dsa_tvm.intmath import ceil_div
from dsa_tvm.isa.instructions import AluOp, Buffer
from dsa_tvm.layers.checks import inputs_read, tensor_bytes, with_weights
from dsa_tvm.layers.host_pack import COLSUM, batch_dims, weight_tiles
from dsa_tvm.layers.ir import Permute, TilesAppend
from dsa_tvm.layers.layouts import image_dims

from ..tiling import chunks
from ..vector_unit import MAX_DMA, staged_rows_knobs
from .base import Kind, Recipe, UnsupportedLayer


@dataclass(frozen=True)
class PermShape:
    """``runs``: the output's blocks in order as (first source block, run length) pieces
    of consecutive source blocks; ``blocks``: the output's block count."""

    blocks: int
    block: int
    runs: tuple[tuple[int, int], ...]
    transpose_tiles: int = 0  # weight tiles the MAC array then transposes (identity GEMM)
    sum_groups: int = 0       # weight tiles: (batch, column block) groups to sum, or 0
    sum_tiles: int = 0        # tiles per group (K blocks)
    sum_lanes: int = 0        # valid lanes of a group's last tile (K's remainder)
    column_sums: int = 0      # the factor the sums are multiplied by (-zp_a)
    #: a TilesAppend's: the output tile each made tile goes to (empty: tile i to tile i)
    dest: tuple[int, ...] = ()
    wide: bool = False        # int16 codes (ACC16 transfers, two bytes a lane)


@dataclass(frozen=True)
class PermKnobs:
    rows: int                 # accumulator rows one transfer stages


def _blocks(shape: tuple[int, ...], block: int) -> tuple[np.ndarray, np.ndarray]:
    """(block index, lane) of every element of ``shape`` in row-major order."""
    n, c, h, w = image_dims(tuple(shape))
    size = n * c * h * w
    if len(shape) == 4:
        nn, cc, hh, ww = np.unravel_index(np.arange(size), (n, c, h, w))
        row = (nn * h + hh) * w + ww
    else:
        row, cc = np.divmod(np.arange(size), c)
    return row * ceil_div(c, block) + cc // block, cc % block


def block_map(layer: Permute, block: int) -> np.ndarray | str:
    """Source block of every output block, or why the movement is no block copy."""
    src = _sources(layer)
    if isinstance(src, str):
        return src
    return _block_map(tuple(layer.input.shape), src, tuple(layer.output.shape), block)


def _sources(layer: Permute) -> np.ndarray | str:
    """The input element of every output element, in output order."""
    x, y = tuple(layer.input.shape), tuple(layer.output.shape)
    size = int(np.prod(x))
    for view, perm in layer.steps():
        if int(np.prod(view)) != size or sorted(perm) != list(range(len(view))):
            return f"view {view} / perm {perm} do not fit the input {x}"
    if int(np.prod(y)) != size:
        return f"the output {y} does not hold the input's {size} elements"
    return layer.apply(np.arange(size)).reshape(-1)


def _block_map(x: tuple[int, ...], src: np.ndarray, y: tuple[int, ...],
               block: int) -> np.ndarray | str:
    bx, lx = _blocks(x, block)
    by, ly = _blocks(y, block)
    if not np.array_equal(lx[src], ly):
        return (f"{x} -> {y} moves elements between lanes (the DSA moves whole {block}-lane "
                f"blocks; only the row axes may be permuted or regrouped)")
    nby = int(by.max()) + 1 if by.size else 0
    bm = np.full(nby, -1, np.int64)
    bm[by] = bx[src]
    if not np.array_equal(bm[by], bx[src]):
        return f"{x} -> {y} mixes input blocks in one output block"
    if not np.array_equal(np.bincount(by, minlength=nby),
                          np.bincount(bx, minlength=int(bx.max()) + 1)[bm]):
        return f"{x} -> {y} changes a block's valid lanes (a partial channel block)"
    return bm


def tiles_map(layer: Permute, cfg: HardwareConfig) -> tuple[np.ndarray, int] | str:
    """A ``weight_tiles`` movement as (block map, tiles to transpose): the output ``b``
    (B, K, N) goes to DRAM as the weight tiles ``[B][NB][KB][block_out][block_in]`` of
    ``host_pack.weight_tiles``, each tile row a block. When those rows are blocks of the
    input (``K^T`` from ``K`` rows: the tile rows are K's rows), one block copy makes them
    (0 tiles to transpose); when they are its columns (``V`` from ``V`` rows) the copy
    makes the transposed tiles and the MAC array transposes each one (identity rows
    times the tile).

    A partial last tile (K or N not a multiple of the block, a sequence of 65) has whole
    rows of padding: they are filled with any source block, since what they hold cannot
    reach a result (padded K lanes meet the first operand's zero padding, its zero point
    being 0; padded N lanes get multiplier 0 in the output stage)."""
    src = _sources(layer)
    if isinstance(src, str):
        return src
    bi, bo = cfg.block_in, cfg.block_out
    if bi != bo:
        return f"block_in {bi} != block_out {bo} (a weight tile row is no activation block)"
    bt, k, n = batch_dims(tuple(layer.output.shape))
    order = weight_tiles((src + 1).reshape(bt, k, n), bi, bo)  # 0: padding
    made = _tiles_from(order.reshape(-1, bo, bi), tuple(layer.input.shape), bo)
    return made if not isinstance(made, str) else \
        f"weight tiles of {tuple(layer.output.shape)}: {made}"


def _tiles_from(order: np.ndarray, x: tuple[int, ...], block: int) -> tuple[np.ndarray, int] | str:
    """(block map, tiles to transpose) that make the tiles ``order`` ([tile][row][lane]:
    source element + 1, 0 padding) from a tensor of shape ``x``: a block copy of their rows,
    or of their columns and then a transpose of each tile."""
    direct = _padded_block_map(x, order.reshape(-1, block), block)
    if not isinstance(direct, str):
        return direct, 0
    flipped = _padded_block_map(x, np.ascontiguousarray(order.swapaxes(-1, -2))
                                .reshape(-1, block), block)
    return direct if isinstance(flipped, str) else (flipped, int(order.shape[0]))


def append_map(layer: TilesAppend, cfg: HardwareConfig) -> tuple[np.ndarray, int, np.ndarray] | str:
    """A :class:`TilesAppend` as (block map, tiles to transpose, the joined tile each made
    tile is): the tiles of the joined operand that hold new rows, made from the new rows
    alone. Each must hold no cache row (the host writes those tiles): the cache's length
    along the joined tile axis must be a multiple of the block."""
    bi, bo = cfg.block_in, cfg.block_out
    if bi != bo:
        return f"block_in {bi} != block_out {bo} (a weight tile row is no activation block)"
    nc, nn = (int(np.prod(t.shape, dtype=np.int64)) for t in (layer.cache, layer.input))
    c, x, a = tuple(layer.cache.shape), tuple(layer.input.shape), layer.axis
    if len(c) != len(x) or not 0 <= a < len(c) or c[:a] + c[a + 1:] != x[:a] + x[a + 1:] \
            or c[:a] + (c[a] + x[a],) + c[a + 1:] != tuple(layer.joined):
        return f"the cache {c} and new rows {x} do not join along axis {a} into {layer.joined}"
    try:
        labels = layer.apply(np.arange(1, nc + 1), -np.arange(1, nn + 1))  # 0 stays padding
    except ValueError as e:
        return f"the cache {layer.cache.shape} and new rows {layer.input.shape} do not join: {e}"
    bt, k, n = batch_dims(tuple(layer.output.shape))
    tiles = weight_tiles(labels.reshape(bt, k, n), bi, bo).reshape(-1, bo, bi)
    new, old = (tiles < 0).any(axis=(1, 2)), (tiles > 0).any(axis=(1, 2))
    if (new & old).any():
        return (f"a weight tile of {tuple(layer.output.shape)} holds both cache and new rows "
                f"(the cache's {layer.cache.shape[layer.axis]} rows are not whole {bo}-row "
                f"tiles)")
    dest = np.flatnonzero(new)
    made = _tiles_from(np.where(tiles[dest] < 0, -tiles[dest], 0), tuple(layer.input.shape), bo)
    if isinstance(made, str):
        return f"the new rows' tiles: {made}"
    return made[0], made[1], dest


def _padded_block_map(x: tuple[int, ...], rows: np.ndarray, block: int) -> np.ndarray | str:
    """Source block of every output row of ``rows`` (source element + 1, 0 = padding):
    rows of padding only take the next source block (their bytes do not matter)."""
    bx, lx = _blocks(x, block)
    pad = rows == 0
    whole = pad.all(axis=1)
    if (pad & ~whole[:, None]).any():
        return "a weight tile row is partly padding (a lane axis not a multiple of the block)"
    s = rows[~whole] - 1
    if not np.array_equal(lx[s], np.broadcast_to(np.arange(block), s.shape)):
        return (f"{x}: a weight tile row is not one input block's lanes in order (the DSA "
                f"moves whole {block}-lane blocks)")
    blocks = bx[s]
    if not (blocks == blocks[:, :1]).all():
        return f"{x}: a weight tile row mixes input blocks"
    if np.bincount(bx)[blocks[:, 0]].min() != block:
        return f"{x}: a weight tile row reads a partial input block"
    bm = np.zeros(len(rows), np.int64)
    bm[~whole] = blocks[:, 0]
    top = int(bx.max())
    # padding: continue the run (any block will do), from block 0 again past the last one,
    # so padding rows stay runs of consecutive blocks (one transfer each run), not one
    # transfer a row of the last block (a decode step's new V tiles: 15 of 16 rows)
    for j in np.flatnonzero(whole):
        bm[j] = bm[j - 1] + 1 if j and bm[j - 1] < top else 0
    return bm


def _runs(bm: np.ndarray) -> tuple[tuple[int, int], ...]:
    cut = np.flatnonzero(np.diff(bm) != 1) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [bm.size]])
    return tuple((int(bm[s]), int(e - s)) for s, e in zip(starts, ends))


def _transfers(s: PermShape, k: PermKnobs) -> list[tuple[int, int, int, int, int]]:
    """(source block, source stride, runs, run length, output block) per transfer."""
    cap = max(1, k.rows // 2 if k.rows >= 2 else k.rows)
    pieces: list[tuple[int, int]] = []
    for x0, n in s.runs:  # runs longer than the staging area, or a DMA row, in pieces
        step = min(cap, MAX_DMA)
        pieces += [(x0 + i, m) for i, m in chunks(n, step)]
    out, y0, i = [], 0, 0
    while i < len(pieces):
        x0, n = pieces[i]
        g, d = 1, n
        if i + 1 < len(pieces) and pieces[i + 1][1] == n:
            d = pieces[i + 1][0] - x0
            if n <= d <= MAX_DMA:
                while (i + g < len(pieces) and pieces[i + g] == (x0 + g * d, n)
                       and (g + 1) * n <= cap and g < MAX_DMA):
                    g += 1
            else:
                d = n
        out.append((x0, d, g, n, y0))
        y0 += g * n
        i += g
    return out


def perm_fits(cfg: HardwareConfig, s: PermShape, k: PermKnobs) -> str | None:
    if k.rows > cfg.acc_depth or k.rows < 1:
        return f"{k.rows} staged rows do not fit the {cfg.acc_depth}-row accumulator"
    return None


candidate_perm_knobs, default_perm_knobs = staged_rows_knobs(PermKnobs, perm_fits)


def _placed(transfers: list, s: PermShape) -> list:
    """Transfers whose output blocks go to ``s.dest``'s tiles: each cut where its blocks
    stop being consecutive there (a run lies within one tile, :func:`_tile_runs`)."""
    rows = s.block  # a tile's rows, each one block

    def at(y: int) -> int:
        return s.dest[y // rows] * rows + y % rows

    out = []
    for x0, d, g, n, y0 in transfers:
        first = 0
        for p in range(1, g + 1):
            if p == g or at(y0 + p * n) != at(y0 + (p - 1) * n) + n:
                out.append((x0 + first * d, d, p - first, n, at(y0 + first * n)))
                first = p
    return out


def _tile_runs(runs: tuple[tuple[int, int], ...], rows: int) -> tuple[tuple[int, int], ...]:
    """``runs`` cut at every ``rows``-th output block (a tile's last row)."""
    out, y = [], 0
    for x0, n in runs:
        while n:
            m = min(n, rows - y % rows)
            out.append((x0, m))
            x0, n, y = x0 + m, n - m, y + m
    return tuple(out)


def _ring(s: PermShape, k: PermKnobs) -> tuple[list, int, int]:
    """(the transfers, the staging slot's rows: the largest transfer, slots in the ring)."""
    transfers = _transfers(s, k)
    if s.dest and not s.transpose_tiles:   # the copy writes the tiles where they go
        transfers = _placed(transfers, s)
    slot = max((g * n for _, _, g, n, _ in transfers), default=1)
    return transfers, slot, max(1, k.rows // slot)


def estimate_perm_cycles(cfg: HardwareConfig, s: PermShape, k: PermKnobs) -> float:
    """Every byte in and out at the DRAM bandwidth, a load's and a store's latency per
    ring of in-flight transfers (:func:`emit_perm`); a tile transpose adds its tiles'
    loads and stores or GEMM rows, whichever is longer, and two latencies per ring of
    tiles (:func:`transpose_ring`)."""
    bw, lat = cfg.bandwidth_bytes_per_cycle, cfg.latency_cycles
    transfers, _, slots = _ring(s, k)
    rings = ceil_div(len(transfers), slots)
    lane = 2 if s.wide else 1
    dma = sum(2 * g * n * s.block * lane / bw for _, _, g, n, _ in transfers) + rings * 2 * lat
    tile = max(cfg.wgt_tile_bytes / bw + s.block * s.block / bw, s.block)
    flips = (s.transpose_tiles * tile + _chunks(cfg, s) * (cfg.gemm_fill_drain_cycles + 2 * lat)
             if s.transpose_tiles else 0)
    sums = s.sum_groups * (s.sum_tiles * (cfg.wgt_tile_bytes / bw + lat + 1
                                          + cfg.gemm_fill_drain_cycles)
                           + cfg.alu_latency_cycles + 4 * s.block / bw + lat)
    return dma + flips + sums


def perm_instructions(cfg: HardwareConfig, s: PermShape, k: PermKnobs) -> int:
    flips = (1 + 2 * _chunks(cfg, s) + s.transpose_tiles) if s.transpose_tiles else 0
    return (2 * len(_ring(s, k)[0]) + flips
            + (2 + s.sum_groups * (2 + 2 * s.sum_tiles) if s.sum_groups else 0))


def emit_perm(b, cfg: HardwareConfig, s: PermShape, k: PermKnobs, regions: dict) -> None:
    """One strided LOAD and one STORE per transfer. The loads run on the load engine
    (prefetched) into a ring of staging slots as large as the largest transfer, so up to
    ``rows / slot`` transfers are in flight: their DRAM latencies overlap instead of
    adding up (a head split is dozens of short transfers)."""
    buf = Buffer.ACC16 if s.wide else Buffer.ACC8
    x, y = regions["x"], regions["y"]
    dst = regions["t"] if s.transpose_tiles else y
    transfers, slot, slots = _ring(s, k)
    for i, (x0, d, g, n, y0) in enumerate(transfers):
        base = (i % slots) * slot
        b.load(buf, base, b.addr(x, buf) + x0, g, n, d, prefetch=True)
        b.store(buf, base, b.addr(dst, buf) + y0, 1, g * n, g * n)
    if s.transpose_tiles:
        _emit_tile_transpose(b, s, regions)
    if s.sum_groups:
        _emit_column_sums(b, s, regions)


#: tiles a transpose keeps in flight: two halves of its ring of weight slots and
#: accumulator tiles alternate, one transposing while the other loads and stores
TRANSPOSE_RING = 16


def transpose_ring(cfg: HardwareConfig, s: PermShape) -> int:
    """Weight slots and accumulator tiles a tile transpose rotates through: up to
    :data:`TRANSPOSE_RING`, leaving two accumulator rows for the column sums after it."""
    room = min(cfg.wgt_depth, (cfg.acc_depth - 2) // s.block)
    return max(1, min(TRANSPOSE_RING, s.transpose_tiles, room))


def _chunks(cfg: HardwareConfig, s: PermShape) -> int:
    """LOAD + GEMM pairs of a tile transpose: half its ring of tiles each."""
    return ceil_div(s.transpose_tiles, max(1, transpose_ring(cfg, s) // 2))


def _emit_tile_transpose(b, s: PermShape, regions: dict) -> None:
    """Each staged tile W through the array against identity rows: acc[m][o] = W[o][m],
    the tile transposed. The tiles go in chunks of half the ring
    (:func:`transpose_ring`): one LOAD and one GEMM a chunk (the array's fill and drain
    paid once), the two halves alternating so a chunk's transfers overlap the next
    one's GEMM instead of each tile paying a DRAM latency in turn."""
    n = s.block
    t, y = regions["t"], regions["y"]
    ring = transpose_ring(b.cfg, s)
    half = max(1, ring // 2)
    b.load(Buffer.INP, 0, b.addr(regions["eye"], Buffer.INP), 1, n, n)
    for c, i0 in enumerate(range(0, s.transpose_tiles, half)):
        cnt = min(half, s.transpose_tiles - i0)
        slot = (c % 2) * half if ring > 1 else 0
        b.load(Buffer.WGT, slot, b.addr(t, Buffer.WGT) + i0, 1, cnt, cnt)
        b.gemm(slot * n, 0, slot, [(cnt, n, 0, 1), (n, 1, 1, 0)], reset=True)
        for j in range(cnt):
            b.store(Buffer.ACC8, (slot + j) * n, b.addr(y, Buffer.ACC8) + _tile(s, i0 + j) * n,
                    1, n, n)


def _tile(s: PermShape, i: int) -> int:
    """Where made tile ``i`` goes in the output."""
    return s.dest[i] if s.dest else i


def _emit_column_sums(b, s: PermShape, regions: dict) -> None:
    """Per (batch, column block): a ones row through the array against its K tiles (the
    last one's padded lanes left out: they hold whatever the padding rows were filled
    with), times ``column_sums``, stored as one int32 row."""
    n = s.block
    # after the transpose's identity rows and its ring of accumulator tiles
    ones, acc0 = n, (transpose_ring(b.cfg, s) if s.transpose_tiles else 2) * n
    b.load(Buffer.INP, ones, b.addr(regions["ones"], Buffer.INP), 1, 2, 2)
    y, c = regions["y"], regions["c"]
    for g in range(s.sum_groups):
        acc = acc0 + g % 2
        for j in range(s.sum_tiles):
            t = g * s.sum_tiles + j
            last = j == s.sum_tiles - 1 and s.sum_lanes < n
            b.load(Buffer.WGT, t % 2, b.addr(y, Buffer.WGT) + _tile(s, t), 1, 1, 1)
            b.gemm(acc, ones + last, t % 2, [(1, 0, 0, 0)], reset=j == 0)
        b.alu(AluOp.MUL, acc, acc, 0, [(1, 0, 0, 0)], imm=s.column_sums, use_imm=True)
        b.store(Buffer.ACC, acc, b.addr(c, Buffer.ACC) + _tile(s, g * s.sum_tiles)
                // s.sum_tiles, 1, 1, 1)


def permute_recipe(layer: Permute | TilesAppend, cfg: HardwareConfig, consts: bool) -> Recipe:
    grids = {(t.scale, t.zero_point) for t in (layer.input, layer.output)
             + ((layer.cache,) if isinstance(layer, TilesAppend) else ())}
    if len(grids) > 1:
        raise UnsupportedLayer(f"{layer.name}: input and output scale/zero point differ "
                               f"(a copy needs one grid)")
    if isinstance(layer, TilesAppend):
        return _append_recipe(layer, cfg)
    dtypes = {layer.input.dtype, layer.output.dtype}
    if dtypes - {"int8", "int16"} or len(dtypes) > 1:
        raise UnsupportedLayer(f"{layer.name}: a copy of {layer.input.dtype} codes into "
                               f"{layer.output.dtype} (it moves int8 or int16 codes as they are)")
    if not layer.weight_tiles:
        bm = block_map(layer, cfg.block_out)
        if isinstance(bm, str):
            raise UnsupportedLayer(f"{layer.name}: {bm}")
        return Recipe(KIND, PermShape(int(bm.size), cfg.block_out, _runs(bm),
                                      wide=layer.input.dtype == "int16"), {"x": layer.input})
    if layer.input.dtype != "int8":
        raise UnsupportedLayer(f"{layer.name}: weight tiles hold int8 codes; "
                               f"{layer.input.name} is {layer.input.dtype}")
    tm = tiles_map(layer, cfg)
    if isinstance(tm, str):
        raise UnsupportedLayer(f"{layer.name}: {tm}")
    bm, flips = tm
    if flips and cfg.acc_depth < 2 * cfg.block_out:
        raise UnsupportedLayer(f"{layer.name}: a tile transpose needs two accumulator tiles")
    r = Recipe(KIND, PermShape(int(bm.size), cfg.block_out, _runs(bm), flips), {"x": layer.input})
    if flips:
        r.consts["eye"] = np.eye(cfg.block_in, dtype=np.int8)
        r.scratch["t"] = (int(bm.size), cfg.block_in)
    if layer.column_sums:  # the consumer matmul's correction for its first zero point
        bt, k, n = batch_dims(tuple(layer.output.shape))
        _column_sums(r, layer, cfg, bt * ceil_div(n, cfg.block_out))
    return r


def _column_sums(r: Recipe, layer: Permute | TilesAppend, cfg: HardwareConfig,
                 groups: int) -> None:
    """``groups`` (batch, column block) column sums after the tiles."""
    k = batch_dims(tuple(layer.output.shape))[1]
    kb = ceil_div(k, cfg.block_in)
    lanes = k - (kb - 1) * cfg.block_in
    r.shape = dataclasses.replace(r.shape, sum_groups=groups, sum_tiles=kb, sum_lanes=lanes,
                                  column_sums=int(layer.column_sums))
    ones = np.ones((2, cfg.block_in), np.int8)
    ones[1, lanes:] = 0
    r.consts["ones"] = ones
    r.host["c"] = layer.output.name + COLSUM


def _append_recipe(layer: TilesAppend, cfg: HardwareConfig) -> Recipe:
    """The new rows' tiles, written where they go among the host's cache tiles."""
    wide = [t.name for t in (layer.cache, layer.input, layer.output) if t.dtype != "int8"]
    if wide:
        raise UnsupportedLayer(f"{layer.name}: weight tiles hold int8 codes; {', '.join(wide)} "
                               f"are wider")
    am = append_map(layer, cfg)
    if isinstance(am, str):
        raise UnsupportedLayer(f"{layer.name}: {am}")
    bm, flips, dest = am
    if flips and cfg.acc_depth < 2 * cfg.block_out:
        raise UnsupportedLayer(f"{layer.name}: a tile transpose needs two accumulator tiles")
    runs = _runs(bm) if flips else _tile_runs(_runs(bm), cfg.block_out)
    r = Recipe(KIND, PermShape(int(bm.size), cfg.block_out, runs, flips,
                               dest=tuple(int(d) for d in dest)), {"x": layer.input})
    if flips:
        r.consts["eye"] = np.eye(cfg.block_in, dtype=np.int8)
        r.scratch["t"] = (int(bm.size), cfg.block_in)
    if layer.column_sums:
        kb = ceil_div(batch_dims(tuple(layer.output.shape))[1], cfg.block_in)
        groups = np.unique(dest // kb)   # the new tiles must be these columns' whole tiles
        if not np.array_equal(dest, (groups[:, None] * kb + np.arange(kb)).reshape(-1)):
            raise UnsupportedLayer(f"{layer.name}: the new rows fill part of a column's tiles "
                                   f"(its column sums would need the cache's tiles too)")
        _column_sums(r, layer, cfg, int(groups.size))
    return r


def run_permute(ly: Permute | TilesAppend, env: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(ly, TilesAppend):
        return ly.apply(env[ly.cache.name], env[ly.input.name])
    return ly.apply(env[ly.input.name].reshape(ly.input.shape))


def _describe(ly: Permute | TilesAppend) -> str:
    if isinstance(ly, TilesAppend):
        return (f"TilesAppend {ly.name}: {tuple(ly.input.shape)} into the tiles of "
                f"{tuple(ly.output.shape)} (cache {ly.cache.name} in place)")
    return (f"Permute {ly.name}: {tuple(ly.input.shape)} view {ly.view} perm {ly.perm} -> "
            f"{tuple(ly.output.shape)}")


def _bounds(ly: Permute | TilesAppend) -> tuple[int, int]:
    if isinstance(ly, TilesAppend):   # the host placed the cache: the new rows, in and out
        new = tensor_bytes(ly.input)
        return new, new
    return with_weights(ly, inputs_read(ly))


KIND = Kind(
    name="permute", layers=(Permute, TilesAppend), recipe=permute_recipe, reference=run_permute,
    bounds=_bounds, describe=_describe, shape=PermShape, knobs=PermKnobs,
    fits=perm_fits, candidates=candidate_perm_knobs, default=default_perm_knobs,
    estimate=estimate_perm_cycles, instructions=perm_instructions,
    tiles=lambda s: {}, extents=lambda s: {},
    fill=lambda cfg, s, k: [0.0, 0.0, k.rows / cfg.acc_depth],
    emit=emit_perm)
