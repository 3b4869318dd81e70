"""PyTorch in (issue 16.5): ``dsa_tvm.from_pytorch`` (torch.export -> Relax -> the Relax
quantizer) and ``dsa-tvm run model.pt2``.

A small CNN lands on the DSA whole and computes what TVM's LLVM build of the same
quantized module computes (within one output step; measured bit-exact on these inputs)
and what torch computes in FP32 (cosine); a module, its ExportedProgram and its .pt2 file
import to the same module; a token model (int64 ids) quantizes and runs; every bad
input is an IntakeError naming the cause, and a CLI exit code 2 with one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import dsa_tvm  # noqa: E402
from dsa_tvm.cli import main  # noqa: E402
from dsa_tvm.flow_pytorch import int_bound, output_step  # noqa: E402
from dsa_tvm.models.quantize import image_like  # noqa: E402
from dsa_tvm.quant.metrics import cosine  # noqa: E402

SHAPE = (1, 3, 32, 32)


class SmallCNN(torch.nn.Module):
    """conv-bn-relu, a strided conv, max pool, global average pool, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2))
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = torch.nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.fc(torch.flatten(pooled, 1))


class Tokens(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(self.embed(ids))))


class Branchy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent Python control flow: torch.export cannot trace it
            return x * 2
        return x


def _cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    m = SmallCNN()
    with torch.no_grad():  # batch-norm statistics that are not the identity
        bn = m.features[1]
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
    return m.eval()


def _images(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [image_like(SHAPE, rng) for _ in range(n)]


def _run(ex, *arrays: np.ndarray) -> np.ndarray:
    return relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(a) for a in arrays]).numpy()


@pytest.fixture(scope="module")
def cnn():
    return _cnn()


