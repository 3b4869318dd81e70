"""dsa-tvm: deploy trained models to a domain-specific AI accelerator with Apache TVM.

The device layer (hardware descriptions, instruction set, simulator) imports
no TVM; the compiler layers above it do.
"""

from tir_schedules.options import CompileOptions, options

from .api import (  # noqa: A004
    compile,
    compile_report,
    from_pytorch,
    last_compile_report,
    last_run_report,
    run_report,
    setup,
)
from .compile_ids import UnknownCompileError
from .evaluation import EvalReport, evaluate
from .frontend.intake import Intake, IntakeError, load_onnx
from .hw.config import ConfigError, HardwareConfig, load_config, preset_names
from .isa.builder import ProgramBuilder
from .isa.disasm import disassemble
from .isa.program import Program
from .quant import quantize
from .sim.errors import DeadlockError, HazardError, SimulationError
from .sim.simulator import SimResult, Simulator
from .target import target
from .tuning import tune, tuned

setup()

__version__ = "0.1.0"

__all__ = [
    "CompileOptions", "ConfigError", "DeadlockError", "EvalReport", "HardwareConfig",
    "HazardError", "Intake",
    "IntakeError", "Program", "ProgramBuilder",
    "SimResult", "SimulationError", "Simulator", "UnknownCompileError", "compile",
    "compile_report", "disassemble", "evaluate", "from_pytorch", "last_compile_report",
    "last_run_report", "load_config",
    "load_onnx", "options", "preset_names", "quantize", "run_report", "setup", "target", "tune", "tuned",
]
