"""The import order of the project's packages, as data.

A module may import modules of its own layer or of any layer below it, never one
above (``tests/test_import_order.py`` checks every import, at module level and
inside functions). Layers, lowest first; a module belongs to the layer of the
longest prefix that names it.
"""

from __future__ import annotations

#: (layer name, module prefixes), lowest layer first.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # the hardware description every number comes from
    ("hw", ("dsa_tvm.hw", "dsa_tvm.intmath")),
    # the device: instruction set, simulator, hand-written programs (no TVM)
    ("isa/sim", ("dsa_tvm.isa", "dsa_tvm.sim", "dsa_tvm.cim", "dsa_tvm.programs", "dsa_tvm.gc_pause")),
    # the integer layer IR, its CPU oracle and its physics bounds
    ("layers", ("dsa_tvm.layers",)),
    # TIR compute, schedules, intrinsics, the tuning space
    ("tir_schedules", ("tir_schedules",)),
    # layers -> TIR -> instructions -> one program per region
    ("codegen", ("dsa_tvm.codegen", "dsa_tvm.lowering")),
    # ONNX intake (validation, opset upgrade, QOperator -> QDQ, node names for Relax)
    ("frontend", ("dsa_tvm.frontend", "dsa_tvm.ort_session")),
    # the Relax BYOC front end: patterns, constraints, partition, to-layers, offload
    ("relay_passes", ("relay_passes",)),
    # the dsa target, its Relax pipeline, the runtime and the reports
    ("compiler", ("dsa_tvm.target", "dsa_tvm.pipeline", "dsa_tvm.runtime", "dsa_tvm.report",
                  "dsa_tvm.plots", "dsa_tvm.compile_ids", "dsa_tvm.launch_batch")),
    # what users run on top of the compiler: quantization (post-training, and training in
    # the loop against the DSA's integers), then tuning and the bundled models
    ("quant", ("dsa_tvm.quant", "dsa_tvm.qat")),
    ("tuning/models", ("dsa_tvm.tuning", "dsa_tvm.models")),
    # the entry points: the package API, the CLI and its subcommands, the ONNX backend, and
    # the zoo's measurement, which drives a model through the public API end to end
    ("api/cli", ("dsa_tvm", "dsa_tvm.api", "dsa_tvm.cli", "dsa_tvm.cli_common",
                 "dsa_tvm.models.torch_zoo.measure",
                 "dsa_tvm.quantize_cli", "dsa_tvm.qat_cli", "dsa_tvm.tune_cli", "dsa_tvm.eval_cli",
                 "dsa_tvm.evaluation", "dsa_tvm.flow", "dsa_tvm.flow_pytorch",
                 "dsa_tvm.flow_result", "dsa_tvm.demo",
                 "dsa_tvm.sweep", "dsa_tvm.sweep_cli",
                 # decoder LLMs: prefill/decode steps against a KV cache, dsa-tvm generate
                 "dsa_tvm.llm", "dsa_tvm.generate_cli",
                 # analog crossbars on real models: dsa-tvm cim-sweep
                 "dsa_tvm.cim_study", "dsa_tvm.cim_sweep_cli",
                 "dsa_tvm.conformance", "dsa_tvm.onnx_backend",
                 # Relay-style facade (TVM <= 0.19 deploy scripts) over the Relax path
                 "dsa_tvm.relay", "dsa_tvm.graph_executor")),
)

#: The top-level packages whose imports are checked.
PACKAGES: tuple[str, ...] = ("dsa_tvm", "relay_passes", "tir_schedules")


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of ``module`` (a dotted name), by longest matching prefix."""
    best, best_len = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best < 0:
        raise KeyError(f"module {module!r} is in no layer of dsa_tvm.layering.LAYERS: add it")
    return best
