"""The program container: exact byte round trips, config checks, corrupt input."""

from __future__ import annotations

import copy
import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.encoding import DecodeError, encode_instruction
from dsa_tvm.isa.instructions import AluOp, Buffer, Engine, Finish, Sync
from dsa_tvm.isa.program import (
    MAGIC,
    PREFIX_BYTES,
    VERSION,
    Program,
    ProgramError,
    container_checksum,
)
from dsa_tvm.programs.matmul import matmul_program, reference_matmul

from .harness import PRESETS, rand_int8, run

CFGS = {n: load_config(n) for n in PRESETS}


def reseal(data: bytes | bytearray) -> bytes:
    """``data`` with its checksum recomputed: a deliberately edited container that the
    integrity check lets through, so the parser's own checks behind it are exercised."""
    out = bytearray(data)
    if len(out) >= PREFIX_BYTES:
        struct.pack_into("<I", out, 32, container_checksum(out))
    return bytes(out)


def sample_program(cfg, name="sample") -> Program:
    rng = np.random.default_rng(0)
    bi, bo = cfg.block_in, cfg.block_out
    b = ProgramBuilder(cfg, name)
    rx = b.region("x", "input", (4, bi))
    rw = b.region("w", "const", (2, bo, bi), data=rand_int8(rng, (2, bo, bi)))
    rq = b.region("qp", "const", (2, bo), "int32", data=np.arange(2 * bo).reshape(2, bo))
    b.region("tmp", "scratch", (3, bo), "int32")
    ro = b.region("y", "output", (4, bo), "int8")
    b.meta.update(kind="test", layers=[{"name": "l0", "first": 0, "last": 6}], scale=0.25,
                  nested={"a": [1, 2, {"b": None}]})
    b.load(Buffer.INP, 0, b.addr(rx, Buffer.INP), 1, 4)
    b.load(Buffer.WGT, 0, b.addr(rw, Buffer.WGT), 1, 2, push_next=True)
    b.load(Buffer.ACC, 8, b.addr(rq, Buffer.ACC), 1, 2, pop_prev=True)
    b.gemm(0, 0, 0, [(4, 1, 1, 0), (2, 0, 0, 1)], reset=True)
    b.alu(AluOp.SHR, 0, 0, loops=[(4, 1, 1, 0)], imm=3, use_imm=True, push_next=True)
    b.store(Buffer.ACC8, 0, b.addr(ro, Buffer.ACC8), 1, 4, pop_prev=True, push_prev=True)
    b.finish(pop_next=True)
    return b.build()


def assert_same_program(p: Program, q: Program) -> None:
    assert q.name == p.name
    assert q.fingerprint == p.fingerprint
    assert q.instruction_bits == p.instruction_bits
    assert q.instructions == p.instructions
    assert q.meta == p.meta
    assert len(q.regions) == len(p.regions)
    for r, s in zip(p.regions, q.regions):
        assert (s.name, s.kind, s.offset, s.dtype, s.shape, s.data) == (
            r.name, r.kind, r.offset, r.dtype, r.shape, r.data)


@pytest.mark.parametrize("name", PRESETS)
def test_round_trip_exact(name):
    cfg = CFGS[name]
    p = sample_program(cfg)
    data = p.to_bytes(cfg)
    assert data[:8] == MAGIC
    assert struct.unpack_from("<I", data, 8)[0] == VERSION
    assert data[12:28] == cfg.fingerprint
    q = Program.from_bytes(data, cfg)
    assert_same_program(p, q)
    assert q.to_bytes(cfg) == data                               # byte-identical again
    assert q.region("w").data == p.region("w").data
    assert isinstance(q.regions[0].shape, tuple)


def test_container_layout_by_hand():
    cfg = CFGS["default"]
    p = sample_program(cfg)
    data = p.to_bytes(cfg)
    (hlen,) = struct.unpack_from("<I", data, 28)
    assert struct.unpack_from("<I", data, 32)[0] == container_checksum(data)
    head = json.loads(data[36:36 + hlen])
    assert head["count"] == len(p.instructions) and head["name"] == "sample"
    nbytes = cfg.instruction_bits // 8
    words = data[36 + hlen:36 + hlen + head["count"] * nbytes]
    first = int.from_bytes(words[:nbytes], "little")
    assert first == encode_instruction(p.instructions[0], cfg)
    blobs = data[36 + hlen + len(words):]
    assert blobs == p.region("w").data + p.region("qp").data     # const data, region order
    assert len(data) == 36 + hlen + len(words) + len(blobs)


