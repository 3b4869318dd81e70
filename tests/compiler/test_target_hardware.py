"""A DSA target whose hardware is not loaded is refused, never compiled for `default`.

Issue 11, finding 6: a target made from a custom TOML keeps only the hardware's name; in
a new process that name was unknown and the compile silently used the default preset.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dsa_tvm

from .. import qdq_models as Q

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def custom_part(tmp_path_factory):
    """A custom description (the default preset at half the clock, renamed) and the target
    made from it, saved as TVM prints it."""
    d = tmp_path_factory.mktemp("part")
    text = (ROOT / "target" / "default.toml").read_text()
    assert 'name = "default"' in text and "mhz = 1000.0" in text
    toml = d / "mypart.toml"
    toml.write_text(text.replace('name = "default"', 'name = "mypart"')
                    .replace("mhz = 1000.0", "mhz = 500.0"))
    tgt = dsa_tvm.target(toml)
    (d / "target.json").write_text(str(tgt))
    return d, toml, str(tgt.attrs["model"])


def test_unloaded_hardware_name_is_refused_in_a_new_process(custom_part):
    d, toml, model = custom_part
    model_path = Q.conv_net(d, cin=16, cout=16, hw=8)
    script = textwrap.dedent(f"""
        import json, onnx, tvm
        from tvm.relax.frontend.onnx import from_onnx
        import dsa_tvm
        mod = from_onnx(onnx.load({str(model_path)!r}), keep_params_in_input=False)
        saved = tvm.target.Target(json.loads(open({str(d / 'target.json')!r}).read()))
        try:
            tvm.compile(mod, target=saved)
            print("COMPILED", dsa_tvm.last_compile_report().hardware)
        except Exception as e:
            print("REFUSED", type(e).__name__, e)
        dsa_tvm.target({str(toml)!r})               # load the description again: now it works
        tvm.compile(mod, target=saved)
        rep = dsa_tvm.last_compile_report()
        print("RELOADED", rep.hardware, rep.mhz)
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "COMPILED" not in out, out
    refused = next(line for line in out.splitlines() if line.startswith("REFUSED"))
    assert f"hardware '{model}'" in refused
    assert "dsa_tvm.target('path/to/mypart.toml')" in refused
    assert "RELOADED mypart 500.0" in out


def test_presets_and_a_bare_dsa_key_still_resolve():
    import tvm

    from dsa_tvm.target import config_of

    assert config_of(tvm.target.Target("dsa")).name == "default"
    assert config_of(tvm.target.Target("dsa-edge")).name == "edge"
    bare = tvm.target.Target({"kind": "llvm", "keys": ["dsa", "cpu"]})
    assert config_of(bare).name == "default"
