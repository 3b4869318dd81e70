"""Program containers refuse corruption and impossible DRAM layouts (issue 11, finding 7).

Before format version 2 a flipped bit in the constants or in an instruction word mostly
changed outputs with no error, and a region past the device's DRAM, an input region laid
over a constant (the input overwrote it) and two regions with one name were accepted.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.builder import ProgramBuilder
from dsa_tvm.isa.instructions import Buffer, Engine
from dsa_tvm.isa.program import PREFIX_BYTES, VERSION, Program, ProgramError, Region
from dsa_tvm.programs.matmul import matmul_program, reference_matmul
from dsa_tvm.sim.simulator import Simulator

from .harness import rand_int8
from .test_program import reseal, sample_program

CFG = load_config("default")


@pytest.fixture(scope="module")
def matmul_blob():
    """A requantized matmul with constant weights and parameters, its input and the
    expected output (independent numpy reference)."""
    rng = np.random.default_rng(7)
    w = rand_int8(rng, (24, 40))
    qp = np.zeros((2, 3, CFG.block_out), np.int32)
    qp[:, 0] = rng.integers(-5000, 5000, (2, CFG.block_out))
    qp[:, 1] = 1 << 30
    qp[:, 2] = 36
    prog = matmul_program(CFG, 20, 24, 40, w=w, qparams=qp)
    x = rand_int8(rng, (20, 48))
    return prog.to_bytes(CFG), x, reference_matmul(x, w, qp, CFG)


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def test_every_single_bit_flip_of_a_container_is_refused():
    """All 8 x len bit positions of a container with constants: each is a ProgramError
    (never a decoded program, never a DecodeError from a half-trusted word)."""
    data = sample_program(CFG).to_bytes(CFG)
    Program.from_bytes(data, CFG)                                # the intact one loads
    for bit in range(8 * len(data)):
        with pytest.raises(ProgramError):
            Program.from_bytes(_flip(data, bit), CFG)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_sampled_bit_flips_in_a_matmul_container_are_refused(matmul_blob, data):
    blob, x, want = matmul_blob
    (hlen,) = struct.unpack_from("<I", blob, 28)
    words_at = PREFIX_BYTES + hlen
    # sample every part: fixed prefix, JSON header, instruction words, constant data
    lo, hi = data.draw(st.sampled_from([(0, PREFIX_BYTES), (PREFIX_BYTES, words_at),
                                        (words_at, len(blob) - 2048), (len(blob) - 2048,
                                                                        len(blob))]))
    bit = data.draw(st.integers(8 * lo, 8 * hi - 1))
    with pytest.raises(ProgramError):
        Simulator(CFG).run(_flip(blob, bit), {"x": x})


def test_intact_matmul_container_runs_exactly(matmul_blob):
    blob, x, want = matmul_blob
    np.testing.assert_array_equal(Simulator(CFG).run(blob, {"x": x}).outputs["out"], want)


def test_corruption_error_says_what_happened(matmul_blob):
    blob = matmul_blob[0]
    with pytest.raises(ProgramError, match="checksum mismatch.*truncated or changed"):
        Program.from_bytes(_flip(blob, 8 * (len(blob) - 100)), CFG)     # in a constant
    with pytest.raises(ProgramError, match="checksum"):
        Program.from_bytes(blob[:-1], CFG)


def test_version_1_container_is_refused_with_the_fix():
    data = sample_program(CFG).to_bytes(CFG)
    assert struct.unpack_from("<I", data, 8)[0] == VERSION == 4
    v1 = data[:8] + struct.pack("<I", 1) + data[12:32] + data[36:]   # the old layout
    with pytest.raises(ProgramError, match=r"version 1.*predates the integrity checksum.*"
                                           r"rebuild"):
        Program.from_bytes(v1, CFG)


def test_version_2_container_is_refused_naming_the_buffer_field():
    """Version 2 words had a 2-bit buffer field: decoding them with today's 3-bit field
    would shift every field after it, so they are refused, not misread."""
    data = sample_program(CFG).to_bytes(CFG)
    v2 = data[:8] + struct.pack("<I", 2) + data[12:]
    with pytest.raises(ProgramError, match=r"version 2.*buffer field.*int4.*rebuild"):
        Program.from_bytes(v2, CFG)


def test_runtime_launch_refuses_a_corrupt_program_constant(matmul_blob):
    """The ``dsa.launch`` path (programs embedded in compiled modules) checks the same."""
    import tvm

    from dsa_tvm.runtime import launch

    blob = matmul_blob[0]
    bad = np.frombuffer(_flip(blob, 8 * (len(blob) - 5) + 3), np.uint8)
    with pytest.raises(ProgramError, match="checksum"):
        launch(tvm.runtime.tensor(bad))


def test_runtime_finds_a_launched_program_tensor_by_its_memory(matmul_blob, monkeypatch):
    """A program tensor launched before is found without reading its bytes again (an LLM's
    decode program carries its weights; copying and hashing them each launch cost a fifth
    of a simulated token's wall time). Other memory with the same bytes is read once and
    finds the same program; a tensor whose first bytes (the checksum) changed in place is
    read again, checked and refused."""
    import tvm

    from dsa_tvm import runtime

    prog = Program.from_bytes(matmul_blob[0], CFG)
    prog.meta["hardware"] = CFG.as_dict()             # what a compiled module's programs carry
    blob = prog.to_bytes(CFG)
    reads = []
    get = runtime._programs.get
    monkeypatch.setattr(runtime._programs, "get", lambda b: reads.append(len(b)) or get(b))
    t = tvm.runtime.tensor(np.frombuffer(blob, np.uint8))
    key, prog, _ = runtime._programs.get_tensor(t)
    assert reads == [len(blob)] and prog.name
    assert runtime._programs.get_tensor(t)[:2] == (key, prog) and len(reads) == 1
    twin = tvm.runtime.tensor(np.frombuffer(blob, np.uint8))
    assert runtime._programs.get_tensor(twin)[0] == key and len(reads) == 2
    edited = np.frombuffer(blob, np.uint8).copy()
    edited[32] ^= 1                                  # the stored CRC32's lowest bit
    t.copyfrom(edited)
    with pytest.raises(ProgramError, match="checksum"):
        runtime._programs.get_tensor(t)
    assert len(reads) == 3


# ----------------------------------------------------------------------------- DRAM layout

def _layout_case(case: str) -> Program:
    """A program whose regions break one layout rule (the regions appended by hand, as a
    container edited outside the builder would carry them)."""
    b = ProgramBuilder(CFG, case)
    w = b.region("w", "const", (4, CFG.block_in), data=np.arange(64).reshape(4, -1))
    b.region("y", "output", (4, CFG.block_out), "int32")
    b.sync(Engine.COMPUTE)
    b.load(Buffer.INP, 0, b.addr(w, Buffer.INP), 1, 4)
    prog = b.build()
    if case == "past_dram":
        prog.regions.append(Region("big", "scratch", CFG.dram_bytes - 64, "int8", (128,)))
    elif case == "wrapping_shape":   # 2**80 x 4 bytes: an int64 product wraps to 0
        prog.regions.append(Region("huge", "scratch", 4096, "int32", (1 << 40, 1 << 40)))
    elif case == "overlap":          # an input laid over the constant: it would overwrite it
        prog.regions.append(Region("x", "input", w.offset + 32, "int8", (64,)))
    elif case == "duplicate":
        prog.regions.append(Region("w", "input", 8192, "int8", (16,)))
    return prog


LAYOUT_CASES = {"past_dram": "past the .*-byte DRAM of 'default'",
                "wrapping_shape": "past the .*-byte DRAM",
                "overlap": "'w' .* and 'x' .* overlap",
                "duplicate": "two DRAM regions named 'w'"}


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_bad_layout_refused_on_run_and_serialization(case):
    prog = _layout_case(case)
    with pytest.raises(ProgramError, match=LAYOUT_CASES[case]):
        Simulator(CFG).run(prog, {"x": np.zeros(64, np.int8)} if case == "overlap" else {})
    with pytest.raises(ProgramError, match=LAYOUT_CASES[case]):
        prog.to_bytes(CFG)


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_bad_layout_refused_on_build(case):
    b = ProgramBuilder(CFG, case)
    b.regions = _layout_case(case).regions        # bypassing region()'s own checks
    with pytest.raises(ProgramError, match=LAYOUT_CASES[case]):
        b.build()


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_bad_layout_refused_on_load(case):
    """A container whose (checksum-valid) header describes the bad layout."""
    import json

    good = _layout_case("none")
    bad = _layout_case(case)
    data = good.to_bytes(CFG)
    (hlen,) = struct.unpack_from("<I", data, 28)
    head = json.loads(data[36:36 + hlen])
    head["regions"] = [r.header() | {"has_data": r.data is not None} for r in bad.regions]
    hb = json.dumps(head).encode()
    edited = reseal(data[:28] + struct.pack("<I", len(hb)) + data[32:36] + hb + data[36 + hlen:])
    with pytest.raises(ProgramError, match=LAYOUT_CASES[case]):
        Program.from_bytes(edited, CFG)


def test_region_exactly_at_the_end_of_dram_is_fine():
    b = ProgramBuilder(CFG, "edge_of_dram")
    b.sync(Engine.COMPUTE)
    prog = b.build()
    prog.regions.append(Region("last", "scratch", CFG.dram_bytes - 64, "int8", (64,)))
    Program.from_bytes(prog.to_bytes(CFG), CFG).check_layout(CFG)
