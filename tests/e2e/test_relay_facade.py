"""The Relay-style facade (``dsa_tvm.relay``, ``dsa_tvm.graph_executor``): a deploy script
written for TVM <= 0.19 runs with only its imports changed, gives what the Relax path
gives (bit-exact), survives export / load in a new process, and a user's mistakes get
ValueErrors that name the cause and the fix.

One DSA and one LLVM build of the bundled int8 small_cnn, shared by the module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import dsa_tvm
from dsa_tvm import graph_executor, relay
from dsa_tvm.models.quantize import output_quant_steps, run_onnxruntime
from dsa_tvm.models.zoo import get_model_path

ROOT = Path(__file__).resolve().parents[2]

#: a deploy script as the TVM <= 0.19 tutorials wrote it (``model_path``, ``x`` given)
OLD_SCRIPT = """\
import numpy as np
import onnx
import tvm
from tvm import relay
from tvm.contrib import graph_executor

onnx_model = onnx.load(model_path)
target = "dsa"
input_name = "input"
shape_dict = {input_name: x.shape}
mod, params = relay.frontend.from_onnx(onnx_model, shape_dict)

with tvm.transform.PassContext(opt_level=3):
    lib = relay.build(mod, target=target, params=params)

dev = tvm.cpu(0)
dtype = "float32"
m = graph_executor.GraphModule(lib["default"](dev))
m.set_input(input_name, x.astype(dtype))
m.run()
tvm_output = m.get_output(0).numpy()
"""

OLD_IMPORTS = "from tvm import relay\nfrom tvm.contrib import graph_executor\n"
NEW_IMPORTS = "from dsa_tvm import relay, graph_executor\n"


def _ported(target: str) -> str:
    """The old script with its imports changed (and, for the CPU build, its target line)."""
    script = OLD_SCRIPT.replace(OLD_IMPORTS, NEW_IMPORTS)
    return script.replace('target = "dsa"', f'target = "{target}"')


def _run_script(target: str, model_path: Path, x: np.ndarray) -> dict:
    namespace = {"model_path": str(model_path), "x": x}
    exec(compile(_ported(target), f"<old deploy script, target={target}>", "exec"), namespace)
    return namespace


def _relax_reference(model_path: Path, target: str, x: np.ndarray) -> np.ndarray:
    """The Relax path as the README shows it: load_onnx, from_onnx, tvm.compile, the VM."""
    mod = from_onnx(dsa_tvm.load_onnx(str(model_path)).model, keep_params_in_input=False)
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.fixture(scope="module")
def case():
    path = get_model_path("small_cnn", quantized=True)
    x = np.random.default_rng(7).normal(0, 1, (1, 3, 32, 32)).astype(np.float32)
    return {"path": path, "x": x, "dsa": _run_script("dsa", path, x)}


@pytest.fixture(scope="module")
def lib(case):
    return case["dsa"]["lib"]


def test_only_the_imports_change():
    old, new = OLD_SCRIPT.splitlines(), _ported("dsa").splitlines()
    assert [line for line in old if line not in new] == OLD_IMPORTS.splitlines()
    assert [line for line in new if line not in old] == NEW_IMPORTS.splitlines()


def test_old_script_on_the_dsa_matches_the_relax_path_and_onnxruntime(case):
    got, x = case["dsa"]["tvm_output"], case["x"]
    assert got.shape == (1, 10) and got.dtype == np.float32
    np.testing.assert_array_equal(got, _relax_reference(case["path"], "dsa", x))
    model = onnx.load(str(case["path"]))
    (step,) = output_quant_steps(model).values()
    ort = run_onnxruntime(model, {"input": x}, optimize=False)[0]
    assert step and np.abs(got - ort).max() <= step * (1 + 1e-3)


def test_reports_from_what_the_facade_holds(case, lib):
    m = case["dsa"]["m"]
    assert any(r.target == "dsa" for r in dsa_tvm.compile_report(lib).regions)
    assert dsa_tvm.compile_report(lib.executable).regions == dsa_tvm.compile_report(m.vm).regions
    assert any(row.target == "DSA" for row in dsa_tvm.run_report(m.vm).rows)
    assert lib.get_params() == {} and case["dsa"]["params"] == {}


def test_old_script_on_llvm_equals_the_relax_llvm_build(case):
    ns = _run_script("llvm", case["path"], case["x"])
    assert "dsa" not in list(ns["lib"].target.keys)
    np.testing.assert_array_equal(ns["tvm_output"], _relax_reference(case["path"], "llvm", case["x"]))


def test_unfrozen_params_bind_at_build(case):
    mod, params = relay.frontend.from_onnx(str(case["path"]), freeze_params=False)
    assert params and all(isinstance(v, tvm.runtime.Tensor) for v in params.values())
    m = graph_executor.GraphModule(relay.build(mod, target="dsa", params=params)["default"](tvm.cpu(0)))
    m.run(input=case["x"])
    np.testing.assert_array_equal(m.get_output(0).numpy(), case["dsa"]["tvm_output"])


LOADER = """\
import sys
import numpy as np
import tvm
import dsa_tvm
from dsa_tvm import graph_executor, relay

