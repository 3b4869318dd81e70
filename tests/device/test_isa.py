"""Binary encoding: exact round trips, field range checks, malformed words."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_tvm.hw.config import load_config
from dsa_tvm.isa.encoding import (
    DecodeError,
    EncodeError,
    decode_instruction,
    decode_program_words,
    encode_instruction,
    encode_program_words,
)
from dsa_tvm.isa.formats import FORMATS, addr_bits
from dsa_tvm.isa.instructions import (
    Alu,
    AluLoop,
    AluOp,
    Buffer,
    Deps,
    Engine,
    Finish,
    Gemm,
    GemmLoop,
    Load,
    Norm,
    NormOp,
    Opcode,
    Store,
    Sync,
)

from .harness import PRESETS

CFGS = {n: load_config(n) for n in PRESETS}


def widths(cfg, opcode) -> dict[str, tuple[int, int, bool]]:
    """field name -> (offset, width, signed)."""
    return {fd.name: (off, w, fd.signed) for fd, off, w in FORMATS[opcode].widths(cfg)}


# ----------------------------------------------------------------------------- layout

def test_address_widths_from_depths():
    assert addr_bits(1) == 1 and addr_bits(2) == 1 and addr_bits(3) == 2
    assert addr_bits(4096) == 12 and addr_bits(4097) == 13
    cfg = CFGS["default"]  # inp 4096 rows, wgt 1024 tiles, acc 2048 rows
    g = widths(cfg, Opcode.GEMM)
    assert g["inp_base"][1] == 12 and g["wgt_base"][1] == 10 and g["acc_base"][1] == 11
    assert widths(cfg, Opcode.LOAD)["sram_base"][1] == 12       # the largest scratchpad
    e = widths(CFGS["edge"], Opcode.ALU)                         # acc 512 rows
    assert e["dst_base"][1] == 9


@pytest.mark.parametrize("name", PRESETS)
def test_every_format_fits_and_header_is_common(name):
    cfg = CFGS[name]
    for op, fmt in FORMATS.items():
        assert fmt.total_bits(cfg) <= cfg.instruction_bits
        w = widths(cfg, op)
        assert [w[k][:2] for k in ("opcode", "pop_prev", "pop_next", "push_prev", "push_next")] == [
            (0, 3), (3, 1), (4, 1), (5, 1), (6, 1)]
        offs = sorted(w.values())
        for (o1, w1, _), (o2, _, _) in zip(offs, offs[1:]):
            assert o1 + w1 == o2                                # packed, no gaps or overlaps


def test_hand_encoded_words_default():
    cfg = CFGS["default"]
    assert encode_instruction(Finish(), cfg) == 5
    assert encode_instruction(Finish(Deps(pop_next=True)), cfg) == 5 | 1 << 4
    # SYNC on COMPUTE pushing to the next engine: opcode 4, push_next bit 6, engine at bit 7
    assert encode_instruction(Sync(Engine.COMPUTE, Deps(push_next=True)), cfg) == 4 | 64 | 128
    # LOAD: buffer @7 (3 bits), sram_base @10 (12), dram_base @22 (32), y @54, x @70,
    # stride @86 (16 each), pads @102/110/118/126 (8 each), pad_value @134 (8, signed)
    ld = Load(Buffer.ACC8, 0xABC, 0xDEADBEEF, 3, 4, 5, 1, 2, 3, 4, -2, Deps(pop_prev=True))
    want = (0 | 1 << 3 | 3 << 7 | 0xABC << 10 | 0xDEADBEEF << 22 | 3 << 54 | 4 << 70 | 5 << 86
            | 1 << 102 | 2 << 110 | 3 << 118 | 4 << 126 | 0xFE << 134)
    assert encode_instruction(ld, cfg) == want
    assert decode_instruction(want, cfg) == ld


def test_gemm_and_alu_loops_pad_to_four_and_three_levels():
    g = Gemm(1, 2, 3, (GemmLoop(5, 1, 1, 0),))
    assert len(g.loops) == 4 and g.loops[:3] == (GemmLoop(1),) * 3 and g.steps == 5
    a = Alu(AluOp.ADD, 0, loops=(AluLoop(2, 1), AluLoop(3, 0, 1)))
    assert len(a.loops) == 3 and a.steps == 6
    with pytest.raises(ValueError):
        Gemm(0, 0, 0, (GemmLoop(1),) * 5)


# ----------------------------------------------------------------------------- strategies

def _u(w):
    return st.integers(0, (1 << w) - 1)


def _field(w, name):
    off, width, signed = w[name]
    if signed:
        return st.integers(-(1 << (width - 1)), (1 << (width - 1)) - 1)
    return _u(width)


deps_st = st.builds(Deps, st.booleans(), st.booleans(), st.booleans(), st.booleans())


@st.composite
def instructions(draw, cfg):
    kind = draw(st.sampled_from(list(Opcode)))
    w = widths(cfg, kind)
    f = {name: draw(_field(w, name)) for name in w if name not in (
        "opcode", "pop_prev", "pop_next", "push_prev", "push_next", "buffer", "alu_op",
        "engine", "reset", "use_imm", "norm_op")}
    deps = draw(deps_st)
    if kind in (Opcode.LOAD, Opcode.STORE):
        buf = draw(st.sampled_from(list(Buffer)))
        common = (buf, f["sram_base"], f["dram_base"], f["y_size"], f["x_size"], f["x_stride"])
        if kind == Opcode.STORE:
            return Store(*common, deps=deps)
        return Load(*common, f["pad_top"], f["pad_bottom"], f["pad_left"], f["pad_right"],
                    f["pad_value"], deps, bool(f["prefetch"]))
    if kind == Opcode.GEMM:
        loops = tuple(GemmLoop(f[f"ext{k}"], f[f"acc_stride{k}"], f[f"inp_stride{k}"],
                               f[f"wgt_stride{k}"]) for k in range(4))
        return Gemm(f["acc_base"], f["inp_base"], f["wgt_base"], loops, draw(st.booleans()), deps)
    if kind == Opcode.ALU:
        loops = tuple(AluLoop(f[f"ext{k}"], f[f"dst_stride{k}"], f[f"a_stride{k}"],
                              f[f"b_stride{k}"]) for k in range(3))
        return Alu(draw(st.sampled_from(list(AluOp))), f["dst_base"], f["a_base"], f["b_base"],
                   loops, draw(st.booleans()), f["imm"], deps)
    if kind == Opcode.SYNC:
        return Sync(draw(st.sampled_from(list(Engine))), deps)
    if kind == Opcode.NORM:
        return Norm(draw(st.sampled_from(list(NormOp))), f["dst_base"], f["src_base"],
                    f["param_base"], f["rows"], f["length"], f["in_zp"], deps)
    return Finish(deps)


VALID_ENUMS = {"opcode": None, "buffer": len(Buffer), "alu_op": len(AluOp), "engine": len(Engine),
               "norm_op": len(NormOp)}


@st.composite
def words(draw, cfg):
    """A valid word assembled field by field (values placed at their offsets by hand)."""
    kind = draw(st.sampled_from(list(Opcode)))
    word, values = 0, {}
    for name, (off, width, _signed) in widths(cfg, kind).items():
        if name == "opcode":
            v = int(kind)
        elif name in VALID_ENUMS:
            v = draw(st.integers(0, VALID_ENUMS[name] - 1))
        else:
            v = draw(_field(widths(cfg, kind), name))
        values[name] = v
        word |= (v % (1 << width)) << off
    return kind, word, values


# ----------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("name", PRESETS)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_decode_encode_round_trip(name, data):
    cfg = CFGS[name]
    ins = data.draw(instructions(cfg))
    word = encode_instruction(ins, cfg)
    assert 0 <= word < (1 << cfg.instruction_bits)
    assert decode_instruction(word, cfg) == ins


@pytest.mark.parametrize("name", PRESETS)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_encode_decode_word_round_trip(name, data):
    cfg = CFGS[name]
    kind, word, values = data.draw(words(cfg))
    ins = decode_instruction(word, cfg)
    assert ins.opcode == kind
    assert encode_instruction(ins, cfg) == word
    # the decoder put each field where the layout says
    assert ins.deps == Deps(*(bool(values[k]) for k in ("pop_prev", "pop_next", "push_prev",
                                                         "push_next")))
    if kind in (Opcode.LOAD, Opcode.STORE):
        assert (int(ins.buffer), ins.sram_base, ins.dram_base, ins.x_stride) == (
            values["buffer"], values["sram_base"], values["dram_base"], values["x_stride"])
    if kind == Opcode.LOAD:
        assert ins.pad_value == values["pad_value"]
    if kind == Opcode.GEMM:
        assert ins.loops[2].wgt == values["wgt_stride2"] and ins.reset == bool(values["reset"])
    if kind == Opcode.ALU:
        assert (int(ins.op), ins.imm, ins.loops[0].extent) == (values["alu_op"], values["imm"],
                                                                values["ext0"])
    if kind == Opcode.SYNC:
        assert int(ins.on) == values["engine"]
    if kind == Opcode.NORM:
        assert (int(ins.op), ins.rows, ins.length, ins.in_zp) == (
            values["norm_op"], values["rows"], values["length"], values["in_zp"])


@pytest.mark.parametrize("name", PRESETS)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_program_words_round_trip(name, data):
    cfg = CFGS[name]
    prog = data.draw(st.lists(instructions(cfg), min_size=0, max_size=8))
    raw = encode_program_words(prog, cfg)
    assert len(raw) == len(prog) * cfg.instruction_bits // 8
    assert decode_program_words(raw, cfg) == prog


# ----------------------------------------------------------------------------- encode errors

def _bad_cases(cfg):
    acc_bits = addr_bits(cfg.acc_depth)
    sram_bits = max(addr_bits(cfg.inp_depth), addr_bits(cfg.wgt_depth), acc_bits)
    return [
        (Load(Buffer.INP, 1 << sram_bits, 0, 1, 1, 1), "sram_base"),
        (Load(Buffer.INP, 0, 1 << 32, 1, 1, 1), "dram_base"),
        (Load(Buffer.INP, 0, -1, 1, 1, 1), "dram_base"),
        (Load(Buffer.INP, 0, 0, 1 << 16, 1, 1), "y_size"),
        (Store(Buffer.ACC, 0, 0, 1, 1, 1 << 16), "x_stride"),
        (Load(Buffer.INP, 0, 0, 1, 1, 1, pad_top=256), "pad_top"),
        (Load(Buffer.INP, 0, 0, 1, 1, 1, pad_value=128), "pad_value"),
        (Load(Buffer.INP, 0, 0, 1, 1, 1, pad_value=-129), "pad_value"),
        (Gemm(1 << acc_bits, 0, 0), "acc_base"),
        (Gemm(0, 0, 0, (GemmLoop(1 << 16),)), "ext3"),
        (Gemm(0, 0, 0, (GemmLoop(2, 0, 0, 1 << addr_bits(cfg.wgt_depth)),)), "wgt_stride3"),
        (Alu(AluOp.ADD, 0, 0, 0, (AluLoop(2, 0, 1 << acc_bits, 0), AluLoop(1))), "a_stride1"),
        (Alu(AluOp.ADD, 0, 0, 0, imm=1 << 31), "imm"),
        (Alu(AluOp.ADD, 0, 0, 0, imm=-(1 << 31) - 1), "imm"),
        (Alu(AluOp.ADD, 0, 0, -1), "b_base"),
    ]


@pytest.mark.parametrize("name", PRESETS)
def test_out_of_range_field_names_index_and_field(name):
    cfg = CFGS[name]
    good = Sync(Engine.LOAD)
    for bad, field in _bad_cases(cfg):
        with pytest.raises(EncodeError) as ei:
            encode_program_words([good, good, good, bad, good], cfg)
        assert ei.value.index == 3
        msg = str(ei.value)
        assert msg.startswith("instruction 3: ") and f"'{field}'" in msg, msg
        assert bad.opcode.name in msg


def test_encode_edge_values_are_accepted():
    cfg = CFGS["default"]
    for ins in (Load(Buffer.INP, 4095, (1 << 32) - 1, 65535, 65535, 65535, 255, 255, 255, 255,
                     -128),
                Load(Buffer.INP, 0, 0, 1, 1, 1, pad_value=127),
                Alu(AluOp.ADD, 2047, 2047, 2047, imm=(1 << 31) - 1),
                Alu(AluOp.ADD, 0, imm=-(1 << 31)),
                Gemm(2047, 4095, 1023, (GemmLoop(65535, 2047, 4095, 1023),) * 4, True)):
        assert decode_instruction(encode_instruction(ins, cfg), cfg) == ins


def test_encode_rejects_non_instruction():
    with pytest.raises(EncodeError):
        encode_instruction("LOAD", CFGS["default"])  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- decode errors

def _words_bytes(cfg, ws):
    n = cfg.instruction_bits // 8
    return b"".join(w.to_bytes(n, "little") for w in ws)


@pytest.mark.parametrize("name", PRESETS)
def test_malformed_words_name_the_index(name):
    cfg = CFGS[name]
    finish = encode_instruction(Finish(), cfg)
    sync = encode_instruction(Sync(Engine.STORE), cfg)
    alu = encode_instruction(Alu(AluOp.MAX, 1, 2, 3), cfg)
    load = encode_instruction(Load(Buffer.ACC, 0, 0, 1, 1, 1), cfg)
    alu_op = widths(cfg, Opcode.ALU)["alu_op"][0]
    engine = widths(cfg, Opcode.SYNC)["engine"][0]
    norm = encode_instruction(Norm(NormOp.SOFTMAX, 0, 0, 0, 1, 8), cfg)
    norm_op = widths(cfg, Opcode.NORM)["norm_op"][0]
    bad = {
        "opcode 7": 7,
        "opcode 7 over FINISH": (finish & ~7) | 7,
        "bits above FINISH": finish | 1 << 7,
        "bits above SYNC": sync | 1 << 9,
        "top bit": load | 1 << (cfg.instruction_bits - 1),
        "alu_op 15": alu | 15 << alu_op,
        "first unused alu_op": (alu & ~(15 << alu_op)) | (int(max(AluOp)) + 1) << alu_op,
        "sync engine 3": sync | 3 << engine,
        "norm_op 3": norm | 3 << norm_op,
    }
    expect = {"opcode 7 over FINISH": "opcode", "opcode 7": "opcode", "bits above FINISH": "bits above",
              "bits above SYNC": "bits above", "top bit": "bits above", "alu_op 15": "alu_op",
              "first unused alu_op": "alu_op", "sync engine 3": "engine", "norm_op 3": "norm_op"}
    for label, word in bad.items():
        with pytest.raises(DecodeError) as ei:
            decode_program_words(_words_bytes(cfg, [finish, sync, word, finish]), cfg)
        assert ei.value.index == 2, label
        msg = str(ei.value)
        assert msg.startswith("instruction 2: ") and expect[label] in msg, (label, msg)


def test_every_buffer_value_decodes():
    """The 2-bit buffer field has no invalid value: all four decode (STORE of INP/WGT is
    rejected by the simulator's validation instead)."""
    cfg = CFGS["default"]
    for b in Buffer:
        w = encode_instruction(Store(b, 0, 0, 1, 1, 1), cfg)
        assert decode_instruction(w, cfg).buffer == b


def test_stream_not_whole_words():
    cfg = CFGS["default"]
    raw = encode_program_words([Finish()], cfg) + b"\0" * 3
    with pytest.raises(DecodeError, match="not a whole number"):
        decode_program_words(raw, cfg)


# ----------------------------------------------------------------------------- disassembler

def test_disassembler_shows_the_output_stage_and_broadcasts():
    from dsa_tvm.isa.disasm import disassemble_one
    from dsa_tvm.isa.semantics import pack_clip_imm, pack_requant_imm

    rq = Alu(AluOp.REQUANT, 0, 0, 100, (AluLoop(10, 2, 2, 0), AluLoop(2, 1, 1, 3)),
             imm=pack_requant_imm(-3, -3, 9))
    text = disassemble_one(rq)
    assert text.startswith("ALU    REQUANT acc[0] <- acc[0] + bias acc[100], mult acc[101], "
                           "shift acc[102], zp -3, clamp [-3, 9]")
    assert "10:dst2,a2,b0 x 2:dst1,a1,b3" in text
    bad = disassemble_one(Alu(AluOp.REQUANT, 0, 0, 4, imm=-1))
    assert "imm 0xffffffff (invalid: bits 25-31 set)" in bad
    bad_wide = disassemble_one(Alu(AluOp.REQUANT, 0, 0, 4, imm=(1 << 24) | 0x7F8000))
    assert "imm 0x017f8000 (invalid: wide with bits 8-23 set)" in bad_wide
    wide = disassemble_one(Alu(AluOp.REQUANT, 0, 0, 4, imm=pack_requant_imm(-3, wide=True)))
    assert "zp -3, clamp wide [-32768, 32767]" in wide
    clip = disassemble_one(Alu(AluOp.CLIP, 1, 1, use_imm=True, imm=pack_clip_imm(0, 6)))
    assert "#[0, 6]" in clip
    bcast = disassemble_one(Load(Buffer.ACC, 8, 40, 6, 1, 0))
    assert bcast == "LOAD   ACC  sram[8] <- dram[40] 6x1 stride 0"
