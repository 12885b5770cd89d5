"""scripts/stability_map.sh: the grid, the trains / stalls / diverges rule, the entropies it compares
with, one real cell end to end, and the committed map's CSV against its documented counts."""

import csv
import math
from argparse import Namespace

import pytest

import deepnet_methods
from conftest import ROOT, run
from deepnet_experiments import stability_map as smap

RULE = Namespace(stall_margin=0.5, min_src_dep=0.25)


def test_cells_run_shallow_depths_first_then_the_warmup_axis():
    args = smap.parse_args(["--out", "x", "--depths", "18,6", "--lrs", "1e-3,2e-3", "--warmup-axis", "400",
                            "--warmup-depth", "6"])
    grid = smap.cells(args)
    assert grid[:3] == [("postln", 6, 1e-3, 100), ("preln", 6, 1e-3, 100), ("deepnet", 6, 1e-3, 100)]
    assert {c[1] for c in grid[:6]} == {6} and {c[1] for c in grid[6:12]} == {18}
    assert grid[12:] == [(m, 6, lr, 400) for lr in (1e-3, 2e-3) for m in ("postln", "preln", "deepnet")]


@pytest.mark.parametrize("result, src_dep, valid_nll, expected", [
    ({"diverged": "yes", "reason": "training diverged at update 7: ..."}, {}, math.nan, "diverges"),
    ({"diverged": "no", "reason": ""}, {20: 0.0}, 13.5, "diverges"),   # above the uniform entropy: blown up
    ({"diverged": "no", "reason": ""}, {20: 2.0}, 7.8, "stalls"),      # not below unigram - margin
    ({"diverged": "no", "reason": ""}, {20: 2.0, 40: 0.1}, 6.0, "stalls"),  # the last probe: source ignored
    ({"diverged": "no", "reason": ""}, {20: 0.1, 40: 1.0}, 6.0, "trains"),
])
def test_classify(result, src_dep, valid_nll, expected):
    status, reason, last = smap.classify(result, {"src_dep": src_dep}, valid_nll, unigram=8.0, uniform=13.0,
                                         args=RULE)
    assert status == expected
    assert (reason == "") == (expected == "trains")
    if src_dep:
        assert last == src_dep[max(src_dep)]


def test_target_entropies_of_the_binarised_data(multi30k_bin):
    unigram, uniform = smap.target_entropies(multi30k_bin)
    assert 4 < unigram < uniform < 14


def test_script_help_and_bad_input(tmp_path):
    proc = run(["bash", "scripts/stability_map.sh", "--help"], cwd=ROOT)
    assert "--lrs" in proc.stdout and "stalls" in proc.stdout
    proc = run(["bash", "scripts/stability_map.sh", "--out", tmp_path, "--methods", "postln,nope"], cwd=ROOT,
               check=False)
    assert proc.returncode == 2 and "unknown method(s) ['nope']" in proc.stderr
    proc = run(["bash", "scripts/stability_map.sh", "--out", tmp_path, "--data", tmp_path], cwd=ROOT, check=False)
    assert proc.returncode != 0 and "not a binarised fairseq data dir" in proc.stderr


def test_a_map_stopped_mid_grid_keeps_its_finished_cells_in_the_csv(tmp_path, monkeypatch):
    """The CSVs are written as each cell finishes, so a lane stopped in the second cell has the first recorded."""
    def run_cell(args, data, method, depth, lr, warmup):  # the first cell finishes as sweep.train_one leaves it
        if method != "postln":
            raise KeyboardInterrupt  # the lane stopped here
        cell = tmp_path / "map" / "runs" / f"{method}_L{depth}_lr{lr:g}_w{warmup}_s1"
        cell.mkdir(parents=True)
        (cell / "result.json").write_text('{"diverged": "no", "reason": "", "updates": 4, '
                                          '"final_train_loss": 9.1, "wall_s": 3.0}')
        (cell / "curves.csv").write_text(f"{method},{depth},1,4,src_dep,0.5\n")
        (cell / "train.log").write_text('2026-01-01 00:00:00 | INFO | valid | {"valid_nll_loss": "6.0"}\n')
        (cell / ".done").touch()

    monkeypatch.setattr(smap, "run_cell", run_cell)
    monkeypatch.setattr(smap, "target_entropies", lambda data: (8.0, 13.0))
    with pytest.raises(KeyboardInterrupt):
        smap.main(["--out", str(tmp_path / "map"), "--data", str(tmp_path), "--methods", "postln,preln",
                   "--depths", "1", "--lrs", "1e-3", "--csv", str(tmp_path / "committed.csv")])
    for path in (tmp_path / "map" / "map.csv", tmp_path / "committed.csv"):
        rows = list(csv.DictReader(open(path)))
        assert [(r["method"], r["status"], r["valid_nll"]) for r in rows] == [("postln", "trains", "6.0")]


