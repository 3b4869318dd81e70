"""``dsa-tvm qat`` as a user runs it: a folder with a broken image, a pickled module."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from PIL import Image

from dsa_tvm.cli import main

from .nets import TinyViT, tiny_net


def _folder(tmp_path):
    rng = np.random.default_rng(0)
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(d / f"{i}.png")
    (d / "broken.jpg").write_bytes(b"not a jpeg")
    (d / "readme.txt").write_text("not an image")
    return d


@pytest.mark.parametrize("recipe", [[], ["--features", "1", "--mixup", "0.5",
                                         "--weight-clip", "max"]])
def test_qat_cli_trains_exports_and_names_skipped_files(tmp_path, capsys, recipe):
    torch.save(tiny_net(), tmp_path / "tiny.pt")
    out = tmp_path / "q.onnx"
    rc = main(["qat", str(tmp_path / "tiny.pt"), "--data", str(_folder(tmp_path)), "--size", "16",
               "--steps", "4", "--bits", "w4a8", "--lr", "1e-4", "--quiet", "--out", str(out)]
              + recipe)
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "skipped broken.jpg" in cap.err and "readme" not in cap.err
    assert "integer layers: 7" in cap.out, cap.out
    assert "training: 4 steps" in cap.out, cap.out
    assert "adaround: 5 layers: relative output error" in cap.out, cap.out   # w4a8's default
    model = onnx.load(str(out))
    assert sum(n.op_type == "QuantizeLinear" for n in model.graph.node) >= 5


@pytest.mark.parametrize("method", ["sparsegpt", "magnitude"])
def test_qat_cli_prunes_before_training_and_exports_n_m_codes(tmp_path, capsys, monkeypatch,
                                                              method):
    from dsa_tvm.qat.sparsity import is_n_m

    torch.save(tiny_net(), tmp_path / "tiny.pt")
    monkeypatch.chdir(tmp_path)
    rc = main(["qat", "tiny.pt", "--data", str(_folder(tmp_path)), "--size", "16", "--steps", "2",
               "--sparsity", "2:4", "--sparse-method", method, "--quiet"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "sparsity 2:4: 3 of 5 weighted layers pruned" in cap.out, cap.out
    assert "dense: dw: depthwise" in cap.out
    assert cap.out.index("sparsity 2:4") < cap.out.index("training: 2 steps")
    model = onnx.load(str(tmp_path / "tiny-qat-w8a8-2of4.onnx"))
    codes = [onnx.numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node
             if n.op_type == "Constant" and n.attribute[0].t.data_type == onnx.TensorProto.INT8]
    sixteen_in = [c for c in codes if c.ndim in (2, 4) and c.shape[1] == 16]
    assert len(sixteen_in) == 3 and all(is_n_m(c, 2, 4) for c in sixteen_in)


@pytest.mark.parametrize("target, pruned", [("0", 3), ("1", 0)])
def test_qat_cli_sparse_target_prunes_the_layers_that_keep_it(tmp_path, capsys, target, pruned):
    torch.save(tiny_net(), tmp_path / "tiny.pt")
    rc = main(["qat", str(tmp_path / "tiny.pt"), "--data", str(_folder(tmp_path)), "--size",
               "16", "--steps", "1", "--sparsity", "2:4", "--sparse-target", target, "--quiet",
               "--out", str(tmp_path / "q.onnx")])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert f"sparse target {float(target)}: {pruned} layers pruned" in cap.out, cap.out
    assert f"sparsity 2:4: {pruned} of 5 weighted layers pruned" in cap.out, cap.out
    assert cap.out.count("skipped by the caller") == 3 - pruned


def test_qat_cli_hostile_input(tmp_path, capsys):
    torch.save(tiny_net().state_dict(), tmp_path / "sd.pt")
    torch.save(tiny_net(), tmp_path / "tiny.pt")
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.png").write_bytes(b"xx")
    (tmp_path / "m.onnx").write_bytes(b"not onnx")
    cases = [
        (["qat", str(tmp_path / "m.onnx"), "--data", "."], "is not an ONNX model"),
        (["qat", str(tmp_path / "sd.pt"), "--data", "."], "not a module (a state dict?)"),
        (["qat", "nope", "--data", "."], "neither a bundled name"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", str(tmp_path / "x")], "not a folder"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", str(empty)], "no images"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", str(broken)], "none of the 1 images"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", ".", "--steps", "-1"], "--steps -1"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", ".", "--heldout", "1.5"], "--heldout"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", ".", "--features", "-1"], "--features -1"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", ".", "--mixup", "nan"], "--mixup nan"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", ".", "--adaround", "-1"],
         "--adaround -1: pass 0 (off) or a number of steps"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", ".", "--sparsity", "2-4"],
         "--sparsity '2-4' is not N:M; pass"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", ".", "--sparse-method", "magnitude"],
         "--sparse-method magnitude applies to --sparsity N:M"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", ".", "--sparsity", "4:4"],
         "--sparsity 4:4: N must be at least 1 and below M=4"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", ".", "--sparsity", "2:4",
          "--sparse-target", "1.5"], "--sparse-target 1.5: pass an output cosine between 0"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", ".", "--sparse-target", "0.9"],
         "--sparse-target 0.9: pass an output cosine between 0 and 1 with --sparsity N:M"),
    ]
    for argv, want in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert want in err and "Traceback" not in err, (argv, err)


def test_qat_cli_weight_group_exports_the_linear_layer_on_its_grid(tmp_path, capsys):
    """``--weight-group 16``: the classifier (16 input rows) trains and exports on a 4-bit
    grid per group with an offset (a float32 MatMul weight the compiler finds the grid in);
    the convolutions stay per channel."""
    from dsa_tvm.layers.group_grid import find_grid

    torch.save(tiny_net(), tmp_path / "tiny.pt")
    out = tmp_path / "g.onnx"
    rc = main(["qat", str(tmp_path / "tiny.pt"), "--data", str(_folder(tmp_path)), "--size", "16",
               "--steps", "2", "--bits", "w4a8", "--weight-group", "16", "--quiet",
               "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    model = onnx.load(str(out))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    consts = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t)
              for n in model.graph.node if n.op_type == "Constant"}
    mm = [n for n in model.graph.node if n.op_type == "MatMul"]
    w = [{**inits, **consts}.get(n.input[1]) for n in mm]
    grids = [find_grid(np.ascontiguousarray(x.T)) for x in w if x is not None and x.ndim == 2]
    assert grids and all(g is not None and g.group == 16 and -8 <= g.codes.min() <= g.codes.max() <= 7
                         for g in grids), w
    assert main(["qat", str(tmp_path / "tiny.pt"), "--data", str(tmp_path / "imgs"),
                 "--size", "16", "--weight-group", "24"]) != 0
    assert "weight_group=24" in capsys.readouterr().err


def test_qat_cli_quantize_norms_wide_norms_trains_the_stream_on_int16(tmp_path, capsys):
    """``--quantize-norms --wide-norms``: a ViT-like block's attention and LayerNorms
    integer, its norm stream on int16 grids; the export carries int16 Q/DQ at opset 21."""
    torch.manual_seed(0)
    torch.save(TinyViT().eval(), tmp_path / "vit.pt")
    out = tmp_path / "v.onnx"
    argv = ["qat", str(tmp_path / "vit.pt"), "--data", str(_folder(tmp_path)), "--size", "16",
            "--steps", "2", "--quiet", "--out", str(out), "--quantize-norms"]
    assert main(argv + ["--wide-norms"]) == 0, capsys.readouterr().err
    cap = capsys.readouterr()
    assert "layer_norm x2" in cap.out and "softmax x1" in cap.out, cap.out
    # the patch conv's output (ln1's input) stays int8: a convolution writes no int16
    assert "int16 grids (the norm stream): 4" in cap.out, cap.out
    assert "int8, not int16: ln1 input: written by WeightedLayer patch" in cap.out, cap.out
    model = onnx.load(str(out))
    assert model.opset_import[0].version == 21
    int16 = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT16}
    assert sum(n.op_type == "QuantizeLinear" and n.input[2] in int16
               for n in model.graph.node) >= 4
    argv[argv.index("--quantize-norms")] = "--wide-norms"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "pass quantize_norms=True" in err and "--quantize-norms" in err, err
    assert "Traceback" not in err
