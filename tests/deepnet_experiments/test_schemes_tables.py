"""docs/results/schemes' tables: the map's best rate per method and depth (the rate the table lane trains at), the
18L/50L table from the study's records, and the committed tables as the committed map and records give them."""

import csv
import json

from conftest import ROOT

from deepnet_experiments import schemes_tables

FIELDS = ["method", "depth", "lr", "warmup", "updates", "status", "valid_nll"]


def write_map(path, cells):
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(FIELDS)
        writer.writerows(cells)


def test_the_best_rate_is_the_training_cell_with_the_lowest_valid_nll(tmp_path):
    path = tmp_path / "map.csv"
    write_map(path, [["periln", 18, 0.001, 100, 200, "trains", 6.9], ["periln", 18, 0.002, 100, 200, "trains", 6.4],
                     ["periln", 18, 0.004, 100, 200, "stalls", 6.0],  # lower, but it does not train
                     ["periln", 18, 0.008, 4000, 200, "trains", 5.0],  # another warm-up: not the map's
                     ["deepnet_source_init", 18, 0.001, 100, 200, "stalls", 8.7],
                     ["dyt", 6, 0.001, 100, 200, "trains", 7.0]])
    cells = schemes_tables.read_map(path)
    assert set(cells) == {("periln", 18), ("deepnet_source", 18), ("dyt", 6)}  # names canonical, as the registry's
    assert schemes_tables.best_rate(cells["periln", 18]) == 0.002
    assert schemes_tables.best_rate(cells["deepnet_source", 18]) is None
    rows = schemes_tables.map_markdown(cells).splitlines()
    assert rows[0] == "| depth | method | lr 0.001 | lr 0.002 | lr 0.004 |"
    assert rows[2] == "| 6L-6L | DyT | **7.00** |  |  |"
    assert "| 18L-18L | Peri-LN | 6.90 | **6.40** | stalls |" in rows
    assert "| 18L-18L | DeepNet, source init | stalls |  |  |" in rows


def test_the_table_holds_the_studys_evaluations_by_depth_best_first(tmp_path):
    def record(kind, arch, lr, layers, value, study="schemes"):
        run_dir = f"/work/runs/{study}/lr{lr}/{arch}/seed1/{layers}L-{layers}L"
        r = {"kind": kind, "arch": arch, "encoder_layers": layers, "decoder_layers": layers, "run_dir": run_dir,
             "setup": "iwslt14_de_en", "run": {"seed": 1, "lr": lr, "device": "cpu"}, "updates": 1500}
        if kind == "eval":
            return dict(r, max_update=1500, bleu=value)
        return dict(r, valid_loss=value, wall_time_s=3000, peak_rss_mib=900, config={"train": {"max_update": 1500}})

    records = [record("train", "periln", 0.002, 18, 4.5), record("eval", "periln", 0.002, 18, 30.0),
               record("eval", "dyt", 0.004, 18, 31.0), record("eval", "mixln", 0.001, 50, 20.0),
               record("eval", "preln", 0.002, 18, 99.0, study="reach/width")]  # another study's run
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    write_map(tmp_path / "map.csv", [])
    assert schemes_tables.main([str(path), "--map", str(tmp_path / "map.csv"), "--out", str(tmp_path / "out")]) == 0
    rows = list(csv.DictReader((tmp_path / "out/table.csv").open()))
    assert [(r["depth"], r["method"], r["bleu"]) for r in rows] == [
        ("18L-18L", "dyt", "31.0"), ("18L-18L", "periln", "30.0"), ("50L-50L", "mixln", "20.0")]
    assert (rows[1]["valid_loss"], rows[1]["s_per_update"], rows[1]["peak_rss_mib"]) == ("4.5", "2.0", "900")


def test_another_studys_run_fills_a_depth_the_lane_left_at_the_best_map_rate_marked(tmp_path):
    def record(arch, lr, layers, bleu, study, **run):
        run_dir = f"/work/runs/{study}/lr{lr}/{arch}/seed1/{layers}L-{layers}L"
        run = {"seed": 1, "lr": lr, "warmup_updates": 100, "device": "cpu", "width": 64, "precision": "fp32", **run}
        return {"kind": "eval", "arch": arch, "encoder_layers": layers, "decoder_layers": layers, "run_dir": run_dir,
                "setup": "iwslt14_de_en", "run": run, "updates": 1500, "max_update": 1500, "bleu": bleu}

    write_map(tmp_path / "map.csv", [["preln", 50, 0.002, 100, 200, "trains", 6.9], ["preln", 50, 0.004, 100, 200, "stalls", 6.0],
                                     ["periln", 50, 0.002, 100, 200, "trains", 6.8]])
    mine = [record("preln", 0.008, 18, 25.0, "schemes"), record("periln", 0.002, 50, 20.0, "schemes")]
    other = [record("preln", 0.002, 50, 11.0, "depth"),  # the best map rate at 50L: a row
             record("preln", 0.004, 50, 12.0, "depth2"),  # another rate: not
             record("preln", 0.002, 50, 13.0, "wide", width=128),  # another width: not
             record("periln", 0.002, 50, 40.0, "depth"),  # the lane has its own: not
             record("dyt", 0.002, 50, 30.0, "depth")]  # a method the lane does not train: not
    for name, records in (("mine", mine), ("other", other)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert schemes_tables.main([str(tmp_path / "mine.jsonl"), "--map", str(tmp_path / "map.csv"), "--beside",
                                str(tmp_path / "other.jsonl"), "--out", str(tmp_path / "out")]) == 0
    rows = [(r["depth"], r["method"], r["bleu"]) for r in csv.DictReader((tmp_path / "out/table.csv").open())]
    assert rows == [("18L-18L", "preln", "25.0"), ("50L-50L", "periln", "20.0"), ("50L-50L", "preln", "11.0")]
    table = (tmp_path / "out/table.md").read_text()
    assert "| 50L-50L | Pre-LN | 0.002 | 1500 | 11.00† |" in table and "†: another study's run" in table


def test_the_committed_tables_are_the_committed_map_and_records(tmp_path):
    here = ROOT / "docs/results/schemes"
    records = [str(here / "results.jsonl")] if (here / "results.jsonl").exists() else []
    stability_map = str(ROOT / "docs/figures/stability_map.csv")
    beside = str(ROOT / "docs/results/source_init/results.jsonl")
    assert schemes_tables.main([*records, "--map", stability_map, "--beside", beside, "--out", str(tmp_path)]) == 0
    for name in ("map.md", "table.md"):
        assert (tmp_path / name).read_text() == (here / name).read_text(), \
            f"{name}: docs/results/schemes/commands.sh tables"