@pytest.mark.slow  # about 12 s of CPU
def test_one_cell_end_to_end_then_resumed(multi30k_bin, tmp_path):
    cmd = ["bash", "scripts/stability_map.sh", "--out", tmp_path / "map", "--data", multi30k_bin,
           "--methods", "deepnet", "--depths", "1", "--lrs", "1e-3", "--updates", "4", "--probe-every", "2",
           "--figures", tmp_path / "fig"]
    first = run(cmd, cwd=ROOT)
    rows = list(csv.DictReader(open(tmp_path / "map" / "map.csv")))
    assert len(rows) == 1 and rows[0]["method"] == "deepnet" and rows[0]["depth"] == "1"
    assert rows[0]["status"] in ("trains", "stalls", "diverges") and rows[0]["updates"] == "4"
    assert math.isfinite(float(rows[0]["valid_nll"])) and math.isfinite(float(rows[0]["src_dep"]))
    assert (tmp_path / "fig" / "stability_map_deepnet.png").stat().st_size > 0
    again = run(cmd, cwd=ROOT)  # the finished cell is kept, not retrained
    assert "1 cells in" in again.stdout and list(csv.DictReader(open(tmp_path / "map" / "map.csv"))) == rows
    assert first.stdout.splitlines()[0] == again.stdout.splitlines()[0]
    # a machine without OUT/runs: the cell that --csv holds is kept, not trained again
    committed = tmp_path / "committed.csv"
    run([*cmd, "--csv", committed], cwd=ROOT)
    fresh = run([*cmd[:3], tmp_path / "fresh", *cmd[4:], "--csv", committed], cwd=ROOT)
    assert "0 cells in this call" in fresh.stdout
    assert list(csv.DictReader(open(tmp_path / "fresh" / "map.csv"))) == rows
    assert list(csv.DictReader(open(committed))) == rows


COMMITTED = ROOT / "docs" / "figures" / "stability_map.csv"


@pytest.mark.skipif(not COMMITTED.exists(), reason="no committed stability map yet")
def test_committed_map_backs_the_documented_counts():
    """docs/diagnostics.md quotes, per method, how many cells train / stall / diverge."""
    rows = list(csv.DictReader(open(COMMITTED)))
    doc = (ROOT / "docs" / "diagnostics.md").read_text()
    for method in dict.fromkeys(r["method"] for r in rows):
        label = deepnet_methods.label(method)
        mine = [r for r in rows if r["method"] == method and r["warmup"] == "100"]
        if not mine:
            continue
        counts = {s: sum(r["status"] == s for r in mine) for s in ("trains", "stalls", "diverges")}
        line = (f"{label}: {counts['trains']} train, {counts['stalls']} stall, {counts['diverges']} diverge "
                f"(of {len(mine)})")
        assert line in doc, line


@pytest.mark.slow  # ~18 s: a cell of fairseq-train with every hook
def test_plateau_runs_a_cell_with_every_hook_and_plots_what_it_shows(multi30k_bin, tmp_path):
    from deepnet_experiments import plateau

    proc = run([ROOT / ".venv" / "bin" / "python", "-m", "deepnet_experiments.plateau", "--data", multi30k_bin,
                "--out", tmp_path, "--methods", "deepnet", "--depth", "1", "--lrs", "1e-3", "--updates", "4",
                "--probe-every", "2", "--figure", tmp_path / "plateau.png", "--csv", tmp_path / "plateau.csv"], cwd=ROOT)
    for quantity in ("src_dep (bits/token)", "cross-attention / residual", "gradient share of cross-attention",
                     "gradient share of the encoder"):
        assert quantity in proc.stdout
    curves = plateau.read_curves(next((tmp_path / "runs").glob("deepnet_L1_*")))
    values = plateau.series(curves)
    assert set(values["gradient share of cross-attention"]) == set(range(1, 5))  # every update
    for share in ("gradient share of cross-attention", "gradient share of the encoder"):
        assert all(0 < v < 1 for v in values[share].values())
    assert sorted(values["src_dep (bits/token)"]) == [1, 3] and values["cross-attention / residual"][1] > 0
    assert (tmp_path / "plateau.png").stat().st_size > 0
    rows = list(csv.DictReader(open(tmp_path / "plateau.csv")))
    assert {r["quantity"] for r in rows} == set(values) and {r["run"] for r in rows} == {"DeepNet, lr 0.001"}
