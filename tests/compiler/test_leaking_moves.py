"""A move the pattern would take in (attention's head merge before a dense) whose result is
also read elsewhere: the merged-heads match is refused and its report line says why, the
plain dense still runs on the DSA, and the compile never fails (a composite must return one
int8 tensor). Against TVM's llvm build."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("tvm")

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import dsa_tvm  # noqa: E402


def _c(v, dtype):
    return relax.const(np.asarray(v, dtype), dtype)


def _module() -> tvm.IRModule:
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 2, 8, 16), "int8"))
    w = rng.integers(-127, 128, (32, 24), dtype=np.int8)
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))
            merged = bb.emit(relax.op.reshape(p, (1, 8, 32)))
            d = bb.emit(relax.op.dequantize(merged, _c(0.05, "float32"), _c(0, "int8")))
            wd = bb.emit(relax.op.dequantize(_c(w, "int8"), _c(0.01, "float32"), _c(0, "int8")))
            mm = bb.emit(relax.op.matmul(d, wd))
            y = bb.emit(relax.op.quantize(mm, _c(0.2, "float32"), _c(3, "int8")))
            out = bb.emit_output(relax.Tuple([y, merged]))  # the merge is read outside too
        bb.emit_func_output(out)
    return bb.get()


def test_leaking_head_merge_stays_on_the_cpu_and_the_dense_offloads():
    mod = _module()
    cfg = dsa_tvm.load_config("default").replace(cpu_gmacs=0.001)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no internal error survived on the CPU
        dsa = tvm.compile(mod, target=dsa_tvm.target(cfg))
    rep = dsa_tvm.compile_report(dsa)
    assert [d.target for d in rep.regions] == ["dsa"], str(rep)
    assert [ly.split(":")[-1] for ly in rep.regions[0].layers] == ["dense"], str(rep)
    llvm = tvm.compile(mod, target="llvm")
    x = np.random.default_rng(1).integers(-128, 128, (1, 2, 8, 16), dtype=np.int8)
    got = relax.VirtualMachine(dsa, tvm.cpu())["main"](tvm.runtime.tensor(x))
    want = relax.VirtualMachine(llvm, tvm.cpu())["main"](tvm.runtime.tensor(x))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
