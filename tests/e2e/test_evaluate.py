"""``dsa_tvm.evaluate`` / ``dsa-tvm eval``: a quantized model on the DSA over a dataset,
against the FP32 model; the numbers checked against an independent computation."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

pytest.importorskip("tvm")

from dsa_tvm.cli import main  # noqa: E402
from dsa_tvm.evaluation import evaluate  # noqa: E402
from dsa_tvm.models.quantize import calibration_data, run_onnxruntime  # noqa: E402
from dsa_tvm.models.zoo import get_model  # noqa: E402

N = 5


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval")
    fp32 = get_model("small_cnn", quantized=False)
    onnx.save(fp32, d / "fp32.onnx")
    onnx.save(get_model("small_cnn", quantized=True), d / "int8.onnx")
    xs = np.concatenate([f["input"] for f in calibration_data(fp32, n=N, seed=21)])
    np.savez(d / "data.npz", input=xs)
    np.savetxt(d / "labels.txt", np.arange(N) % 10, fmt="%d")
    return d, xs


def _dsa_outputs(path, xs) -> list[np.ndarray]:
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    import dsa_tvm

    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    vm = relax.VirtualMachine(tvm.compile(mod, target=dsa_tvm.target("default")), tvm.cpu())
    return [vm["main"](tvm.runtime.tensor(x[None])).numpy() for x in xs]


def test_the_report_is_what_an_independent_loop_computes(files):
    d, xs = files
    rep = evaluate(d / "int8.onnx", d / "data.npz", reference=d / "fp32.onnx",
                   labels=d / "labels.txt", workers=1, show_progress=False)
    got = _dsa_outputs(d / "int8.onnx", xs)
    fp32 = onnx.load(d / "fp32.onnx")
    ref = [run_onnxruntime(fp32, {"input": x[None]}, optimize=False)[0] for x in xs]
    g64, r64 = ([a.astype(np.float64).ravel() for a in v] for v in (got, ref))
    cos = [float(g @ r / np.linalg.norm(g) / np.linalg.norm(r)) for g, r in zip(g64, r64)]
    assert rep.inputs == N
    assert rep.cosine_mean == pytest.approx(np.mean(cos), abs=1e-9)
    assert rep.cosine_min == pytest.approx(min(cos), abs=1e-9)
    assert rep.worst[0]["index"] == int(np.argmin(cos))
    g1 = np.array([g.argmax() for g in got])
    r1 = np.array([r.argmax() for r in ref])
    assert rep.top1_agreement == pytest.approx(np.mean(g1 == r1))
    assert rep.top1_accuracy == pytest.approx(np.mean(g1 == np.arange(N) % 10))
    assert rep.reference_top1_accuracy == pytest.approx(np.mean(r1 == np.arange(N) % 10))
    assert json.loads(rep.to_json())["inputs"] == N


def test_worker_processes_give_the_same_report(files):
    d, _ = files
    one = evaluate(d / "int8.onnx", d / "data.npz", workers=1, show_progress=False, limit=4)
    two = evaluate(d / "int8.onnx", d / "data.npz", workers=2, show_progress=False, limit=4)
    assert two.workers == 2 and two.inputs == one.inputs == 4
    for key in ("cosine_mean", "cosine_min", "top1_agreement", "top5_agreement", "worst"):
        assert getattr(two, key) == getattr(one, key), key


@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time
def test_ray_actors_give_the_same_report(files):
    """The Ray path (a local cluster started here) computes what one process does."""
    import ray  # the test extra installs it

    d, _ = files
    one = evaluate(d / "int8.onnx", d / "data.npz", workers=1, show_progress=False, limit=4)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = evaluate(d / "int8.onnx", d / "data.npz", workers=2, show_progress=False,
                          limit=4, ray_address="auto")
    finally:
        ray.shutdown()
    assert on_ray.cosine_min == one.cosine_min and on_ray.worst == one.worst


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    """A tiny sentence-embedder-shaped model: token features -> dense -> tanh -> mean over
    tokens -> L2 normalize, output named ``embedding`` (MiniLM's shape, in miniature)."""
    from dsa_tvm.quant.api import quantize_onnx

    from .. import qdq_models as Q

    d = tmp_path_factory.mktemp("embed")
    rng = np.random.default_rng(4)
    inits = {"W": Q.rand(rng, 24, 32)}
    nodes = [Q.node("MatMul", ["x", "W"], ["h"]), Q.node("Tanh", ["h"], ["t"]),
             Q.node("ReduceMean", ["t"], ["m"], axes=[1], keepdims=0),   # opset 17
             Q.node("ReduceL2", ["m"], ["n"], axes=[1], keepdims=1),
             Q.node("Div", ["m", "n"], ["embedding"])]
    fp32 = Q.make_model(nodes, inits, {"x": (1, 6, 24)}, {"embedding": None})
    xs = rng.standard_normal((8, 1, 6, 24)).astype(np.float32)
    q = quantize_onnx(fp32, list(xs[:4]), show_progress=False)
    onnx.save(fp32, d / "fp32.onnx")
    onnx.save(q.model, d / "int8.onnx")
    np.savez(d / "data.npz", x=xs[:, 0])
    return d, xs


def test_an_embedder_is_scored_by_its_neighbours(embedder):
    """Detected from its output (unit rows named ``embedding``): the nearest other input
    and the pairwise cosines, against an independent computation, and no top-1."""
    d, xs = embedder
    rep = evaluate(d / "int8.onnx", d / "data.npz", reference=d / "fp32.onnx", workers=1,
                   show_progress=False)
    got = _dsa_outputs(d / "int8.onnx", xs[:, 0])
    fp32 = onnx.load(d / "fp32.onnx")
    ref = [run_onnxruntime(fp32, {"x": x}, optimize=False)[0] for x in xs]
    g = np.concatenate(got).astype(np.float64)
    r = np.concatenate(ref).astype(np.float64)
    sg, sr = (v @ v.T / np.outer(*[np.linalg.norm(v, axis=1)] * 2) for v in (g, r))
    iu = np.triu_indices(len(xs), 1)
    near = [int(np.argmax(np.where(np.arange(len(xs)) == i, -2, row))) for i, row in
            enumerate(sg)]
    near_ref = [int(np.argmax(np.where(np.arange(len(xs)) == i, -2, row))) for i, row in
                enumerate(sr)]
    assert rep.task == "embed" and rep.top1_agreement is None
    assert rep.neighbour_agreement == pytest.approx(np.mean(np.equal(near, near_ref)))
    assert rep.similarity_error == pytest.approx(np.abs(sg[iu] - sr[iu]).mean(), abs=1e-9)
    assert "nearest-neighbour agreement" in str(rep) and "top-1" not in str(rep)
    with pytest.raises(ValueError, match="scored as an embedder.*--task classify"):
        evaluate(d / "int8.onnx", d / "data.npz", labels=np.arange(8), workers=1,
                 show_progress=False)
    forced = evaluate(d / "int8.onnx", d / "data.npz", workers=1, show_progress=False,
                      task="classify", limit=3)
    assert forced.task == "classify" and forced.top1_agreement is not None
    with pytest.raises(ValueError, match="task must be one of auto, classify, embed, other"):
        evaluate(d / "int8.onnx", d / "data.npz", show_progress=False, task="rank")


@pytest.mark.parametrize("kw, match", [
    (dict(labels=[1, 2]), "2 labels for 5 inputs"),
    (dict(labels=[0.5] * N), "one class index per input"),
    (dict(workers=0), "workers must be a whole number"),
    (dict(limit=0), "limit must be a whole number"),
])
def test_bad_arguments_name_the_fix(files, kw, match):
    d, _ = files
    with pytest.raises(ValueError, match=match):
        evaluate(d / "int8.onnx", d / "data.npz", show_progress=False, **kw)


def test_non_finite_inputs_are_refused_not_skipped(files, tmp_path):
    """Skipping one would shift every later input against its label and index."""
    d, xs = files
    bad = xs.copy()
    bad[2, 0, 0, 0] = np.nan
    np.savez(tmp_path / "nan.npz", input=bad)
    with pytest.raises(ValueError, match="index 2"):
        evaluate(d / "int8.onnx", tmp_path / "nan.npz", labels=np.arange(N),
                 show_progress=False)


def test_cli_prints_the_report_and_writes_json(files, capsys, tmp_path):
    d, _ = files
    out = tmp_path / "eval.json"
    assert main(["eval", str(d / "int8.onnx"), "--data", str(d / "data.npz"), "--reference",
                 str(d / "fp32.onnx"), "--labels", str(d / "labels.txt"), "--limit", "3",
                 "--workers", "1", "--quiet", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "top-1 agreement" in text and "3 input(s)" in text
    assert json.loads(out.read_text())["inputs"] == 3


@pytest.mark.parametrize("args, match", [
    (["--data", "/no/such/folder"], "no/such/folder"),
    (["--data", "{npz}", "--labels", "/no/labels.txt"], "labels"),
    (["--data", "{bad}"], "evaluation data"),
])
def test_cli_errors_are_one_line(files, capsys, tmp_path, args, match):
    d, xs = files
    np.savez(tmp_path / "bad.npz", input=xs[:, :2])          # wrong shape
    args = [a.format(npz=d / "data.npz", bad=tmp_path / "bad.npz") for a in args]
    assert main(["eval", str(d / "int8.onnx"), "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err and "Traceback" not in err
