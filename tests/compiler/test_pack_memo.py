"""The kept packing of a KV cache (``layers.pack_memo``) against packing from scratch.

Each call's arrays must equal :func:`pack_region_input`'s byte for byte, whatever changed
since the call before: one row (a decode step), several, all of it, nothing, a value at
the int16 extremes, another shape."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.layers.host_pack import PLANES, pack_region_input
from dsa_tvm.layers.pack_memo import PackMemo, gather_spec, tile_positions


def cache_io(shape: tuple[int, int, int], transpose: bool, wide: bool,
             column_sums: int = 0) -> dict:
    """A cache input's note as the compiler writes it: weight tiles of the cache joined
    with one new row on axis 1, as keys (transposed: ``q @ k^T``) or values."""
    b, c, d = shape
    joined = [b, c + 1, d]
    steps = [[[1, b, c + 1, d], [0, 1, 3, 2]]] if transpose else [[joined, [0, 1, 2]]]
    tiles = {"shape": [b, d, c + 1] if transpose else joined, "column_sums": column_sums,
             "steps": steps, "append": {"cache": list(shape), "joined": joined, "axis": 1}}
    if not wide:
        return {"shape": list(shape), "zero_point": 0, "weight_tiles": tiles}
    return {"shape": list(shape), "zero_point": 0, "dtype": "int16",
            PLANES: {f"c#{p}": {"shape": list(shape), "zero_point": 0,
                                "weight_tiles": {**tiles, "tiles": f"t/{p}"}}
                     for p in ("hi", "lo")}}


def assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


EDIT = st.one_of(st.just("row"), st.just("rows"), st.just("all"), st.just("none"),
                 st.just("extreme"))


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 3), c=st.integers(1, 24), d=st.integers(1, 40),
       transpose=st.booleans(), wide=st.booleans(), blocks=st.sampled_from([(4, 4), (8, 16),
                                                                            (16, 16)]),
       edits=st.lists(EDIT, min_size=1, max_size=5), seed=st.integers(0, 2**16))
def test_kept_packing_equals_a_fresh_one(b, c, d, transpose, wide, blocks, edits, seed):
    rng = np.random.default_rng(seed)
    dtype, lo, hi = (np.int16, -32768, 32767) if wide else (np.int8, -128, 127)
    io = cache_io((b, c, d), transpose, wide)
    memo = PackMemo()
    x = np.zeros((b, c, d), dtype)
    assert_same(memo.pack(b"p", "c", x, io, *blocks), pack_region_input("c", x, io, *blocks))
    for edit in edits:
        x = x.copy()
        if edit == "row":                       # a decode step: one position, every head
            x[:, rng.integers(c)] = rng.integers(lo, hi + 1, (b, d))
        elif edit == "rows":
            x[:, rng.integers(c, size=3)] = rng.integers(lo, hi + 1, (b, 3, d))
        elif edit == "all":
            x = rng.integers(lo, hi + 1, x.shape).astype(dtype)
        elif edit == "extreme":                 # the planes' clamp (32640 up) and the ends
            x[:, rng.integers(c)] = rng.choice([lo, hi, 32640 if wide else hi, -1, 0], (b, d))
        assert_same(memo.pack(b"p", "c", x, io, *blocks),
                    pack_region_input("c", x, io, *blocks))


def test_a_one_row_change_is_an_update_not_a_repack():
    io = cache_io((3, 64, 64), transpose=True, wide=True)
    memo = PackMemo()
    x = np.random.default_rng(0).integers(-3000, 3000, (3, 64, 64)).astype(np.int16)
    memo.pack(b"p", "k0", x, io, 16, 16)
    x = x.copy()
    x[:, 7] = 12345
    assert_same(memo.pack(b"p", "k0", x, io, 16, 16), pack_region_input("k0", x, io, 16, 16))
    assert (memo.full_packs, memo.updates) == (1, 1)
    x = -x                                       # everything changed: packed in full
    assert_same(memo.pack(b"p", "k0", x, io, 16, 16), pack_region_input("k0", x, io, 16, 16))
    assert (memo.full_packs, memo.updates) == (2, 1)


def test_the_caller_may_reuse_its_array():
    """The memo compares against its own copy: an input rewritten in place between two
    launches is still seen as changed."""
    io = cache_io((2, 8, 16), transpose=False, wide=True)
    memo = PackMemo()
    x = np.zeros((2, 8, 16), np.int16)
    memo.pack(b"p", "v0", x, io, 16, 16)
    x[:, 3] = 999
    assert_same(memo.pack(b"p", "v0", x, io, 16, 16), pack_region_input("v0", x, io, 16, 16))


def test_inputs_that_do_not_gather_are_packed_in_full():
    """Column sums (a sum over the cache, not a gather) and an activation are packed from
    scratch every time, and equal."""
    sums = cache_io((2, 8, 16), transpose=True, wide=False, column_sums=-3)
    assert gather_spec(sums) is None
    act = {"shape": [1, 5, 16], "zero_point": 0}
    assert gather_spec(act) is None
    memo = PackMemo()
    rng = np.random.default_rng(1)
    for _ in range(2):
        x = rng.integers(-128, 128, (2, 8, 16)).astype(np.int8)
        assert_same(memo.pack(b"p", "k", x, sums, 16, 16), pack_region_input("k", x, sums, 16, 16))
        a = rng.integers(-128, 128, (1, 5, 16)).astype(np.int8)
        assert_same(memo.pack(b"p", "a", a, act, 16, 16), pack_region_input("a", a, act, 16, 16))
    assert memo.updates == 0


def test_positions_are_a_one_to_one_map():
    io = cache_io((3, 10, 24), transpose=True, wide=False)
    pos = tile_positions((3, 10, 24), io["weight_tiles"], 16, 16)
    assert pos is not None and len(np.unique(pos)) == pos.size == 3 * 10 * 24


def test_the_memo_stays_within_its_bytes():
    io = cache_io((1, 64, 64), transpose=False, wide=True)
    memo = PackMemo(max_bytes=100_000)
    for i in range(6):
        memo.pack(b"p", f"v{i}", np.full((1, 64, 64), i, np.int16), io, 16, 16)
    assert sum(e.nbytes for e in memo._entries.values()) <= 100_000
    assert len(memo._entries) >= 1


def test_the_arrays_handed_out_are_read_only():
    """A caller writing into them would corrupt the next step's packing silently: the
    write is refused instead."""
    io = cache_io((1, 8, 16), transpose=False, wide=True)
    memo = PackMemo()
    x = np.zeros((1, 8, 16), np.int16)
    for _ in range(2):   # the full packing, then an update
        out = memo.pack(b"p", "v0", x, io, 16, 16)
        for arr in out.values():
            with pytest.raises(ValueError, match="read-only"):
                arr[...] = 1
        x = x.copy()
        x[0, 2] = 77