@pytest.fixture(scope="module")
def pt2(cnn, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "cnn.pt2"
    torch.export.save(torch.export.export(cnn, (torch.zeros(SHAPE),)), str(path))
    return path


@pytest.fixture(scope="module")
def quantized(cnn):
    return dsa_tvm.from_pytorch(cnn, (torch.zeros(SHAPE),), _images(8, 0), verbose=False,
                                show_progress=False)


def test_small_cnn_on_the_dsa_matches_llvm_and_torch(cnn, quantized):
    """All MACs on the DSA in one launch; every output within one step of TVM's LLVM build
    of the same quantized module (and bit-exact on these inputs); cosine >= 0.99 against
    torch's FP32 output."""
    ex = tvm.compile(quantized, target="dsa")
    rep = dsa_tvm.compile_report(ex)
    assert [d.target for d in rep.regions] == ["dsa"], str(rep)
    llvm = tvm.compile(quantized, target="llvm")
    step = output_step(quantized)
    assert step is not None and step > 0
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for x in _images(4, 99):
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        want = _run(llvm, x)
        steps = np.abs(got - want) / step
        assert steps.max() <= 1.0 + 1e-6
        assert (steps > 0.5).mean() == 0.0  # measured: bit-exact
        with torch.no_grad():
            fp32 = cnn(torch.from_numpy(x)).numpy()
        assert cosine(got, fp32) >= 0.99
    run = dsa_tvm.run_report(vm)
    assert run.dsa_mac_share >= 0.99 and run.regions == 1, str(run)


def test_program_and_pt2_import_like_the_module(cnn, pt2):
    x = _images(1, 3)[0]
    program = torch.export.export(cnn, (torch.from_numpy(x),))
    outs = [_run(tvm.compile(dsa_tvm.from_pytorch(m, (x,), verbose=False), target="llvm"), x)
            for m in (cnn, program, pt2, str(pt2))]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    with torch.no_grad():
        np.testing.assert_allclose(outs[0], cnn(torch.from_numpy(x)).numpy(), rtol=1e-4,
                                   atol=1e-5)


def test_training_module_is_exported_in_eval_mode_and_left_training(capsys):
    m = _cnn().train()
    x = _images(1, 4)[0]
    mod = dsa_tvm.from_pytorch(m, (x,))
    assert m.training and all(c.training for c in m.modules())
    assert "training mode" in capsys.readouterr().err
    with torch.no_grad():
        want = _cnn()(torch.from_numpy(x)).numpy()  # eval mode: batch-norm running statistics
    np.testing.assert_allclose(_run(tvm.compile(mod, target="llvm"), x), want, rtol=1e-4,
                               atol=1e-5)


def test_token_model_quantizes_and_runs():
    """int64 ids reach calibration as int64; the dense layers are quantized and the model
    runs for the DSA target (the cost model keeps layers this small on the CPU)."""
    torch.manual_seed(0)
    m = Tokens().eval()
    rng = np.random.default_rng(0)
    calib = [rng.integers(0, 64, (1, 8)) for _ in range(4)]
    qmod = dsa_tvm.from_pytorch(m, (torch.from_numpy(calib[0]),), calib, verbose=False,
                                show_progress=False)
    assert [p.ty.dtype for p in qmod["main"].params] == ["int64"]
    int8_weights = []
    relax.analysis.post_order_visit(qmod["main"].body, lambda e: int8_weights.append(e) if (
        isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.dequantize"
        and not isinstance(e.args[0], relax.Var) and e.args[0].ty.dtype == "int8") else None)
    assert len(int8_weights) == 2  # both linear layers
    assert int_bound(qmod, "ids") == 64  # dsa-tvm run's random ids stay inside the table
    ids = rng.integers(0, 64, (1, 8))
    got = _run(tvm.compile(qmod, target="dsa"), ids)
    with torch.no_grad():
        want = m(torch.from_numpy(ids)).numpy()
    assert cosine(got, want) >= 0.99


@pytest.mark.parametrize("model, example, match", [
    ("cnn", None, "needs example_inputs"),
    ("cnn", (), "example_inputs is empty"),
    ("cnn", "an image", "example input #0 is a str"),
    ("cnn", [[1.0, 2.0]], "example input #0 is a list"),
    (42, None, "int is not a PyTorch model"),
    ("branchy", (torch.ones(2),), "torch.export could not trace Branchy"),
])
def test_bad_models_and_examples_name_the_cause(cnn, model, example, match):
    model = {"cnn": cnn, "branchy": Branchy()}.get(model, model)
    with pytest.raises(dsa_tvm.IntakeError, match=match):
        dsa_tvm.from_pytorch(model, example, verbose=False)


@pytest.mark.parametrize("make, match", [
    (lambda d: d / "missing.pt2", "not found"),
    (lambda d: d, "is a folder"),
    (lambda d: d / "junk.pt2", "is not a torch.export program"),
])
def test_bad_pt2_files_name_the_cause(tmp_path, make, match):
    (tmp_path / "junk.pt2").write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(dsa_tvm.IntakeError, match=match):
        dsa_tvm.from_pytorch(make(tmp_path), verbose=False)


def test_cli_runs_a_pt2_and_refuses_a_bad_one(pt2, tmp_path, capsys):
    report = tmp_path / "run.json"
    data = tmp_path / "calib.npz"
    np.savez(data, x=np.stack(_images(4, 1)))
    assert main(["run", str(pt2), "--json", str(report), "--csv", str(tmp_path / "run.csv"),
                 "--data", str(data)]) == 0
    out = capsys.readouterr().out
    assert "against TVM's LLVM build" in out and "against the FP32 torch program" in out, out
    assert "0.00 quantization steps" in out, out
    assert json.loads(report.read_text())["dsa_mac_share"] >= 0.99
    assert main(["run", str(pt2)]) == 0
    assert "seeded random inputs" in capsys.readouterr().out
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"\x00not a program" * 64)
    assert main(["run", str(junk)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dsa-tvm: error: ") and "junk.pt2" in err[0], err
