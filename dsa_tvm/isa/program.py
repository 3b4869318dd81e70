"""The program container: config fingerprint, instructions, DRAM regions, constant data.

Byte layout (little-endian), format version 3::

    b"DSAPROG\\0"  magic
    u32           format version
    16 bytes      fingerprint of the hardware config the program was built for
    u32           length of the JSON header
    u32           CRC32 of every other byte of the container (all but these four)
    JSON header   name, instruction_bits, instruction count, regions (no data), meta
    words         instruction count x instruction_bits/8 bytes
    blobs         the data of every region that has some, in region order

The checksum is verified before anything else is read, so a flipped bit anywhere
(header, instruction words, constants) is refused instead of changing outputs
(CRC32 detects every single-bit and every burst error of up to 32 bits). Version 1
containers carry no checksum and are refused with the advice to rebuild them. The
DRAM layout (regions inside the device's DRAM, no two overlapping, unique names)
is checked on load, on serialization and before a run (:meth:`Program.check_layout`).
"""

from __future__ import annotations

import json
import math
import operator
import struct
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..hw.sparsity import n_m_tile_bytes, parse_n_m
from .encoding import decode_program_words, encode_program_words
from .instructions import Instruction

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

MAGIC = b"DSAPROG\0"
VERSION = 4
#: why a container of an older format version cannot be read
_OLDER = {1: "it predates the integrity checksum",
          2: "its LOAD/STORE buffer field predates int4 weight loads (WGT4)",
          3: "its GEMM format predates sparse weight tiles (WGTS)"}
#: the dtype of a constant region packed two codes a byte (weights a WGT4 load reads)
INT4 = "int4"
#: the dtype prefix of a constant region of compressed N:M weight tiles (WGTS loads):
#: ``"sparse2:4"``; its shape is the dense one, (..., block_out, block_in)
SPARSE = "sparse"


def sparse_dtype(n: int, m: int) -> str:
    """The region dtype of compressed ``n``:``m`` tiles."""
    return f"{SPARSE}{n}:{m}"


def region_alignment(cfg: "HardwareConfig", dtype: str) -> int:
    """Where a region of ``dtype`` may start: a multiple of every element size its
    transfers use (compressed N:M tiles are not a power of two bytes)."""
    if dtype.startswith(SPARSE) and cfg.sparse_tile_bytes:
        return math.lcm(cfg.dram_align, cfg.sparse_tile_bytes)
    return cfg.dram_align
#: bytes before the JSON header: magic, version, fingerprint, header length, checksum
PREFIX_BYTES = 36
_CRC_AT = 32
REGION_KINDS = ("input", "output", "const", "scratch")
#: the packed function a compiled module calls with a container's bytes (``runtime.register``)
LAUNCH = "dsa.launch"


class ProgramError(ValueError):
    """A program container that is malformed or built for another hardware config."""


@dataclass
class Region:
    """A named, typed block of device DRAM. ``data`` is set for constants only."""

    name: str
    kind: str
    offset: int
    dtype: str
    shape: tuple[int, ...]
    data: bytes | None = None

    @property
    def nbytes(self) -> int:
        # Python integers: a huge shape must not wrap around to a small size
        if self.dtype == INT4:  # two codes a byte (isa.semantics.pack_int4)
            return (math.prod(self.shape) + 1) // 2
        n_m = parse_n_m(self.dtype[len(SPARSE):]) if self.dtype.startswith(SPARSE) else None
        if n_m is not None:  # whole compressed tiles (isa.sparse_tiles)
            *lead, rows, cols = self.shape
            return math.prod(lead) * n_m_tile_bytes(rows, cols, *n_m)
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def header(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "offset": self.offset, "dtype": self.dtype,
                "shape": list(self.shape), "has_data": self.data is not None}


