"""The instruction emitter of the hand-written conv2d programs (:mod:`.conv2d`): one
tile plan in, loads/GEMMs/REQUANTs/stores with their dependency tokens out."""

from __future__ import annotations

import numpy as np

from ..isa.builder import ProgramBuilder
from ..isa.instructions import AluOp, Buffer, Engine
from .common import QPARAM_ROWS
from .conv2d_geometry import (
    _MAX_SIZE,
    ConvGeometry,
    _gemm_nest,
    _Plan,
)


class _Emitter:
    def __init__(self, cfg, g: ConvGeometry, p: _Plan, b: ProgramBuilder, rx, rw, rq, rb, ro,
                 input_zp, requant_imm, requant, relu):
        self.cfg, self.g, self.p, self.b = cfg, g, p, b
        self.rx, self.rw, self.rq, self.rb, self.ro = rx, rw, rq, rb, ro
        self.input_zp, self.requant_imm = input_zp, requant_imm
        self.requant, self.relu = requant, relu
        self.rzp = None

    # ---- steps
    def _steps(self):
        g, t = self.g, self.p.tiling
        sp = [(oh0, min(t.tile_oh, g.oh - oh0), ow0, min(t.tile_ow, g.ow - ow0))
              for oh0 in range(0, g.oh, t.tile_oh) for ow0 in range(0, g.ow, t.tile_ow)]
        oc = [(o0, min(t.tile_ocb, g.ocb - o0)) for o0 in range(0, g.ocb, t.tile_ocb)]
        kc = [(k0, min(t.tile_icb, g.icb - k0)) for k0 in range(0, g.icb, t.tile_icb)]
        tiles = [(s, o) for o in oc for s in sp] if t.ocb_outer else [(s, o) for s in sp
                                                                       for o in oc]
        return tiles, kc

    def run(self) -> None:
        b, p, g = self.b, self.p, self.g
        nbuf = p.nbuf
        prows = p.param_rows_per_ocb
        loaded_params = None
        if p.params_resident and prows:
            self._load_params(0, g.ocb)
            loaded_params = "all"
        tiles, kc = self._steps()
        steps = [(ti, ki) for ti in range(len(tiles)) for ki in range(len(kc))]
        inp_slot_of, wgt_slot_of, groups = self._schedule_loads(tiles, kc, steps)
        for s, (ti, ki) in enumerate(steps):
            (oh0, toh, ow0, tow), (o0, tocb) = tiles[ti]
            k0, ticb = kc[ki]
            first_k, last_k = ki == 0, ki == len(kc) - 1
            acc0 = (ti % nbuf) * p.acc_slot
            # ---- load engine: what this step needs first, then prefetches
            # (the step's GEMM waits only for the loads it needs; later loads are in order
            # behind the push, so the steps they are for see them done)
            wait_free = s >= nbuf
            needed = [ld for pri, ld in groups[s] if pri == 0]
            prefetch = [ld for pri, ld in groups[s] if pri == 1]
            if not needed:
                b.sync(Engine.LOAD, pop_next=wait_free, push_next=True)
            for j, ld in enumerate(needed + prefetch):
                ld = dict(ld)
                pad = tuple(ld.pop(k, 0) for k in ("pad_top", "pad_bottom", "pad_left",
                                                  "pad_right"))
                b.load(**ld, pad=pad, pop_next=wait_free and j == 0 and bool(needed),
                       push_next=j == len(needed) - 1)
            # ---- compute engine
            if prows and not p.params_resident and first_k and loaded_params != o0:
                self._load_params(o0, tocb)
                loaded_params = o0
            loops, peeled = _gemm_nest(g, toh, tow, tocb, ticb, g.tile_cols(tow))
            alu: list[tuple] = []
            if last_k:
                pix = toh * tow
                if self.requant:  # bias, requantize, zero point, ReLU: one pass
                    alu.append((AluOp.REQUANT, self._param_row(o0), QPARAM_ROWS,
                                dict(imm=self.requant_imm)))
                else:
                    if self.rb is not None:
                        alu.append((AluOp.ADD, self._param_row(o0), 1, {}))
                    if self.relu:
                        alu.append((AluOp.MAX, 0, 0, dict(imm=0, use_imm=True)))
            inp0, wgt0 = inp_slot_of[s], wgt_slot_of[s]
            for j, (da, di, dw) in enumerate(peeled):
                last_c = j == len(peeled) - 1
                b.gemm(acc0 + da, inp0 + di, wgt0 + dw, loops, reset=first_k,
                       pop_prev=j == 0, pop_next=j == 0 and first_k and ti >= nbuf,
                       push_prev=last_c, push_next=last_c and last_k and not alu)
            for j, (op, b0, bstride, kw_) in enumerate(alu):
                lp = [(pix, tocb, tocb, 0), (tocb, 1, 1, bstride)]
                if kw_.get("use_imm"):
                    lp = [(pix * tocb, 1, 1, 0)]
                b.alu(op, acc0, acc0, b0, lp, push_next=j == len(alu) - 1, **kw_)
            # ---- store engine
            if last_k:
                self._stores(acc0, oh0, toh, ow0, tow, o0, tocb)
        # the last stores must finish before FINISH: take their tokens in order
        for _ in range(min(nbuf, len(tiles)) - 1):
            b.sync(Engine.COMPUTE, pop_next=True)
        b.finish(pop_next=True)

    def _schedule_loads(self, tiles, kc, steps):
        """Slots every step reads, and the LOADs each step's load group issues.

        A new input tile or weight tile is an *event* c into slot c % nbuf. The step
        s that pops compute->load gets the token of GEMM s - nbuf, so the event may be
        loaded from step ``first_use(c - nbuf + 1) - 1 + nbuf`` (its slot's previous
        tile is no longer read) up to its first use. Weight tiles are split into row
        pieces spread over that window, so a large weight tile streams in behind the
        compute of several steps instead of stalling one; inputs go in whole at the
        start of their window. Group entries are (priority, load): 0 = needed by this
        step, 1 = prefetch.
        """
        g, p, b, cfg = self.g, self.p, self.b, self.cfg
        nbuf = p.nbuf
        groups: list[list] = [[] for _ in steps]
        slot_of = {}
        for kind in ("inp", "wgt"):
            keys = []
            for ti, ki in steps:
                sp, oc = tiles[ti]
                keys.append((sp, kc[ki]) if kind == "inp" else (oc, kc[ki]))
            firsts = [s for s in range(len(steps)) if s == 0 or keys[s] != keys[s - 1]]
            size = p.inp_slot if kind == "inp" else p.wgt_slot
            slots = []
            for c, n in enumerate(firsts):
                nxt = firsts[c + 1] if c + 1 < len(firsts) else len(steps)
                base = (c % nbuf) * size
                slots += [base] * (nxt - n)
                e = 0 if c < nbuf else min(n, firsts[c - nbuf + 1] - 1 + nbuf)
                if kind == "inp":
                    (oh0, toh, ow0, tow), (k0, ticb) = keys[n]
                    pieces = self._input_loads(base, oh0, toh, ow0, tow, k0, ticb)
                    for ld in pieces:
                        groups[e].append((int(e != n), ld))
                    continue
                (o0, tocb), (k0, ticb) = keys[n]
                rows = tocb * g.kh * g.kw
                window = n - e + 1
                xfer = rows * ticb * cfg.wgt_tile_bytes / cfg.bandwidth_bytes_per_cycle
                npieces = max(1, min(window, rows, int(xfer // (4 * max(cfg.latency_cycles, 1)))))
                dram0 = b.addr(self.rw, Buffer.WGT, (o0 * g.kh * g.kw * g.icb + k0)
                               * cfg.wgt_tile_bytes)
                for j in range(npieces):
                    r0, r1 = rows * j // npieces, rows * (j + 1) // npieces
                    at = n - (npieces - 1 - j) * window // npieces
                    groups[at].append((int(at != n), dict(
                        buffer=Buffer.WGT, sram_base=base + r0 * ticb,
                        dram_base=dram0 + r0 * g.icb, y_size=r1 - r0, x_size=ticb,
                        x_stride=g.icb if r1 - r0 > 1 else ticb)))
            slot_of[kind] = slots
        return slot_of["inp"], slot_of["wgt"], groups

    # ---- pieces
    def _param_row(self, o0: int) -> int:
        """First parameter row (REQUANT group or bias row) of output block ``o0``."""
        prows = self.p.param_rows_per_ocb
        return self.p.param_base + (prows * o0 if self.p.params_resident else 0)

    def _load_params(self, o0: int, n: int) -> None:
        """ACC LOAD (compute engine) of the parameter rows of blocks o0..o0+n-1: the REQUANT
        groups (bias, mult, shift) or, for int32 output, the bias rows."""
        b, row = self.b, self.cfg.acc_row_bytes
        src = self.rq if self.rq is not None else self.rb
        prows = self.p.param_rows_per_ocb
        b.load(Buffer.ACC, self.p.param_base, b.addr(src, Buffer.ACC, o0 * prows * row),
               1, prows * n)

    def _zp_region(self):
        if self.rzp is None:
            self.rzp = self.b.region("zp", "const", (self.cfg.block_in,), "int8",
                                     data=np.full(self.cfg.block_in, self.input_zp, np.int8))
        return self.rzp

    def _fill(self, sram: int, nrows: int) -> list[dict]:
        """LOADs writing ``nrows`` INP rows of the input zero point (stride-0 reads)."""
        out = []
        src = self.b.addr(self._zp_region(), Buffer.INP)
        while nrows > 0:
            n = min(nrows, _MAX_SIZE)
            out.append(dict(buffer=Buffer.INP, sram_base=sram, dram_base=src, y_size=n,
                            x_size=1, x_stride=0))
            sram += n
            nrows -= n
        return out

    def _input_loads(self, inp0: int, oh0: int, toh: int, ow0: int, tow: int, k0: int,
                     ticb: int) -> list[dict]:
        g, b = self.g, self.b
        rows = g.tile_rows(toh)
        cols = g.tile_cols(tow)
        used = g.tile_cols_used(tow)
        img_rows = [g.row_of(oh0, i) for i in range(rows)]
        valid_r = [i for i, r in enumerate(img_rows) if 0 <= r < g.h]
        img_cols = [g.col_of(ow0, j) for j in range(used)]
        valid_c = [j for j, c in enumerate(img_cols) if 0 <= c < g.w]
        zp = self.input_zp
        if not valid_r or not valid_c:
            return self._fill(inp0, rows * cols * ticb)
        r0, r1 = valid_r[0], valid_r[-1] + 1
        c0, c1 = valid_c[0], valid_c[-1] + 1
        row_step = g.sh if g.row_skip else 1
        if self.p.block_loads:
            ny, nx = r1 - r0, (c1 - c0) * g.icb
            return [dict(buffer=Buffer.INP, sram_base=inp0,
                          dram_base=b.addr(self.rx, Buffer.INP,
                                           (img_rows[r0] * g.w + img_cols[c0]) * g.icb
                                           * self.cfg.block_in),
                          y_size=ny, x_size=nx, x_stride=row_step * g.w * g.icb if ny > 1 else nx,
                          pad_top=r0, pad_bottom=rows - r1, pad_left=c0 * g.icb,
                          pad_right=(cols - c1) * g.icb, pad_value=zp)]
        # one LOAD per tile row: y = pixels (every col_step-th), x = the chunk's blocks
        out = []
        row_len = cols * ticb
        if r0:
            out += self._fill(inp0, r0 * row_len)
        for i in range(r0, r1):
            out.append(dict(buffer=Buffer.INP, sram_base=inp0 + i * row_len,
                            dram_base=b.addr(self.rx, Buffer.INP,
                                             ((img_rows[i] * g.w + img_cols[c0]) * g.icb + k0)
                                             * self.cfg.block_in),
                            y_size=c1 - c0, x_size=ticb,
                            x_stride=g.icb * g.col_step if c1 - c0 > 1 else ticb,
                            pad_top=c0, pad_bottom=cols - c1, pad_value=zp))
        if rows - r1:
            out += self._fill(inp0 + r1 * row_len, (rows - r1) * row_len)
        return out

    def _stores(self, acc0: int, oh0: int, toh: int, ow0: int, tow: int, o0: int,
                tocb: int) -> None:
        g, b = self.g, self.b
        buf = Buffer.ACC8 if self.requant else Buffer.ACC
        esize = self.cfg.block_out * (1 if self.requant else 4)

        def addr(oh, ow):
            return b.addr(self.ro, buf, ((oh * g.ow + ow) * g.ocb + o0) * esize)

        if tocb == g.ocb and g.ow * g.ocb <= _MAX_SIZE:
            sts = [(acc0, addr(oh0, ow0), toh, tow * tocb, g.ow * g.ocb)]
        elif tow == g.ow:
            sts = [(acc0, addr(oh0, ow0), toh * tow, tocb, g.ocb)]
        else:
            sts = [(acc0 + i * tow * tocb, addr(oh0 + i, ow0), tow, tocb, g.ocb)
                   for i in range(toh)]
        for j, (s0, d0, y, x, st) in enumerate(sts):
            b.store(buf, s0, d0, y, x, st if y > 1 else x, pop_prev=j == 0,
                    push_prev=j == len(sts) - 1)
