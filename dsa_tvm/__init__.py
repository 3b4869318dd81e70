"""dsa-tvm: deploy trained models to a domain-specific AI accelerator with Apache TVM.

The device layer (hardware descriptions, instruction set, simulator) imports
no TVM; the compiler layers above it do.
"""

from .hw.config import ConfigError, HardwareConfig, load_config, preset_names
from .isa.builder import ProgramBuilder
from .isa.disasm import disassemble
from .isa.program import Program
from .sim.errors import DeadlockError, HazardError, SimulationError
from .sim.simulator import SimResult, Simulator

__version__ = "0.1.0"

__all__ = [
    "ConfigError", "DeadlockError", "HardwareConfig", "HazardError", "Program", "ProgramBuilder",
    "SimResult", "SimulationError", "Simulator", "disassemble", "load_config", "preset_names",
]
