"""NCHW <-> NHWC permutes inside a region (kind ``layout_permute``, the Permute room).

ConvNeXt works channels-last between its convs: ``dwconv -> permute(0, 2, 3, 1) ->
LayerNorm -> Linear -> GELU -> Linear -> * gamma -> permute(0, 3, 1, 2) -> + x``. In the
DSA's blocked layout an NCHW image and its NHWC rows are one row of channel blocks per
pixel, so each permute is a block copy and the whole network is one launch (before: the
permutes and the layer scale ran on the host, 6 launches). Checked against the integer
reference of each region (bit-exact) and onnxruntime on the QDQ graph (optimizations off),
with channel counts that fill whole blocks and ones that leave a partial block.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax

import dsa_tvm
from dsa_tvm.hw.config import load_config
from dsa_tvm.models.quantize import output_quant_steps, run_onnxruntime
from dsa_tvm.runtime import take_launches
from tir_schedules.kinds import run_region

torch = pytest.importorskip("torch")


def _always_offload(preset: str = "default"):
    """The preset with a host so slow that every region that compiles goes to the DSA."""
    return load_config(preset).replace(cpu_gmacs=1e-6, launch_overhead_us=0.0)


class _Block(torch.nn.Module):
    """ConvNeXt's block; ``norm=False`` leaves the LayerNorm out (every op standard QDQ)."""

    def __init__(self, c: int, norm: bool):
        super().__init__()
        self.dw = torch.nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.ln = torch.nn.LayerNorm(c) if norm else torch.nn.Identity()
        self.up, self.down = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)
        self.gamma = torch.nn.Parameter(torch.linspace(0.2, 1.0, c))

    def forward(self, x):
        y = self.ln(self.dw(x).permute(0, 2, 3, 1))
        y = self.down(torch.nn.functional.gelu(self.up(y))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class _Down(torch.nn.Module):
    """ConvNeXt's downsampling: a channels-first LayerNorm (permute, norm, permute) and a
    2x2 stride-2 conv."""

    def __init__(self, c: int, norm: bool):
        super().__init__()
        self.ln = torch.nn.LayerNorm(c) if norm else torch.nn.Identity()
        self.conv = torch.nn.Conv2d(c, 2 * c, 2, stride=2)

    def forward(self, x):
        return self.conv(self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))


def _net(c: int, norm: bool) -> torch.nn.Module:
    torch.manual_seed(c)
    return torch.nn.Sequential(torch.nn.Conv2d(3, c, 4, stride=4), _Block(c, norm),
                               _Down(c, norm), _Block(2 * c, norm),
                               torch.nn.Conv2d(2 * c, 8, 1)).eval()


def _compile_and_run(tmp_path, c: int, norm: bool, side: int = 32):
    from dsa_tvm.quant import quantize_onnx

    path = tmp_path / f"convnext_{c}_{norm}.onnx"
    torch.onnx.export(_net(c, norm), torch.randn(1, 3, side, side), str(path),
                      opset_version=17, dynamo=False, input_names=["x"])
    calib = [np.random.default_rng(i).standard_normal((1, 3, side, side)).astype(np.float32)
             for i in range(4)]
    q = quantize_onnx(str(path), calib, preprocess="raw", show_progress=False,
                      quantize_norms=norm)
    ex = dsa_tvm.compile(q.to_relax(), _always_offload())
    rep = dsa_tvm.last_compile_report()
    take_launches()
    x = calib[1]
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    return q, rep, take_launches(), x, got, path


@pytest.mark.parametrize("c", [16, 24])
def test_channels_last_block_is_one_launch_exact(tmp_path, c):
    """Standard QDQ ops only: bit-exact per launch and within one step of onnxruntime."""
    q, rep, launches, x, got, _ = _compile_and_run(tmp_path, c, norm=False)
    assert "FP32: Mul" not in q.summary(), q.summary()       # gamma folded into the Linear
    assert len(launches) == 1, str(rep)
    kinds = [type(ly).__name__ for d in rep.regions if d.target == "dsa" for ly in d.region.layers]
    # two per block (the downsampling's pair cancels without its norm)
    assert kinds.count("Permute") == 4 and kinds.count("Dense") == 4, kinds
    assert not rep.partition.cpu_ops or all(
        op.op in ("relax.quantize", "relax.dequantize") for op in rep.partition.cpu_ops), \
        [op.op for op in rep.partition.cpu_ops]
    regions = {d.name: d.region for d in rep.regions if d.target == "dsa"}
    for ln in launches:
        want = run_region(regions[ln.program.name], ln.inputs)
        for k, v in ln.outputs.items():
            np.testing.assert_array_equal(v, want[k])
    ort = run_onnxruntime(q.model, {"x": x}, optimize=False)[0]
    (step,) = output_quant_steps(q.model).values()
    assert np.abs(got - ort).max() <= step * (1 + 1e-3)


def test_channels_last_norms_on_the_dsa(tmp_path):
    """With the LayerNorms (channels-last in the block, channels-first before the
    downsampling conv): one launch, bit-exact per launch, close to FP32."""
    q, rep, launches, x, got, path = _compile_and_run(tmp_path, 32, norm=True)
    assert len(launches) == 1, str(rep)
    kinds = [type(ly).__name__ for d in rep.regions if d.target == "dsa" for ly in d.region.layers]
    assert kinds.count("LayerNorm") == 3 and kinds.count("Permute") == 6, kinds
    regions = {d.name: d.region for d in rep.regions if d.target == "dsa"}
    for ln in launches:
        want = run_region(regions[ln.program.name], ln.inputs)
        for k, v in ln.outputs.items():
            np.testing.assert_array_equal(v, want[k])
    fp32 = run_onnxruntime(onnx.load(str(path)), {"x": x}, optimize=False)[0]
    cos = float((got * fp32).sum() / np.linalg.norm(got) / np.linalg.norm(fp32))
    assert cos > 0.99, cos


def test_other_permutes_stay_where_they_were(tmp_path):
    """A 4-D permute other than NCHW <-> NHWC is no block copy: not this kind (the
    constraint names the two it takes)."""
    from relay_passes.kinds import KINDS

    (layout,) = [c for c in KINDS["layout_permute"].constraints if c.name == "layout"]
    assert "(0, 2, 3, 1)" in layout.doc and "(0, 3, 1, 2)" in layout.doc