def test_round_trip_matmul_program_with_constants_runs_identically():
    cfg = CFGS["edge"]
    rng = np.random.default_rng(1)
    w = rand_int8(rng, (10, 20))
    qp = np.zeros((2, 3, cfg.block_out), np.int32)
    qp[:, 0] = rng.integers(-5000, 5000, (2, cfg.block_out))   # bias
    qp[:, 1] = 1 << 30                                         # mult
    qp[:, 2] = 36                                              # shift
    p = matmul_program(cfg, 9, 10, 20, w=w, qparams=qp)
    assert p.fields_checked(cfg)                               # checked once, by the builder
    data = p.to_bytes(cfg)
    q = Program.from_bytes(data, cfg)
    assert_same_program(p, q)
    x = rand_int8(rng, (9, 24))
    r1, r2 = run(cfg, p, {"x": x}), run(cfg, data, {"x": x})     # run() also takes bytes
    np.testing.assert_array_equal(r1.outputs["out"], r2.outputs["out"])
    np.testing.assert_array_equal(r1.outputs["out"], reference_matmul(x, w, qp, cfg))
    assert r1.cycles == r2.cycles and r1.counters == r2.counters


@settings(max_examples=40, deadline=None)
@given(name=st.text(min_size=1, max_size=20),
       meta=st.dictionaries(st.text(max_size=8), st.one_of(st.integers(-10**12, 10**12),
                                                           st.text(max_size=10), st.booleans(),
                                                           st.none()), max_size=5),
       nsync=st.integers(0, 40), blob=st.binary(min_size=64, max_size=64))
def test_round_trip_property(name, meta, nsync, blob):
    cfg = CFGS["default"]
    b = ProgramBuilder(cfg, name)
    b.region("c", "const", (64,), "uint8", data=np.frombuffer(blob, np.uint8))
    b.region("o", "output", (3, 5), "int16")
    b.meta.update(meta)
    for k in range(nsync):
        b.sync(Engine(k % 3))
    p = b.build()
    q = Program.from_bytes(p.to_bytes(cfg), cfg)
    assert_same_program(p, q)


# ----------------------------------------------------------------------------- refusals

def test_from_bytes_refuses_other_config():
    d, e = CFGS["default"], CFGS["edge"]
    data = sample_program(d).to_bytes(d)
    with pytest.raises(ProgramError, match="another hardware config"):
        Program.from_bytes(data, e)
    # even a one-field change of the same preset is another config
    with pytest.raises(ProgramError, match="Recompile"):
        Program.from_bytes(data, d.replace(latency_cycles=99))


def test_to_bytes_refuses_other_config():
    d = CFGS["default"]
    with pytest.raises(ProgramError):
        sample_program(d).to_bytes(CFGS["large"])


def test_simulator_refuses_other_config():
    d = CFGS["default"]
    p = sample_program(d)
    with pytest.raises(ProgramError):
        run(CFGS["edge"], p, {"x": np.zeros((4, 16), np.int8)})


# ----------------------------------------------------------------------------- corruption

@pytest.fixture(scope="module")
def blob():
    cfg = CFGS["default"]
    return cfg, sample_program(cfg).to_bytes(cfg)


def test_every_truncation_raises_program_error(blob):
    cfg, data = blob
    for n in range(len(data)):
        with pytest.raises(ProgramError):
            Program.from_bytes(data[:n], cfg)


def test_trailing_bytes_rejected(blob):
    cfg, data = blob
    with pytest.raises(ProgramError, match="trailing"):
        Program.from_bytes(reseal(data + b"\0"), cfg)


@pytest.mark.parametrize("mutate,match", [
    (lambda d: b"XSAPROG\0" + d[8:], "magic"),
    (lambda d: d[:8] + struct.pack("<I", 99) + d[12:], "version"),
    (lambda d: d[:12] + bytes(16) + d[28:], "another hardware config"),
    (lambda d: d[:28] + struct.pack("<I", 0xFFFFFFFF) + d[32:], "header"),
    (lambda d: d[:28] + struct.pack("<I", 3) + d[32:], "header"),
    (lambda d: d[:36] + b"\xff" + d[37:], "header"),
])
def test_corrupt_container_fields(blob, mutate, match):
    cfg, data = blob
    with pytest.raises(ProgramError, match=match):
        Program.from_bytes(reseal(mutate(data)), cfg)


def _with_header(data: bytes, head) -> bytes:
    (hlen,) = struct.unpack_from("<I", data, 28)
    hb = json.dumps(head).encode()
    return reseal(data[:28] + struct.pack("<I", len(hb)) + data[32:36] + hb + data[36 + hlen:])


def _header(data: bytes) -> dict:
    (hlen,) = struct.unpack_from("<I", data, 28)
    return json.loads(data[36:36 + hlen])


def test_header_count_mismatch(blob):
    cfg, data = blob
    for delta in (-1, 1, 1000):
        head = _header(data)
        head["count"] += delta
        # the words then take in blob bytes (which may not decode) or leave some over
        with pytest.raises((ProgramError, DecodeError)):
            Program.from_bytes(_with_header(data, head), cfg)


