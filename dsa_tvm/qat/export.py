"""``export``: a prepared (and fine-tuned) module -> the QDQ ONNX model the compiler takes.

The TorchScript exporter traces the module in ``export`` mode, where every integer
layer writes its own codes and scales (:mod:`.onnx_ops`): int8 (or int4-valued) weight
codes per output channel, int32 biases at input x weight scale, a Q/DQ pair on every
activation grid (int16 ones, ``wide_norms``, need opset 21: the model is then upgraded).
The DSA compiled from it computes the prepared module's integers.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import onnx
import torch
from torch import fx

from ..quant.api import WIDE_OPSET, with_opset
from .errors import QatError
from .layers import grids, set_mode

OPSET = 17


def export(module: fx.GraphModule, path: str | Path | None = None,
           example_inputs: tuple[torch.Tensor, ...] | None = None) -> onnx.ModelProto:
    """The QDQ ONNX model of a prepared module (written to ``path`` when given). Inputs are
    named after ``forward``'s parameters; shapes are ``example_inputs``' (default: the
    ones ``prepare`` took)."""
    if not hasattr(module, "qat_report"):
        raise QatError("export takes a module returned by dsa_tvm.qat.prepare; prepare it first")
    args = tuple(example_inputs) if example_inputs is not None else module.qat_example
    names = [n.name for n in module.graph.nodes if n.op == "placeholder"]
    buf = io.BytesIO()
    was_training = module.training
    module.eval()
    set_mode(module, "export")
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, buf, input_names=names, opset_version=OPSET,
                              do_constant_folding=True, dynamo=False)
    except torch.onnx.errors.UnsupportedOperatorError as e:
        first = str(e).strip().splitlines()[0]
        raise QatError(f"export: {first} (an op the prepared module runs in FP32): write it "
                       f"in plainer PyTorch ops in the module, or move it out of the module"
                       ) from None
    finally:
        set_mode(module, "quant")
        module.train(was_training)
    model = onnx.load_from_string(buf.getvalue())
    if any(g.wide for g in grids(module)):   # int16 Q/DQ
        model = with_opset(model, WIDE_OPSET, "prepare without wide_norms")
    if path is not None:
        onnx.save(model, str(path))
    return model