@dataclass
class Program:
    """What the device runs: instructions plus the DRAM image they expect."""

    name: str
    fingerprint: bytes
    instruction_bits: int
    instructions: list[Instruction]
    regions: list[Region] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def dram_size(self) -> int:
        return max((r.offset + r.nbytes for r in self.regions), default=0)

    def region(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(f"program '{self.name}' has no DRAM region '{name}' "
                       f"(regions: {', '.join(r.name for r in self.regions)})")

    def regions_of(self, kind: str) -> list[Region]:
        return [r for r in self.regions if r.kind == kind]

    # --- field checks already done
    def mark_fields_checked(self, cfg: "HardwareConfig", words: bytes | None = None) -> None:
        """Record that every instruction's fields fit the formats of ``cfg`` (the program was
        decoded from words, encoded, or checked by the builder), and the instruction words
        when known. Validation then skips the encoder's field checks, and serialization
        reuses the words, for as long as the program holds the very same (immutable)
        instruction objects; any change to the list makes them check and encode again."""
        self._fields_checked = (cfg.fingerprint, tuple(self.instructions))
        self._words = words

    def fields_checked(self, cfg: "HardwareConfig") -> bool:
        """True if :meth:`mark_fields_checked` vouches for the current instructions."""
        mark = getattr(self, "_fields_checked", None)
        if mark is None or mark[0] != cfg.fingerprint:
            return False
        ins = self.instructions
        return len(ins) == len(mark[1]) and all(map(operator.is_, ins, mark[1]))

    def check_config(self, cfg: "HardwareConfig") -> None:
        if self.fingerprint != cfg.fingerprint:
            raise ProgramError(
                f"program '{self.name}' was built for another hardware config "
                f"(fingerprint {self.fingerprint.hex()}); this device is '{cfg.name}' "
                f"({cfg.fingerprint.hex()}). Recompile for it.")

    def check_layout(self, cfg: "HardwareConfig") -> None:
        """Refuse a DRAM layout the device cannot hold: a region with a negative offset or
        dimension, one past the end of the config's DRAM, two regions sharing bytes (an
        input written over a constant), two regions with one name, a constant whose data
        does not match its size."""
        seen: set[str] = set()
        spans = []
        for r in self.regions:
            if r.name in seen:
                raise ProgramError(f"program '{self.name}' has two DRAM regions named "
                                   f"'{r.name}'; region names must be unique")
            seen.add(r.name)
            if r.kind not in REGION_KINDS:
                raise ProgramError(f"program '{self.name}': region '{r.name}' has kind "
                                   f"{r.kind!r}; expected one of {REGION_KINDS}")
            if r.offset < 0 or any(d < 0 for d in r.shape):
                raise ProgramError(f"program '{self.name}': region '{r.name}' has a negative "
                                   f"offset or dimension (offset {r.offset}, shape "
                                   f"{list(r.shape)})")
            n_m = parse_n_m(r.dtype[len(SPARSE):]) if r.dtype.startswith(SPARSE) else None
            if n_m and (len(r.shape) < 2 or r.shape[-1] % n_m[1]):
                raise ProgramError(f"program '{self.name}': region '{r.name}' of compressed "
                                   f"{n_m[0]}:{n_m[1]} tiles has shape {list(r.shape)}; it "
                                   f"needs (..., rows, columns) with columns a multiple of "
                                   f"{n_m[1]}")
            end = r.offset + r.nbytes
            if end > cfg.dram_bytes:
                raise ProgramError(
                    f"program '{self.name}': DRAM region '{r.name}' ({r.kind}, {r.nbytes:,} "
                    f"bytes at offset {r.offset:,}) ends at byte {end:,}, past the "
                    f"{cfg.dram_bytes:,}-byte DRAM of '{cfg.name}' (dram.size_mib = "
                    f"{cfg.dram_bytes >> 20}); shrink the region or use a part with more DRAM")
            if r.data is not None and len(r.data) != r.nbytes:
                raise ProgramError(f"program '{self.name}': region '{r.name}' holds "
                                   f"{len(r.data)} bytes of data for {r.nbytes} bytes of "
                                   f"{r.dtype}{list(r.shape)}")
            if r.nbytes:
                spans.append((r.offset, end, r))
        spans.sort(key=lambda s: (s[0], s[1]))
        for (_, a_end, a), (b_lo, _, b) in zip(spans, spans[1:]):
            if b_lo < a_end:
                raise ProgramError(
                    f"program '{self.name}': DRAM regions '{a.name}' ({a.kind}, bytes "
                    f"[{a.offset:,}, {a_end:,})) and '{b.name}' ({b.kind}, from byte {b_lo:,}) "
                    f"overlap; every region needs bytes of its own")

    # --- serialization
    def to_bytes(self, cfg: "HardwareConfig") -> bytes:
        self.check_config(cfg)
        self.check_layout(cfg)
        header = json.dumps({"name": self.name, "instruction_bits": self.instruction_bits,
                             "count": len(self.instructions),
                             "regions": [r.header() for r in self.regions],
                             "meta": self.meta}).encode()
        parts = [MAGIC, struct.pack("<I", VERSION), self.fingerprint,
                 struct.pack("<I", len(header)), b"\0\0\0\0", header,
                 self._encoded(cfg)]
        parts += [r.data for r in self.regions if r.data is not None]
        data = bytearray(b"".join(parts))
        struct.pack_into("<I", data, _CRC_AT, container_checksum(data))
        return bytes(data)

    def _encoded(self, cfg: "HardwareConfig") -> bytes:
        """The instruction words (kept from the builder or the decoder when still valid)."""
        checked = self.fields_checked(cfg)
        if checked and getattr(self, "_words", None) is not None:
            return self._words
        words = encode_program_words(self.instructions, cfg, checked)
        self.mark_fields_checked(cfg, words)  # every field was range-checked by the encoder
        return words

    @classmethod
    def from_bytes(cls, data: bytes, cfg: "HardwareConfig") -> "Program":
        """Parse a container; refuses a corrupt one and one built for a different config."""
        view = memoryview(data)
        head = read_header(data)
        fingerprint = bytes(view[12:28])
        (hlen,) = struct.unpack_from("<I", data, 28)
        pos = PREFIX_BYTES
        try:
            prog = cls(name=str(head["name"]), fingerprint=fingerprint,
                       instruction_bits=int(head["instruction_bits"]), instructions=[],
                       meta=dict(head.get("meta", {})))
            count = head["count"]
            regions = [Region(str(rh["name"]), str(rh["kind"]), int(rh["offset"]),
                              _dtype_name(rh["dtype"]), tuple(int(d) for d in rh["shape"]))
                       for rh in head["regions"]]
            has_data = [bool(rh["has_data"]) for rh in head["regions"]]
            if not isinstance(count, int) or count < 0:
                raise TypeError(f"instruction count {count!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ProgramError(f"corrupt DSA program header: {type(e).__name__}: {e}") from e
        pos += hlen
        prog.check_config(cfg)
        prog.regions = regions
        prog.check_layout(cfg)  # before any region size is trusted
        nwords = count * cfg.instruction_bits // 8
        if pos + nwords > len(data):
            raise ProgramError("truncated DSA program: instruction words missing")
        words = bytes(view[pos:pos + nwords])
        prog.instructions = decode_program_words(words, cfg)
        prog.mark_fields_checked(cfg, words)  # decoded from words: every field is in range
        pos += nwords
        for r, data_flag in zip(regions, has_data):
            if data_flag:
                if pos + r.nbytes > len(data):
                    raise ProgramError(f"truncated DSA program: data of region '{r.name}' missing")
                r.data = bytes(view[pos:pos + r.nbytes])
                pos += r.nbytes
        if pos != len(data):
            raise ProgramError(f"DSA program has {len(data) - pos} trailing bytes")
        return prog


def _dtype_name(dtype: str) -> str:
    """A header's region dtype, normalized (``int4`` is packed codes, not numpy's int32 alias)."""
    if dtype == INT4 or (dtype.startswith(SPARSE) and parse_n_m(dtype[len(SPARSE):])):
        return dtype
    return np.dtype(dtype).name


def container_checksum(data: bytes | bytearray | memoryview) -> int:
    """CRC32 of a container: every byte except the four that hold the checksum."""
    view = memoryview(data)
    return zlib.crc32(view[_CRC_AT + 4:], zlib.crc32(view[:_CRC_AT]))


def read_header(data: bytes) -> dict[str, Any]:
    """The JSON header of a container, after checking its magic, format version and
    checksum (nothing in it is trusted before that)."""
    view = memoryview(data)
    if bytes(view[:8]) != MAGIC:
        raise ProgramError("not a DSA program (bad magic)")
    if len(data) < 12:
        raise ProgramError("truncated DSA program header")
    (version,) = struct.unpack_from("<I", data, 8)
    if version != VERSION:
        why = (_OLDER.get(version, "it is older than this build") if version < VERSION
               else "it was written by a newer dsa-tvm")
        raise ProgramError(f"DSA program format version {version}; this build reads version "
                           f"{VERSION} only ({why}): rebuild the program (recompile the model, "
                           f"re-save the container) with this dsa-tvm")
    if len(data) < PREFIX_BYTES:
        raise ProgramError("truncated DSA program header")
    (stored,) = struct.unpack_from("<I", data, _CRC_AT)
    actual = container_checksum(data)
    if stored != actual:
        raise ProgramError(f"corrupt DSA program: checksum mismatch (stored CRC32 {stored:#010x}, "
                           f"computed {actual:#010x} over {len(data):,} bytes); the container was "
                           f"truncated or changed after it was written. Rebuild or re-copy it")
    (hlen,) = struct.unpack_from("<I", data, 28)
    try:
        head = json.loads(bytes(view[PREFIX_BYTES:PREFIX_BYTES + hlen]))
        if not isinstance(head, dict):
            raise TypeError(f"the header is a {type(head).__name__}, not an object")
    except (ValueError, TypeError) as e:
        raise ProgramError(f"corrupt DSA program header: {type(e).__name__}: {e}") from e
    return head


def recorded_config(data: bytes) -> "HardwareConfig":
    """The hardware description a container was built for, as its meta records it
    (``meta["hardware"]``, read after the checksum is verified): what the runtime needs
    to load a program it is handed."""
    from ..hw.config import config_from_dict

    meta = read_header(data).get("meta")
    hw = meta.get("hardware") if isinstance(meta, dict) else None
    if hw is None:
        raise ProgramError("DSA program carries no hardware description; recompile it")
    return config_from_dict(hw, source="<program>")
