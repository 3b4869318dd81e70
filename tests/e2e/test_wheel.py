"""A regular install works: the built wheel carries the hardware presets.

The wheel is built the way ``pip install .`` builds it (``pip wheel``, no
dependencies, no isolated build environment: everything is installed already),
from a copy of the source files so the checkout stays clean, then unpacked and
imported from outside the source tree, where ``target/`` is not reachable.
Runs in CI like every test (about 5-15 s); deselect with ``-m "not packaging"``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "target", "dsa_tvm",
           "relay_passes", "tir_schedules"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "_presets"))
        else:
            shutil.copy(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True, timeout=120,
                   env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"))
    (whl,) = out.glob("dsa_tvm-*.whl")
    return whl


@pytest.mark.packaging
def test_wheel_ships_every_preset(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n for n in names if n.startswith("dsa_tvm/_presets/"))
    assert shipped == [f"dsa_tvm/_presets/{p.name}" for p in sorted((ROOT / "target").glob("*.toml"))]
    for p in (ROOT / "target").glob("*.toml"):   # the same bytes as the source of truth
        assert zipfile.ZipFile(wheel).read(f"dsa_tvm/_presets/{p.name}") == p.read_bytes()


@pytest.mark.packaging
def test_installed_wheel_loads_presets_outside_the_source_tree(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import dsa_tvm; from dsa_tvm.hw.config import load_config, presets_dir; "
            "print(dsa_tvm.__file__); print(presets_dir()); "
            "print(load_config('edge').values == load_config(presets_dir() / 'edge.toml').values)")
    env = dict(os.environ, PYTHONPATH=str(site))
    got = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, timeout=120,
                         capture_output=True, text=True)
    assert got.returncode == 0, got.stderr[-2000:]
    file, presets, same = got.stdout.split()[-3:]
    assert Path(file).is_relative_to(site) and Path(presets) == site / "dsa_tvm" / "_presets"
    assert same == "True"
    cli = subprocess.run([sys.executable, "-m", "dsa_tvm.cli", "hw", "edge"], cwd=elsewhere,
                         env=env, timeout=120, capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr[-2000:]
    edge = tomllib.loads((ROOT / "target" / "edge.toml").read_text())
    assert cli.stdout.startswith(f"{edge['name']}: ")
    assert f"source {site / 'dsa_tvm' / '_presets' / 'edge.toml'}," in cli.stdout
