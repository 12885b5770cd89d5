"""docs/results/reach's tables: each method's best rate per width, the width's best cell, s/update of resumed
stages, the small Table 1's d64 records joined with what they ran, and other studies' runs filling cells only for
the methods the width lane trains."""

import csv
import json

from conftest import ROOT

from deepnet_experiments import reach_tables

TABLE = [ROOT / "docs/results/multi30k_table/results.jsonl", ROOT / "docs/results/multi30k_table/results_source_init.jsonl"]
SCHEMES = ROOT / "docs/results/schemes/results.jsonl"  # d64 18L-18L at each method's best map rate


def record(kind, variant, width, lr, updates, value, wall=None, layers=18, study="width", world_size=1):
    arch, init = ("deepnet", variant) if variant in ("paper", "source") else (variant, None)
    run_dir = f"/work/runs/reach/{study}/d{width}/lr{lr}/{variant}/seed1/{layers}L-{layers}L"
    run = {"seed": 1, "lr": lr, "warmup_updates": 100, "device": "cpu", "width": width, "precision": "fp32"}
    r = {"kind": kind, "arch": arch, "deepnorm_init": init, "encoder_layers": layers, "decoder_layers": layers,
         "run_dir": run_dir, "setup": "iwslt14_de_en", "run": run, "updates": updates}
    if kind == "eval":
        r.update(max_update=updates, bleu=value)
    else:
        r.update(valid_loss=value, wall_time_s=wall, peak_rss_mib=1000 + updates, world_size=world_size,
                 config={"train": {"max_update": updates}})
    return r


def test_best_rate_per_method_and_width_with_the_d64_table(tmp_path):
    records = [record("train", "source", 128, 0.0005, 1500, 4.9, wall=3000), record("eval", "source", 128, 0.0005, 1500, 30.0),
               record("eval", "source", 128, 0.002, 1500, 25.0), record("eval", "preln", 128, 0.001, 1500, 31.0),
               record("eval", "paper", 128, 0.002, 1500, 3.0), record("eval", "paper", 128, 0.0005, 1500, 0.5),
               record("eval", "source", 256, 0.002, 1500, 0.01)]  # below STALLED_BLEU: on the plateau
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert reach_tables.main([str(path), *map(str, TABLE), "--out", str(tmp_path / "out")]) == 0
    rows = {(r["width"], r["method"], r["lr"]): r for r in csv.DictReader((tmp_path / "out/width.csv").open())}
    assert rows["128", "deepnet_source", "0.0005"]["best_rate"] == "True" and rows["128", "deepnet_source", "0.002"]["best_rate"] == "False"
    assert rows["128", "deepnet_source", "0.0005"]["s_per_update"] == "2.0" and rows["128", "deepnet_source", "0.0005"]["valid_loss"] == "4.9"
    assert [key for key, r in rows.items() if r["best_of_width"] == "True" and key[0] == "128"] == [("128", "preln", "0.001")]
    # a stalled run is never a best rate or cell, even where it is its method's or its width's only one
    assert [key for key, r in rows.items() if r["stalled"] == "True"] == [("128", "deepnet", "0.0005"), ("256", "deepnet_source", "0.002")]
    assert rows["256", "deepnet_source", "0.002"]["best_rate"] == rows["256", "deepnet_source", "0.002"]["best_of_width"] == "False"
    # d64 at 2e-3: the small Table 1's seed 1 (source init 30.38 in the README's depth bullet is seeds 1-3; seed 1 here)
    d64 = {key[1]: r for key, r in rows.items() if key[0] == "64"}
    assert set(d64) == {"preln", "deepnet", "deepnet_source"} and {r["lr"] for r in d64.values()} == {"0.002"}
    # the schemes table's runs fill d64 cells of the width lane's methods (its 2024-2025 schemes' rows do not)
    assert reach_tables.main([str(path), str(SCHEMES), *map(str, TABLE), "--out", str(tmp_path / "with")]) == 0
    cells = {(r["width"], r["method"], r["lr"]) for r in csv.DictReader((tmp_path / "with/width.csv").open())}
    assert ("64", "deepnet_source", "0.004") in cells and ("64", "preln", "0.008") in cells
    assert {method for _, method, _ in cells} == {"preln", "deepnet", "deepnet_source"}
    assert "*" in (tmp_path / "out/width.md").read_text() and (tmp_path / "out/width.png").read_bytes()[:4] == b"\x89PNG"
    # which.md: each method at its best rate, best first, its distance below the width's best and the rates it ran
    which = [line for line in (tmp_path / "out/which.md").read_text().splitlines() if line.startswith("| d128 ")]
    assert which == ["| d128 | cpu, fp32 | Pre-LN | 0.001 | 31.00 | 0.00 | 0.001 |",
                     "| d128 | cpu, fp32 | DeepNet, source init | 0.0005 | 30.00 | 1.00 | 0.0005, 0.002 |",
                     "| d128 | cpu, fp32 | DeepNet, paper init | 0.002 | 3.00 | 28.00 | 0.0005, 0.002 |"]
    assert "| d256 | cpu, fp32 | DeepNet, source init | none: stalled | 0.01 | - | 0.002 |" in (tmp_path / "out/which.md").read_text()


def test_a_resumed_stage_is_charged_its_own_updates(tmp_path):
    records = [record("train", "source", 64, 0.002, 500, 6.0, wall=20000, layers=500, study="deep"),
               record("train", "source", 64, 0.002, 1000, 5.0, wall=25000, layers=500, study="deep", world_size=2),
               record("eval", "source", 64, 0.002, 1000, 16.0, layers=500, study="deep")]
    stage_500, row = reach_tables.deep_rows(records)  # the 500-update stage, not evaluated, is a row without BLEU
    assert (stage_500["updates"], stage_500["bleu"], stage_500["s_per_update"]) == (500, None, 40.0)
    assert (row["depth"], row["updates"], row["bleu"], row["valid_loss"], row["s_per_update"], row["peak_rss_mib"],
            row["processes"]) == ("500L-500L", 1000, 16.0, 5.0, 50.0, 2000, 2)  # the stage's own processes


def test_a_probe_is_a_row_without_bleu_and_a_run_with_nothing_left_to_train_costs_nothing(tmp_path):
    probe = record("train", "source", 64, 0.001, 300, 7.5, wall=4500, layers=500, study="deep")
    again = dict(record("train", "source", 64, 0.002, 300, 8.9, wall=20, layers=500, study="deep"), resumed_from=300)
    rows = reach_tables.deep_rows([probe, again])
    assert [(r["lr"], r["bleu"], r["valid_loss"], r["s_per_update"], r["peak_rss_mib"]) for r in rows] == \
        [(0.001, None, 7.5, 15.0, 1300), (0.002, None, 8.9, None, None)]


def test_the_committed_tables_are_the_committed_records(tmp_path):
    """width.md, which.md and deep.md (and the CSVs) under docs/results/reach are what its records give today."""
    reach = ROOT / "docs/results/reach"
    gpu = sorted((reach / "gpu").rglob("results.jsonl")) if (reach / "gpu").exists() else []
    assert reach_tables.main([str(reach / "results.jsonl"), *map(str, gpu), str(SCHEMES), *map(str, TABLE),
                              "--out", str(tmp_path)]) == 0
    for name in ("width.md", "which.md", "deep.md", "width.csv", "deep.csv"):
        assert (tmp_path / name).read_text() == (reach / name).read_text(), f"{name}: docs/results/reach/commands.sh tables"
