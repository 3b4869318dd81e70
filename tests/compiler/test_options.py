"""Compile options are scoped (``with dsa_tvm.options(...)``), validated, and take effect;
no test flips a module-level knob any more (issue 12, deliverable 5)."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import dsa_tvm
from tir_schedules.kinds import recipe
from tir_schedules.kinds.conv2d import ConvShape
from tir_schedules.options import CompileOptions, current_options

from .test_lowering import CFGS, conv, qt


def test_options_are_scoped_nested_and_undone_on_errors():
    assert current_options() == CompileOptions()
    with dsa_tvm.options(depthwise_engine="vector") as o:
        assert o.depthwise_engine == "vector" and o.fold_min_gain == 1.25
        with dsa_tvm.options(fold_min_gain=math.inf):
            assert current_options() == CompileOptions("vector", math.inf)
        assert current_options().fold_min_gain == 1.25
        with pytest.raises(RuntimeError), dsa_tvm.options(depthwise_engine="array"):
            raise RuntimeError("boom")
        assert current_options().depthwise_engine == "vector"
    assert current_options() == CompileOptions()


def test_options_do_not_leak_into_other_threads():
    seen = []
    with dsa_tvm.options(depthwise_engine="array"):
        th = threading.Thread(target=lambda: seen.append(current_options().depthwise_engine))
        th.start()
        th.join()
    assert seen == ["auto"]


@pytest.mark.parametrize("bad, match", [
    ({"depthwise_engine": "gpu"}, "depthwise_engine must be one of auto, vector, array"),
    ({"fold_min_gain": 0}, "fold_min_gain must be a number > 0"),
    ({"fold_min_gain": float("nan")}, "fold_min_gain must be a number > 0"),
    ({"fold_min_gain": "2"}, "fold_min_gain must be a number > 0"),
    ({"offload": "always"}, "offload must be one of faster, all"),
    ({"rows_concat": "cpu"}, "rows_concat must be one of dsa, host"),
])
def test_bad_values_are_refused_with_the_allowed_ones(bad, match):
    with pytest.raises(ValueError, match=match), dsa_tvm.options(**bad):
        pass
    assert current_options() == CompileOptions()


def test_unknown_option_names_the_known_ones():
    with pytest.raises(TypeError, match="unknown compile option.*depthwise_engine, fold_min_gain"):
        with dsa_tvm.options(depthwise=True):
            pass


def test_depthwise_engine_picks_the_lowering():
    cfg, rng = CFGS["default"], np.random.default_rng(0)
    x = qt(rng, "x", (1, 2 * cfg.block_out, 8, 8))
    ly = conv(rng, x, 0, 3, 1, 1, depthwise=True)
    with dsa_tvm.options(depthwise_engine="array"):
        assert isinstance(recipe(ly, cfg, consts=False).shape, ConvShape)
    with dsa_tvm.options(depthwise_engine="vector"):
        assert not isinstance(recipe(ly, cfg, consts=False).shape, ConvShape)
