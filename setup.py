"""Build hook: ship the hardware presets (``target/*.toml``) inside the wheel.

``target/`` at the top of the repository stays the presets' one source of truth; the
build copies its TOML files into the built package as ``dsa_tvm/_presets`` (where
``dsa_tvm.hw.config.presets_dir`` looks in an installed copy). Everything else is in
``pyproject.toml``.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PRESETS = Path(__file__).resolve().parent / "target"


class BuildPyWithPresets(build_py):
    """``build_py`` plus the copy of ``target/*.toml`` into ``dsa_tvm/_presets``."""

    def run(self) -> None:
        super().run()
        tomls = sorted(PRESETS.glob("*.toml"))
        if not tomls:
            raise RuntimeError(f"no hardware presets in {PRESETS}: the wheel would not load")
        dest = Path(self.build_lib) / "dsa_tvm" / "_presets"
        dest.mkdir(parents=True, exist_ok=True)
        for f in tomls:
            shutil.copyfile(f, dest / f.name)


setup(cmdclass={"build_py": BuildPyWithPresets})