path, x = sys.argv[1], np.load(sys.argv[2])
lib = relay.load_module(path)                                   # was tvm.runtime.load_module(path)
m = graph_executor.GraphModule(lib["default"](tvm.cpu(0)))
m.set_input("input", x)
m.run()
direct = graph_executor.GraphModule(tvm.runtime.load_module(path))
direct.run(input=x)
assert np.array_equal(direct.get_output(0).numpy(), m.get_output(0).numpy())
assert any(row.target == "DSA" for row in dsa_tvm.run_report(m.vm).rows)
np.save(sys.argv[3], m.get_output(0).numpy())
"""


def test_export_and_load_in_a_new_process(case, lib, tmp_path):
    so, x_file, out_file = tmp_path / "m.so", tmp_path / "x.npy", tmp_path / "y.npy"
    lib.export_library(str(so))
    np.save(x_file, case["x"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", LOADER, str(so), str(x_file), str(out_file)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    np.testing.assert_array_equal(np.load(out_file), case["dsa"]["tvm_output"])


# ---------------------------------------------------------------------------- hostile use


@pytest.fixture
def m(lib):
    return graph_executor.GraphModule(lib["default"](tvm.cpu(0)))


def test_unknown_input_name_lists_the_inputs(m, case):
    with pytest.raises(ValueError, match=r"no input 'image'; its inputs are 'input'"):
        m.set_input("image", case["x"])
    with pytest.raises(ValueError, match=r"input index 3 is out of range: the model has 1 input"):
        m.set_input(3, case["x"])
    with pytest.raises(ValueError, match=r"set_input\('input'\) needs a value"):
        m.set_input("input")


def test_run_before_inputs_are_set_names_them(m):
    with pytest.raises(ValueError, match=r"input\(s\) 'input' not set; call set_input\('input', array\)"):
        m.run()
    with pytest.raises(ValueError, match=r"no outputs yet: call run\(\)"):
        m.get_output(0)


def test_wrong_shape_or_dtype_says_expected_and_got(m, case):
    x = case["x"]
    with pytest.raises(ValueError, match=r"expects float32 \(1, 3, 32, 32\), got float32 \(3, 32, 32\)"):
        m.set_input("input", x[0])
    with pytest.raises(ValueError, match=r"expects float32 \(1, 3, 32, 32\), got int8 .*astype\('float32'\)"):
        m.set_input("input", x.astype(np.int8))
    with pytest.raises(ValueError, match=r"expects float32 .* got float16 .*\(Tensor\)"):
        m.set_input("input", tvm.runtime.tensor(x.astype(np.float16)))
    m.set_input("input", x.astype(np.float64))  # float64 from np.random is cast, as it always was
    assert m.get_input("input").dtype == "float32"


def test_output_index_out_of_range_says_how_many(m, case):
    m.run(input=case["x"])
    assert m.get_num_outputs() == 1
    with pytest.raises(ValueError, match=r"output index 1 is out of range: the model has 1 output\(s\)"):
        m.get_output(1)


def test_build_and_factory_misuse(case, lib):
    mod = case["dsa"]["mod"]
    with pytest.raises(TypeError, match=r"takes the tvm.IRModule .*relay.frontend.from_onnx"):
        relay.build(onnx.load(str(case["path"])), target="dsa")
    with pytest.raises(ValueError, match=r"params name 'conv1.weight', which is not a parameter of main"):
        relay.build(mod, target="dsa", params={"conv1.weight": case["x"]})
    with pytest.raises(ValueError, match=r"runs on tvm.cpu\(0\), not on cuda"):
        lib["default"](tvm.cuda(0))
    with pytest.raises(NotImplementedError, match=r"no graph JSON.*export_library"):
        lib.get_graph_json()
    with pytest.raises(TypeError, match=r"convert_config not supported"):
        relay.frontend.from_onnx(str(case["path"]), convert_config={})


def test_onnx_names_tuple_outputs_and_cli_target_strings():
    """A graph input TVM renames (``in.1`` -> ``in_1``) is still set by its ONNX name, a
    two-output graph gives two outputs, an old ``"llvm -mcpu=..."`` string builds, and a
    plain ``tvm.compile`` result runs too."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["in.1"], ["a"]), helper.make_node("Neg", ["in.1"], ["b"])], "g",
        [helper.make_tensor_value_info("in.1", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("a", "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.warns(UserWarning, match="Renaming"):
        mod, _ = relay.frontend.from_onnx(model, {"in.1": (2, 3)})
    lib = relay.build(mod, target="llvm -mcpu=x86-64 -num-cores=2")
    assert lib.target.attrs["mcpu"] == "x86-64"
    m = graph_executor.GraphModule(lib["default"](tvm.cpu(0)))
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    for key in ("in.1", "in_1", 0):
        m.set_input(key, x)
        m.run()
        assert m.get_num_outputs() == 2
        np.testing.assert_array_equal(m.get_output(0).numpy(), np.maximum(x, 0))
        np.testing.assert_array_equal(m.get_output(1).numpy(), -x)
    with pytest.raises(ValueError, match=r"its inputs are 'in.1' \(Relax 'in_1'\)"):
        m.set_input("x", x)
    # a plain tvm.compile result carries no signature: names from the VM, no shape checks
    plain = graph_executor.GraphModule(tvm.compile(mod, target="llvm"))
    with pytest.raises(ValueError, match=r"known after the first run\(\)"):
        plain.get_num_outputs()
    plain.run(in_1=x)
    assert plain.get_num_outputs() == 2
    np.testing.assert_array_equal(plain.get_output(1).numpy(), -x)
