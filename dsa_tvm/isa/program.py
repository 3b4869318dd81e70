"""The program container: config fingerprint, instructions, DRAM regions, constant data.

Byte layout (little-endian)::

    b"DSAPROG\\0"  magic
    u32           format version
    16 bytes      fingerprint of the hardware config the program was built for
    u32           length of the JSON header
    JSON header   name, instruction_bits, instruction count, regions (no data), meta
    words         instruction count x instruction_bits/8 bytes
    blobs         the data of every region that has some, in region order
"""

from __future__ import annotations

import json
import operator
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .encoding import decode_program_words, encode_program_words
from .instructions import Instruction

if TYPE_CHECKING:
    from ..hw.config import HardwareConfig

MAGIC = b"DSAPROG\0"
VERSION = 1
REGION_KINDS = ("input", "output", "const", "scratch")


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
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

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

    # --- serialization
    def to_bytes(self, cfg: "HardwareConfig") -> bytes:
        self.check_config(cfg)
        header = json.dumps({"name": self.name, "instruction_bits": self.instruction_bits,
                             "count": len(self.instructions),
                             "regions": [r.header() for r in self.regions],
                             "meta": self.meta}).encode()
        parts = [MAGIC, struct.pack("<I", VERSION), self.fingerprint,
                 struct.pack("<I", len(header)), header,
                 self._encoded(cfg)]
        parts += [r.data for r in self.regions if r.data is not None]
        return b"".join(parts)

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
        """Parse a container; refuses one built for a different config."""
        view = memoryview(data)
        if bytes(view[:8]) != MAGIC:
            raise ProgramError("not a DSA program (bad magic)")
        if len(data) < 32:
            raise ProgramError("truncated DSA program header")
        (version,) = struct.unpack_from("<I", data, 8)
        if version != VERSION:
            raise ProgramError(f"DSA program format version {version}; this build reads {VERSION}")
        fingerprint = bytes(view[12:28])
        (hlen,) = struct.unpack_from("<I", data, 28)
        pos = 32
        try:
            head = json.loads(bytes(view[pos:pos + hlen]))
            prog = cls(name=str(head["name"]), fingerprint=fingerprint,
                       instruction_bits=int(head["instruction_bits"]), instructions=[],
                       meta=dict(head.get("meta", {})))
            count = head["count"]
            regions = [Region(str(rh["name"]), str(rh["kind"]), int(rh["offset"]),
                              np.dtype(rh["dtype"]).name, tuple(int(d) for d in rh["shape"]))
                       for rh in head["regions"]]
            has_data = [bool(rh["has_data"]) for rh in head["regions"]]
            if not isinstance(count, int) or count < 0:
                raise TypeError(f"instruction count {count!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ProgramError(f"corrupt DSA program header: {type(e).__name__}: {e}") from e
        pos += hlen
        prog.check_config(cfg)
        for r in regions:
            if r.kind not in REGION_KINDS:
                raise ProgramError(f"corrupt DSA program header: region '{r.name}' has kind "
                                   f"{r.kind!r}")
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
            prog.regions.append(r)
        if pos != len(data):
            raise ProgramError(f"DSA program has {len(data) - pos} trailing bytes")
        return prog
