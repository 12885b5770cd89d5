"""The seeds table: mean and spread over seeds, rows split by lr and warm-up and never pooled across devices,
widths or precisions, records whose run does not say these refused unless they are given (and then marked)."""

import csv
import json

import pytest

from deepnet_experiments import seeds_table


def record(kind, arch, seed, updates, value, lr=0.002, warmup=100, init="paper", settings=True, layers=18, device="cpu"):
    r = {"kind": kind, "arch": arch, "deepnorm_init": init if arch == "deepnet" else None, "encoder_layers": layers,
         "decoder_layers": layers, "run_dir": f"runs/{arch}_{init}/seed{seed}_{lr}_{warmup}/{layers}L",
         "setup": "iwslt14_de_en"}
    if settings:
        r["run"] = {"seed": seed, "lr": lr, "warmup_updates": warmup, "device": device, "width": 64,
                    "precision": "fp32" if device == "cpu" else "fp16"}
    if kind == "eval":
        r.update(max_update=updates, bleu=value)
    else:
        r.update(updates=updates, valid_loss=value)
    return r


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_mean_spread_and_valid_loss_over_seeds(tmp_path, capsys):
    records = [record("train", "deepnet", 2, 1500, 4.8, init="source"), record("eval", "deepnet", 2, 1500, 30.0, init="source"),
               record("train", "deepnet", 3, 1500, 5.0, init="source"), record("eval", "deepnet", 3, 1500, 31.0, init="source"),
               record("eval", "preln", 2, 1500, 22.0), record("eval", "preln", 2, 1500, 23.0, lr=5e-4, warmup=4000)]
    assert seeds_table.main([write(tmp_path / "r.jsonl", records), "--out", str(tmp_path / "out")]) == 0
    rows = {(r["method"], r["lr"]): r for r in csv.DictReader((tmp_path / "out/seeds.csv").open())}
    source = rows[("deepnet_source", "0.002")]
    assert (source["seeds"], source["bleu_mean"], source["bleu_min"], source["bleu_max"]) == ("2", "30.5", "30.0", "31.0")
    assert source["bleu_stdev"] == "0.71" and source["valid_loss_mean"] == "4.9" and source["per_seed"] == "2:30.0 3:31.0"
    # another schedule is another row, never averaged in
    assert rows[("preln", "0.002")]["bleu_mean"] == "22.0" and rows[("preln", "0.0005")]["bleu_mean"] == "23.0"
    assert "| DeepNet, source init | 18L-18L | 1500 | 0.002 | 100 | 2 | 30.50 | 30.00-31.00 | 0.71 | 4.900 |" in \
        (tmp_path / "out/seeds.md").read_text()
    assert not list((tmp_path / "out").glob("*.png"))  # one depth only: no depth plot


def test_a_depth_plot_for_each_schedule_with_two_depths(tmp_path, capsys):
    records = [record("eval", arch, 1, 1500, bleu, layers=n) for arch, n, bleu in
               (("preln", 6, 27.0), ("preln", 18, 23.0), ("deepnet", 6, 24.0), ("deepnet", 18, 5.7))]
    records.append(record("eval", "preln", 1, 1500, 20.0, lr=5e-4, warmup=4000))
    assert seeds_table.main([write(tmp_path / "r.jsonl", records), "--out", str(tmp_path / "out")]) == 0
    (plot,) = (tmp_path / "out").glob("*.png")
    assert plot.name == "depth_0.002_100_1500.png" and plot.read_bytes()[:4] == b"\x89PNG"
    assert f"[seeds_table] {plot}" in capsys.readouterr().out


def test_records_without_settings_need_them_given_and_are_marked(tmp_path, capsys):
    legacy = [record("eval", "deepnet_source_init", 1, 3000, 35.3, settings=False),
              record("eval", "deepnet", 2, 3000, 34.0, init="source")]
    path = write(tmp_path / "r.jsonl", legacy)
    assert seeds_table.main([path, "--out", str(tmp_path / "out")]) == 1
    assert "records no seed, lr, warmup_updates, device, width, precision" in capsys.readouterr().err
    assert seeds_table.main([path, "--out", str(tmp_path / "out"), "--unrecorded",
                             "seed=1,lr=0.002,warmup_updates=100,device=cpu,width=64,precision=fp32"]) == 0
    (row,) = csv.DictReader((tmp_path / "out/seeds.csv").open())  # the legacy name joins the source init's row
    assert row["method"] == "deepnet_source" and row["per_seed"] == "1*:35.3 2:34.0"
    assert "`*`: a run whose record carries no settings" in (tmp_path / "out/seeds.md").read_text()
    assert seeds_table.main([path, "--out", str(tmp_path / "out"), "--unrecorded", "seed=1"]) == 1  # not all given
    with pytest.raises(SystemExit):
        seeds_table.main([path, "--out", str(tmp_path / "out"), "--unrecorded", "seed=1,colour=red"])


def test_a_run_stopped_early_counts_the_updates_it_had_and_keeps_its_valid_loss(tmp_path, capsys):
    # launched for 1,000 updates, stopped at 624 by --stop-time-hours (docs/results/source_init/gpu.sh's TRAIN_MINUTES):
    # the evaluation averaged checkpoints up to 600, and the training record says 624
    train, evaluation = record("train", "preln", 1, 624, 6.18), record("eval", "preln", 1, 1000, 6.37)
    train["config"] = {"train": {"max_update": 1000}}
    evaluation["updates"] = 600
    assert seeds_table.main([write(tmp_path / "r.jsonl", [train, evaluation]), "--out", str(tmp_path / "out")]) == 0
    (row,) = csv.DictReader((tmp_path / "out/seeds.csv").open())
    assert (row["updates"], row["bleu_mean"], row["valid_loss_mean"]) == ("600", "6.37", "6.18")


def test_a_gpu_run_is_never_pooled_with_cpu_runs(tmp_path, capsys):
    records = [record("eval", "preln", 1, 1500, 30.0), record("eval", "preln", 2, 1500, 31.0),
               record("eval", "preln", 3, 1500, 12.0, device="cuda")]
    assert seeds_table.main([write(tmp_path / "r.jsonl", records), "--out", str(tmp_path / "out")]) == 0
    rows = {r["device"]: r for r in csv.DictReader((tmp_path / "out/seeds.csv").open())}
    assert (rows["cpu"]["seeds"], rows["cpu"]["bleu_mean"], rows["cpu"]["precision"]) == ("2", "30.5", "fp32")
    assert (rows["cuda"]["seeds"], rows["cuda"]["bleu_mean"], rows["cuda"]["precision"]) == ("1", "12.0", "fp16")
