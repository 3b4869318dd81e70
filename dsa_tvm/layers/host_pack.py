"""What the host does to a region input before the DSA reads it.

Most inputs are packed into the blocked activation layout. Some layers read an
input in another form the compiler chose, recorded in the program's ``io``
table so the runtime repeats it exactly:

* ``im2col``: a few-channel conv's input as its window matrix (``fold_input``);
* ``matmul_b``: the second operand of a batch matmul as per-batch weight tiles,
  with the zero-point terms that depend on it in an output-stage table
  (``<name>#params``);
* ``matmul_a``: the first operand as activation rows plus one correction row per
  input row (``<name>#rowsum``): ``-zp_b * sum_k a``;
* ``rope_table``: a float rotary table (an LLM step's ``cos``/``sin``) as the ``rope``
  room's int32 fixed-point rows, its bound checked (``layers.rope_tables``);
* ``planes``: an int16 KV cache as its two int8 byte planes, each packed by its own note
  (``lowering.cache_planes``);
* ``weight_tiles``: an on-device matmul's second operand as its weight tiles, with the
  column sums ``column_sums * sum_k b`` (``<name>#colsum``) when the first operand has a
  zero point (what the region's movement would have made, ``lowering.host_tiles``); with
  ``append``, a KV cache padded to its concat's joined shape first (the region writes the
  new rows' tiles, ``lowering.cache_tiles``).

(see ``tir_schedules.kinds.matmul`` for the arithmetic).
"""

from __future__ import annotations

import numpy as np

from ..isa import semantics as sem
from .ir import moved
from .layouts import im2col, pack_activation, pack_conv_weights, pack_output_stage
from .reference import split_planes
from .rope_tables import IO_KEY as ROPE_TABLE
from .rope_tables import pack_table

PARAMS = "#params"
ROWSUM = "#rowsum"
#: an on-device matmul's column correction, made on the device (``-zp_a * sum_k b``)
COLSUM = "#colsum"
#: a ``weight_tiles`` note's entry for a KV cache padded to its concat's joined shape
APPEND = "append"
#: an int16 input's note: its byte planes' names (hi, then lo) and their own notes
PLANES = "planes"


def batch_dims(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(batch, rows, cols) of a matmul operand: leading dimensions flattened."""
    return int(np.prod(shape[:-2], dtype=np.int64)), int(shape[-2]), int(shape[-1])


def weight_tiles(b: np.ndarray, block_in: int, block_out: int) -> np.ndarray:
    """(..., K, N) int8 -> [batch][NB][KB][block_out][block_in] tiles, zero padded: per
    batch, the tiles of a dense layer whose weight is b transposed."""
    bt, k, n = batch_dims(b.shape)
    mats = b.reshape(bt, k, n)
    return np.stack([pack_conv_weights(np.ascontiguousarray(mats[t].T)[:, :, None, None],
                                       block_in, block_out)[:, 0, 0] for t in range(bt)])


def matmul_params(b: np.ndarray, spec: dict, block_out: int) -> np.ndarray:
    """[batch][NB][3][block_out]: bias ``-zp_a * sum_k b + K * zp_a * zp_b`` per batch and
    column, with the layer's multiplier and shift."""
    bt, k, n = batch_dims(b.shape)
    za, zb = int(spec["a_zero_point"]), int(spec["zero_point"])
    colsum = b.reshape(bt, k, n).astype(np.int64).sum(axis=1)
    bias = sem.wrap_int32(-za * colsum + k * za * zb)
    mult = np.asarray(spec["multiplier"], np.int32)
    shift = np.asarray(spec["shift"], np.int32)
    return np.stack([pack_output_stage(bias[t], mult, shift, block_out) for t in range(bt)])


def rowsum_rows(a: np.ndarray, b_zero_point: int, block_out: int) -> np.ndarray:
    """[batch * M][block_out] int32: ``-zp_b * sum_k a`` in every lane of the row."""
    bt, m, k = batch_dims(a.shape)
    r = sem.wrap_int32(-int(b_zero_point) * a.reshape(bt * m, k).astype(np.int64).sum(axis=1))
    return np.ascontiguousarray(np.repeat(r[:, None], block_out, axis=1).astype(np.int32))


def column_sum_rows(b: np.ndarray, factor: int, block_out: int) -> np.ndarray:
    """[batch * NB][block_out] int32: ``factor * sum_k b[k, n]`` per batch and column."""
    bt, k, n = batch_dims(b.shape)
    nb = -(-n // block_out)
    sums = np.zeros((bt, nb * block_out), np.int64)
    sums[:, :n] = b.reshape(bt, k, n).astype(np.int64).sum(axis=1)
    return sem.wrap_int32(int(factor) * sums).astype(np.int32).reshape(bt * nb, block_out)


def padded_cache(cache: np.ndarray, spec: dict) -> np.ndarray:
    """A KV cache in the joined shape of its concat, the new rows' places zero (the region
    writes their tiles: ``lowering.cache_tiles``)."""
    out = np.zeros(spec["joined"], cache.dtype)
    n = int(spec["cache"][spec["axis"]])
    index = [slice(None)] * out.ndim
    index[spec["axis"]] = slice(0, n)
    out[tuple(index)] = cache.reshape(spec["cache"])
    return out


def tiles_operand(x: np.ndarray, spec: dict) -> np.ndarray:
    """The matmul operand a ``weight_tiles`` note's input becomes before it is tiled: a KV
    cache padded to its concat's joined shape (``append``), then the region's movement,
    done on the host."""
    b = x if APPEND not in spec else padded_cache(x, spec[APPEND])
    return moved(b, spec.get("steps", ()), spec["shape"])


def pack_region_input(name: str, x: np.ndarray, io: dict, block_in: int,
                      block_out: int) -> dict[str, np.ndarray]:
    """The DRAM regions one region input fills, by region name."""
    if ROPE_TABLE in io:
        return {name: pack_table(name, x, io[ROPE_TABLE], block_out)}
    if PLANES in io:
        out = {}
        for (plane, note), codes in zip(io[PLANES].items(), split_planes(x)):
            out.update(pack_region_input(plane, codes.astype(np.int8), note, block_in,
                                         block_out))
        return out
    if "weight_tiles" in io:
        spec = io["weight_tiles"]
        b = tiles_operand(x, spec)
        out = {name: weight_tiles(b, block_in, block_out)}
        if spec["column_sums"]:
            out[name + COLSUM] = column_sum_rows(b, spec["column_sums"], block_out)
        return out
    if "matmul_b" in io:
        spec = {**io["matmul_b"], "zero_point": io["zero_point"]}
        return {name: weight_tiles(x, block_in, block_out),
                name + PARAMS: matmul_params(x, spec, block_out)}
    out = {}
    if io.get("im2col"):
        s = io["im2col"]
        x4 = im2col(x, tuple(s["kernel"]), tuple(s["strides"]), tuple(s["padding"]),
                    tuple(s["dilation"]), io["zero_point"])
        out[name] = pack_activation(x4, block_in)
    else:
        out[name] = pack_activation(x, block_in)
    if "matmul_a" in io:
        out[name + ROWSUM] = rowsum_rows(x, io["matmul_a"]["b_zero_point"], block_out)
    return out