def test_flipped_bits_never_crash(blob):
    """Flip every bit of the fingerprint, length and instruction words and every byte of the
    header and blobs, and reseal the checksum (so the parser behind the integrity check is
    exercised): parsing either succeeds (e.g. changed constant data) or raises a clean
    ProgramError / DecodeError. Unsealed, every one of these flips is refused
    (tests/device/test_container_integrity.py)."""
    cfg, data = blob
    (hlen,) = struct.unpack_from("<I", data, 28)
    h0 = PREFIX_BYTES
    positions = [(i, 1 << k) for i in range(8, 32) for k in range(8)]
    positions += [(i, 0xFF) for i in range(h0, h0 + hlen)]            # header: invalid UTF-8
    nwords = h0 + hlen + len(sample_program(cfg).instructions) * cfg.instruction_bits // 8
    positions += [(i, 1 << k) for i in range(h0 + hlen, nwords) for k in range(8)]
    positions += [(i, 0x81) for i in range(nwords, len(data))]        # constant data
    outcomes = {"ok": 0, "ProgramError": 0, "DecodeError": 0}
    for i, mask in positions:
        mutated = bytearray(data)
        mutated[i] ^= mask
        try:
            Program.from_bytes(reseal(mutated), cfg)
            outcomes["ok"] += 1
        except ProgramError:
            outcomes["ProgramError"] += 1
        except DecodeError as e:
            assert e.index is not None and str(e).startswith(f"instruction {e.index}: ")
            outcomes["DecodeError"] += 1
    assert all(outcomes.values()), outcomes


def test_malformed_word_in_container_names_index(blob):
    cfg, data = blob
    (hlen,) = struct.unpack_from("<I", data, 28)
    nbytes = cfg.instruction_bits // 8
    pos = 36 + hlen + 3 * nbytes                                     # instruction 3
    mutated = data[:pos] + bytes([data[pos] | 7]) + data[pos + 1:]    # opcode 7
    with pytest.raises(DecodeError) as ei:
        Program.from_bytes(reseal(mutated), cfg)
    assert ei.value.index == 3 and "opcode 7" in str(ei.value)


@pytest.mark.parametrize("edit", [
    "drop_count", "drop_name", "drop_regions", "header_is_list", "count_is_string",
    "regions_is_int", "region_missing_kind",
])
def test_wrong_shape_header_raises_program_error(blob, edit):
    cfg, data = blob
    head = _header(data)
    if edit == "drop_count":
        del head["count"]
    elif edit == "drop_name":
        del head["name"]
    elif edit == "drop_regions":
        del head["regions"]
    elif edit == "header_is_list":
        head = [head]
    elif edit == "count_is_string":
        head["count"] = str(head["count"])
    elif edit == "regions_is_int":
        head["regions"] = 5
    elif edit == "region_missing_kind":
        del head["regions"][0]["kind"]
    with pytest.raises(ProgramError):
        Program.from_bytes(_with_header(data, copy.deepcopy(head)), cfg)


def test_bad_region_dtype_raises_program_error(blob):
    cfg, data = blob
    head = _header(data)
    head["regions"][0]["dtype"] = "no-such-dtype"               # region 'x' has no data blob
    with pytest.raises(ProgramError):
        Program.from_bytes(_with_header(data, head), cfg)


def test_region_lookup_errors():
    cfg = CFGS["default"]
    p = sample_program(cfg)
    assert p.region("qp").kind == "const"
    assert [r.name for r in p.regions_of("const")] == ["w", "qp"]
    with pytest.raises(KeyError, match="no DRAM region 'nope'"):
        p.region("nope")


def test_builder_alignment_and_errors():
    cfg = CFGS["default"]
    b = ProgramBuilder(cfg)
    r1 = b.region("a", "input", (3,))
    r2 = b.region("b", "input", (5,), "int32")
    assert r1.offset == 0 and r2.offset % cfg.dram_align == 0 and r2.offset >= 3
    with pytest.raises(ValueError, match="already exists"):
        b.region("a", "input", (1,))
    with pytest.raises(ValueError, match="kind"):
        b.region("c", "weights", (1,))
    with pytest.raises(ValueError, match="shape"):
        b.region("d", "const", (2, 2), data=np.zeros((4,), np.int8))
    with pytest.raises(ValueError, match="past the"):
        b.region("huge", "scratch", (cfg.dram_bytes,))
    with pytest.raises(ValueError, match="not aligned"):
        b.addr(r2, Buffer.ACC, 4)
    assert b.addr(r2, Buffer.ACC) == r2.offset // cfg.acc_row_bytes
    # build() appends FINISH when missing, and only then
    b.sync(Engine.LOAD)
    assert isinstance(b.build().instructions[-1], Finish)
    assert len(b.build().instructions) == 2
    assert b.build().instructions[0] == Sync(Engine.LOAD)
