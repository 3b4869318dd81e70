"""PyTorch models into Relax: ``torch.export`` then TVM's ``from_exported_program``.

The import half of :func:`dsa_tvm.from_pytorch` (quantizing is a layer above). It takes
a module, an ``ExportedProgram`` or a ``.pt2`` file written by ``torch.export.save``,
and turns every way this can fail (no torch, a module ``torch.export`` cannot trace, an
aten op TVM's importer lacks) into an :class:`IntakeError` that says the cause and a fix.
torch is imported only when a PyTorch model is imported.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .intake import IntakeError

ONNX_ROUTE = ("or export it to ONNX (torch.onnx.export) and compile the .onnx file, which goes "
              "through dsa_tvm.load_onnx")


def _torch():
    try:
        import torch
    except ImportError:
        raise IntakeError("importing a PyTorch model needs torch, which is not installed; "
                          "pip install torch (the CPU build is enough)") from None
    return torch


def as_example_args(example_inputs: Any) -> tuple[tuple, dict]:
    """``(args, kwargs)`` for ``torch.export.export`` from a tensor, an array, a sequence of
    them or a dict of them by parameter name; numpy arrays become tensors."""
    torch = _torch()

    def tensor(v: Any, where: str):
        if isinstance(v, torch.Tensor):
            return v
        if isinstance(v, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(v))
        raise IntakeError(f"example input {where} is a {type(v).__name__}; pass torch tensors or "
                          f"numpy arrays (one, a tuple of them, or a dict by forward() parameter)")

    if isinstance(example_inputs, Mapping):
        return (), {str(k): tensor(v, repr(k)) for k, v in example_inputs.items()}
    if isinstance(example_inputs, Sequence) and not isinstance(example_inputs, (str, bytes)):
        if not example_inputs:
            raise IntakeError("example_inputs is empty; pass one example tensor per forward() "
                              "argument, e.g. (torch.randn(1, 3, 224, 224),)")
        return tuple(tensor(v, f"#{i}") for i, v in enumerate(example_inputs)), {}
    return (tensor(example_inputs, "#0"),), {}


@contextlib.contextmanager
def _eval_mode(module) -> Iterator[bool]:
    """Export in inference mode (batch-norm statistics, no dropout) and give the module its
    mode back; yields whether it was training."""
    was_training = bool(getattr(module, "training", False))
    if was_training:
        module.eval()
    try:
        yield was_training
    finally:
        if was_training:
            module.train()


def export_program(model: Any, example_inputs: Any = None, notes: list[str] | None = None):
    """A ``torch.export.ExportedProgram`` of ``model`` (module, program or ``.pt2`` path)."""
    torch = _torch()
    notes = notes if notes is not None else []
    if isinstance(model, (str, Path)):
        return _load_pt2(Path(model), torch)
    if isinstance(model, torch.export.ExportedProgram):
        return model
    if not isinstance(model, torch.nn.Module):
        raise IntakeError(f"a {type(model).__name__} is not a PyTorch model; pass a "
                          f"torch.nn.Module, a torch.export.ExportedProgram or a .pt2 file")
    if example_inputs is None:
        raise IntakeError("a torch.nn.Module needs example_inputs to be traced; pass one example "
                          "tensor per forward() argument, e.g. (torch.randn(1, 3, 224, 224),)")
    args, kwargs = as_example_args(example_inputs)
    with _eval_mode(model) as was_training, torch.no_grad():
        if was_training:
            notes.append("the module was in training mode: exported in eval mode (batch-norm "
                         "running statistics, no dropout) and put back in training mode")
        try:
            return torch.export.export(model, args, kwargs)
        except Exception as e:  # noqa: BLE001 - torch.export raises many types; all mean "cannot trace"
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise IntakeError(f"torch.export could not trace {type(model).__name__} "
                              f"({type(e).__name__}: {first}); make forward() traceable "
                              f"(no data-dependent Python control flow; torch.cond for branches), "
                              f"{ONNX_ROUTE}") from e


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """``logger``'s warnings held back: the failure becomes one IntakeError line."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _load_pt2(path: Path, torch):
    if path.is_dir() or not path.is_file():
        raise IntakeError(f"PyTorch program '{path}' {'is a folder' if path.is_dir() else 'not found'}"
                          f"; pass a file written by torch.export.save(program, 'model.pt2')")
    try:
        with _quiet("torch.export"):  # it logs a traceback before the error we report
            return torch.export.load(str(path))
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file fails in many ways
        raise IntakeError(f"'{path}' is not a torch.export program ({type(e).__name__}: "
                          f"{str(e)[:200]}); write it with torch.export.save(torch.export.export("
                          f"model, example_args), '{path.name}')") from e


def to_relax(program) -> Any:
    """The Relax module of an ``ExportedProgram``: weights bound as constants, a single
    output returned as itself (not a one-element tuple)."""
    from tvm.relax.frontend.torch import from_exported_program

    try:
        with warnings.catch_warnings():  # TVM 0.27's importer uses a pytree API torch deprecates
            warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
            return from_exported_program(program, keep_params_as_input=False,
                                         unwrap_unit_return_tuple=True)
    except Exception as e:  # noqa: BLE001 - the importer asserts on ops it lacks
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise IntakeError(f"TVM's PyTorch importer cannot translate this program "
                          f"({type(e).__name__}: {first}); replace the named op in forward() "
                          f"with supported ones, {ONNX_ROUTE}") from e


def import_pytorch(model: Any, example_inputs: Any = None,
                   notes: list[str] | None = None):
    """``(relax IRModule, ExportedProgram)`` of a PyTorch model as exported by torch.export."""
    program = export_program(model, example_inputs, notes)
    return to_relax(program), program


def input_shapes(program) -> dict[str, tuple[int, ...]]:
    """The user inputs of an exported program by name, with their example shapes."""
    spec = program.graph_signature
    fake = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    out = {}
    for name in spec.user_inputs:
        val = fake.get(name)
        if val is None or not hasattr(val, "shape"):
            continue
        try:
            out[name] = tuple(int(d) for d in val.shape)
        except TypeError:
            raise IntakeError(f"input '{name}' of the exported program has a symbolic shape "
                              f"{tuple(val.shape)}; export with static shapes (no dynamic_shapes)"
                              f" so the DSA gets fixed tile sizes") from None
    return out
