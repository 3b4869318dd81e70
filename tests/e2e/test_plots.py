"""Plots and the per-layer CSV of a run (dsa_tvm.plots, RunReport.to_csv, ``dsa-tvm run
--plot/--breakdown/--csv``), and the split of each layer's cycles into compute, DRAM wait
and token wait that they show. small_cnn keeps the whole file well under a minute."""

from __future__ import annotations

import csv
import warnings

import pytest
from PIL import Image

from dsa_tvm import plots
from dsa_tvm.cli import main
from dsa_tvm.flow import run_model
from dsa_tvm.hw.config import load_config, with_overrides
from dsa_tvm.report import CSV_COLUMNS, LayerRow, RunReport

MODEL = "small_cnn"


def _run(cfg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnxruntime / TVM chatter, not what is tested
        return run_model(MODEL, cfg, verbose=False)


def _starved(bw: int):
    return with_overrides(load_config("default"), [f"dram.bandwidth_bytes_per_cycle={bw}"])


@pytest.fixture(scope="module")
def default_run():
    return _run(load_config("default"))


@pytest.fixture(scope="module")
def starved_run():
    """A quarter of the default's DRAM bandwidth: still offloaded, now waiting on DRAM."""
    return _run(_starved(4))


def _dsa(rep: RunReport) -> list[LayerRow]:
    return [r for r in rep.rows if r.target == "DSA"]


def _png(path, min_w: int = 400, min_h: int = 200) -> tuple[int, int]:
    with Image.open(path) as im:
        assert im.format == "PNG"
        im.load()  # decodes the whole picture: a truncated file fails here
        assert im.width >= min_w and im.height >= min_h, im.size
        return im.size


@pytest.mark.parametrize("which", ["default_run", "starved_run"])
def test_cycles_split_into_compute_dram_and_token_wait_exactly(which, request):
    res = request.getfixturevalue(which)
    rows = _dsa(res.run_report)
    assert rows
    for r in rows:
        assert r.compute + r.dram_wait + r.token_wait == r.cycles, r
        assert min(r.compute, r.dram_wait, r.token_wait) >= 0
        assert r.compute <= r.compute_cycles  # charged only while its instruction computes
    assert sum(r.cycles for r in rows) == res.run_report.total_cycles


def test_starving_dram_shifts_cycles_into_dram_wait(default_run, starved_run):
    def share(res) -> float:
        return sum(r.dram_wait for r in _dsa(res.run_report)) / res.run_report.total_cycles

    assert share(starved_run) > share(default_run) + 0.1
    assert "cycles by what the layer waited on" in str(starved_run.run_report)


@pytest.mark.parametrize("which", ["default_run", "starved_run"])
def test_roofline_has_every_layer_with_macs_and_none_beats_physics(which, request, tmp_path):
    res = request.getfixturevalue(which)
    rows, cfg = _dsa(res.run_report), res.hardware
    data = plots.roofline_data(res.run_report, cfg)
    assert len(data.points) + len(data.skipped) == len(rows)
    assert len(data.points) == sum(r.macs > 0 for r in rows)
    assert (data.peak, data.bandwidth) == (cfg.peak_macs_per_cycle, cfg.bandwidth_bytes_per_cycle)
    for p in data.points:
        assert p.roof == min(data.peak, p.intensity * data.bandwidth)
        assert p.macs_per_cycle <= data.peak  # the compute roof is never passed
        assert p.span_macs_per_cycle <= p.roof * (1 + 1e-9), p  # over its own time: under
        assert p.hidden == (p.macs_per_cycle > p.roof * (1 + 1e-9))
    out = plots.roofline(res.run_report, cfg, tmp_path / "roof.png", model=MODEL)
    assert out == tmp_path / "roof.png"
    _png(out, 600, 400)


def test_breakdown_png_grows_with_the_layer_count(default_run, tmp_path):
    small = _png(plots.breakdown(default_run.run_report, tmp_path / "b.png"))
    many = RunReport("default", 1000.0, total_cycles=70 * 300)
    many.rows = [LayerRow(f"region0.{i}:conv2d", "Conv2d", "DSA", "offloaded", 1000, 300,
                          compute=200, dram_wait=90, token_wait=10) for i in range(70)]
    big = _png(plots.breakdown(many, tmp_path / "big.png"))
    assert big[1] > 3 * small[1]  # 70 readable bars, not squeezed into the same height
    top = _png(plots.breakdown(many, tmp_path / "top.png", top=10))
    assert top[1] < big[1]


def test_zero_cycles_bytes_or_macs_do_not_break_the_plots(tmp_path):
    cfg = load_config("default")
    rep = RunReport(cfg.name, cfg.mhz, total_cycles=500)
    rep.rows = [LayerRow("conv", "Conv2d", "DSA", "offloaded", 4096, 400, span=400,
                         min_read=512, min_written=256, compute=300, dram_wait=100),
                LayerRow("no_cycles", "Conv2d", "DSA", "offloaded", 4096, 0),
                LayerRow("no_bytes", "Dense", "DSA", "offloaded", 64, 50, span=50, compute=50),
                LayerRow("pool", "Pool2d", "DSA", "offloaded", 0, 50, span=50, dram_wait=50)]
    data = plots.roofline_data(rep, cfg)
    assert [p.name for p in data.points] == ["conv"]
    assert {n for n, _ in data.skipped} == {"no_cycles", "no_bytes", "pool"}
    _png(plots.roofline(rep, cfg, tmp_path / "r.png"))
    _png(plots.breakdown(rep, tmp_path / "b.png"))


def test_all_on_the_cpu_is_a_clear_error(tmp_path):
    cfg = load_config("default")
    rep = RunReport(cfg.name, cfg.mhz, rows=[LayerRow("c", "conv2d", "CPU", "slower", 10)])
    for draw in (lambda: plots.roofline(rep, cfg, tmp_path / "r.png"),
                 lambda: plots.breakdown(rep, tmp_path / "b.png")):
        with pytest.raises(ValueError, match="nothing on the DSA to plot.*1 layer.*CPU"):
            draw()
    assert not list(tmp_path.iterdir())


def test_csv_has_one_row_per_layer_and_the_split_adds_up(starved_run, tmp_path):
    rep = starved_run.run_report
    path = rep.write_csv(tmp_path / "layers.csv")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        got = list(reader)
    assert len(got) == len(rep.rows)
    dsa = [g for g in got if g["target"] == "DSA"]
    assert len(dsa) == len(_dsa(rep))
    for g, r in zip(dsa, _dsa(rep)):
        assert g["name"] == r.name
        assert int(g["compute"]) + int(g["dram_wait"]) + int(g["token_wait"]) == int(g["cycles"])
        assert g["bound_by"] in ("compute", "memory")
        assert float(g["bound_ratio"]) == pytest.approx(r.cycles / r.bound, abs=1e-3)
    assert sum(int(g["cycles"]) for g in dsa) == rep.total_cycles


def test_cli_writes_the_plots_and_the_csv(tmp_path, capsys):
    paths = {f: tmp_path / n for f, n in (("--plot", "roof.png"), ("--breakdown", "bd.png"),
                                          ("--csv", "layers.csv"))}
    assert main(["run", MODEL, *(x for f, p in paths.items() for x in (f, str(p)))]) == 0
    out = capsys.readouterr().out
    for p in paths.values():
        assert str(p) in out and p.stat().st_size > 0
    _png(paths["--plot"], 600, 400)
    _png(paths["--breakdown"])
    with open(paths["--csv"], newline="") as f:
        assert any(row["target"] == "DSA" for row in csv.DictReader(f))


@pytest.mark.parametrize("flag,name,needle", [
    ("--plot", "missing/roof.png", "does not exist"),
    ("--csv", "missing/layers.csv", "does not exist"),
    ("--breakdown", "bd.txt", "picture suffix"),
])
def test_cli_refuses_an_unwritable_output_before_compiling(flag, name, needle, tmp_path, capsys):
    assert main(["run", MODEL, flag, str(tmp_path / name)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dsa-tvm: error: --") and needle in err[0], err
    assert not (tmp_path / "missing").exists()


def test_cli_says_why_there_is_nothing_to_plot_when_all_stays_on_the_cpu(tmp_path, capsys):
    # at 1 B/cycle of DRAM the region is slower than the host, so nothing is offloaded
    argv = ["run", MODEL, "--set", "dram.bandwidth_bytes_per_cycle=1", "--plot",
            str(tmp_path / "r.png")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing on the DSA to plot" in err[0], err
