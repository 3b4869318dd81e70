"""What every ``dsa-tvm`` subcommand shares: the error a bad argument raises, reading a
model argument, the ``--hw`` type, the exit code of a handled Ctrl-C and the norm flags
``quantize`` and ``qat`` both take.

Kept apart from ``cli.py`` (which registers the subcommands) so the subcommands
(``tune_cli.py``) import it without importing the command line that imports them.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

from .frontend.validate import read_model as read_onnx
from .hw.config import shadowed_by


class CliError(Exception):
    """A bad argument or input: ``main`` prints it as one ``dsa-tvm: error:`` line (exit 2).
    The message says the cause, then after ``; `` the fix."""


def read_model(spec: str):
    """The ONNX model file ``spec`` read and parsed (None for a bundled model name); the
    intake's error naming the cause for a folder, a missing, unreadable or truncated file."""
    p = Path(spec)
    if p.suffix != ".onnx" and not p.exists():
        return None  # a bundled model name (flow.load_model lists them if it is unknown)
    return read_onnx(p)[0]


def hw_spec(text: str) -> str:
    """``--hw``: a preset name means the preset even when a file or folder here has that
    name (a TOML file is named with its ``.toml`` suffix); a warning line says so."""
    other = shadowed_by(text)
    if other is not None:
        kind = "folder" if other.is_dir() else "file"
        print(f"dsa-tvm: warning: --hw {text} is the bundled preset '{text}', not the {kind} "
              f"{other} (give a TOML file with its .toml suffix)", file=sys.stderr)
    return text


def interrupted() -> int:
    """Exit code 130 for a handled Ctrl-C, and make the interpreter honour it.

    CPython 3.11 sets ``_Py_UnhandledKeyboardInterrupt`` when a KeyboardInterrupt leaves
    code run through ``exec``/``eval`` of a string, even if a caller handles it, and then
    ends the process by SIGINT instead of with the exit code (seen with tuning
    interrupted inside TVM). The flag is cleared here; where the symbol does not exist
    (other Python versions) nothing is done."""
    try:
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ValueError, AttributeError):
        pass
    return 130


def at_least(minimum: int):
    """argparse type of a count option: a whole number >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {n})")
        return n
    return parse


#: --trials, --workers, --limit
at_least_one = at_least(1)


def add_norm_args(parser: argparse.ArgumentParser, also: str = "") -> None:
    """``--quantize-norms`` and ``--wide-norms`` (``quantize_norms`` / ``wide_norms`` of
    ``quantize_onnx`` and ``qat.prepare``); ``also``: what else the first one makes
    integer."""
    parser.add_argument("--quantize-norms", action="store_true",
                        help=f"softmax, LayerNorm and RMSNorm{also} integer on the DSA's [norm] "
                             f"units (default: FP32 on the CPU)")
    parser.add_argument("--wide-norms", action="store_true",
                        help="with --quantize-norms: every norm's input and output and the "
                             "residual adds before them on int16 grids (a transformer's "
                             "residual stream)")
