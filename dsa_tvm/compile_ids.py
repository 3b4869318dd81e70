"""Which compile an executable came from: a function in the module that returns its id.

Every DSA compile gets an id (``uuid4().hex``), written into each of its programs'
meta (a launch then finds its compile) and into the module as a Relax function
:data:`ID_FUNCTION` that returns it. TVM 0.27 offers no way to read an executable's
constants from Python, but any ``VirtualMachine`` of it can call that function, so
the id survives ``export_library`` / ``load_module`` like the programs do.
"""

from __future__ import annotations

from typing import Any

#: the Relax function of every DSA-compiled module that returns its compile's id
ID_FUNCTION = "dsa_compile_id"


class UnknownCompileError(LookupError):
    """No compile report (or run) is known for this executable in this process."""


def with_compile_id(mod, compile_id: str):
    """A copy of ``mod`` with the function :data:`ID_FUNCTION` returning ``compile_id``."""
    from tvm import relax

    out = mod.clone()
    out[ID_FUNCTION] = relax.Function([], relax.expr.String(compile_id)).with_attr(
        "global_symbol", ID_FUNCTION)
    return out


def compile_id_of(executable: Any) -> str:
    """The compile id of a ``relax.VirtualMachine``, a ``tvm.compile`` result or a module
    loaded with ``tvm.runtime.load_module``."""
    import tvm
    from tvm import relax

    if isinstance(executable, relax.VirtualMachine):
        vm = executable
    elif isinstance(executable, (tvm.runtime.Executable, tvm.runtime.Module)):
        vm = relax.VirtualMachine(executable, tvm.cpu())
    else:
        raise TypeError(f"expected a relax.VirtualMachine or the executable tvm.compile "
                        f"returned, got {type(executable).__name__}")
    try:
        fn = vm[ID_FUNCTION]
    except AttributeError:
        raise UnknownCompileError(
            "this executable was not compiled for the DSA (it has no "
            f"'{ID_FUNCTION}' function): build it with tvm.compile(mod, "
            "target=dsa_tvm.target(...)) to get a compile report") from None
    return str(fn())
