"""``dsa-tvm qat`` as a user runs it: a folder with a broken image, a pickled module."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from PIL import Image

from dsa_tvm.cli import main

from .nets import tiny_net


def _folder(tmp_path):
    rng = np.random.default_rng(0)
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(d / f"{i}.png")
    (d / "broken.jpg").write_bytes(b"not a jpeg")
    (d / "readme.txt").write_text("not an image")
    return d


def test_qat_cli_trains_exports_and_names_skipped_files(tmp_path, capsys):
    torch.save(tiny_net(), tmp_path / "tiny.pt")
    out = tmp_path / "q.onnx"
    rc = main(["qat", str(tmp_path / "tiny.pt"), "--data", str(_folder(tmp_path)), "--size", "16",
               "--steps", "4", "--bits", "w4a8", "--lr", "1e-4", "--quiet", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "skipped broken.jpg" in cap.err and "readme" not in cap.err
    assert "integer layers: 7" in cap.out, cap.out
    assert "training: 4 steps" in cap.out, cap.out
    model = onnx.load(str(out))
    assert sum(n.op_type == "QuantizeLinear" for n in model.graph.node) >= 5


def test_qat_cli_hostile_input(tmp_path, capsys):
    torch.save(tiny_net().state_dict(), tmp_path / "sd.pt")
    torch.save(tiny_net(), tmp_path / "tiny.pt")
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.png").write_bytes(b"xx")
    cases = [
        (["qat", "m.onnx", "--data", "."], "is ONNX"),
        (["qat", str(tmp_path / "sd.pt"), "--data", "."], "not a module (a state dict?)"),
        (["qat", "nope", "--data", "."], "neither a bundled name"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", str(tmp_path / "x")], "not a folder"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", str(empty)], "no images"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", str(broken)], "none of the 1 images"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", ".", "--steps", "-1"], "--steps -1"),
        (["qat", str(tmp_path / "tiny.pt"), "--data", ".", "--heldout", "1.5"], "--heldout"),
    ]
    for argv, want in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert want in err and "Traceback" not in err, (argv, err)
