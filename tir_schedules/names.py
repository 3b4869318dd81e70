"""Names shared by the TIR layer (which emits them) and the TIR walker (which reads them).

The walker (``dsa_tvm.codegen.walker``) sits above ``tir_schedules`` and reads the
scopes, annotations and call names the schedules leave in the TIR from here.
"""

#: SRAM storage scopes of the three scratchpads.
SCOPE_INP = "global.dsa_inp"
SCOPE_WGT = "global.dsa_wgt"
SCOPE_ACC = "global.dsa_acc"
SCOPES = {SCOPE_INP: "inp", SCOPE_WGT: "wgt", SCOPE_ACC: "acc"}

#: extern calls left in the TIR by tensorized intrinsics
CALL_GEMM = "dsa.gemm"          # (acc.data, acc_off, inp.data, inp_off, wgt.data, wgt_off)
CALL_REQUANT = "dsa.requant"    # (dst.data, dst_off, src.data, src_off, prm.data, prm_off, imm)
CALL_ALU = "dsa.alu"            # (op, dst.data, dst_off, a.data, a_off, b.data, b_off, imm, use_imm)

#: the scalar function the untensorized requantize stage calls
SCALAR_REQUANT = "dsa.requant_scalar"  # (acc, bias, mult, shift, zp, lo, hi)

#: loop annotation: the scratchpad tiles allocated under this loop get two slots
ANN_DOUBLE_BUFFER = "dsa.double_buffer"
