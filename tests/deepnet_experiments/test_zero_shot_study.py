"""The zero-shot study's script (deepnet_experiments/zero_shot_study.py) without training: its raw layout of
the shared Multi30k, its commands, and its summary over seeds from evaluation records."""

import csv
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import ROOT, SHARED_DATA

from deepnet_experiments import zero_shot_study as study


def test_opus_layout_of_multi30k_is_three_way_parallel(tmp_path):
    raw = tmp_path / "raw"
    study.opus_layout(SHARED_DATA, raw, max_train=50, test_lines=7)
    files = sorted(str(p.relative_to(raw)) for p in raw.rglob("opus.*"))
    assert len(files) == 2 * 3 * 2 + 2 and "zeroshot/de-fr/opus.de-fr-test.fr" in files
    read = lambda p: (raw / p).read_text(encoding="utf-8").splitlines()  # noqa: E731
    assert len(read("supervised/de-en/opus.de-en-train.de")) == 50
    assert len(read("supervised/en-fr/opus.en-fr-dev.fr")) == 1014  # valid: all lines
    # the test sets are line-aligned across the two corpora: the same English, hence de-fr pairs
    assert read("supervised/de-en/opus.de-en-test.en") == read("supervised/en-fr/opus.en-fr-test.en")
    assert read("zeroshot/de-fr/opus.de-fr-test.de") == read("supervised/de-en/opus.de-en-test.de")
    assert read("zeroshot/de-fr/opus.de-fr-test.fr") == read("supervised/en-fr/opus.en-fr-test.fr")
    study.opus_layout(SHARED_DATA, raw, max_train=50, test_lines=7)  # done: skipped
    with pytest.raises(study.StudyError, match="use another --work"):
        study.opus_layout(SHARED_DATA, raw, max_train=60, test_lines=7)


def test_disjoint_training_pairs_share_no_caption(tmp_path):
    """Issue 33: de-en and en-fr trained on disjoint halves, so no English side of one pair is in the other."""
    raw = tmp_path / "raw"
    study.opus_layout(SHARED_DATA, raw, max_train=40, test_lines=5, train_pairs="disjoint")
    read = lambda p: (raw / p).read_text(encoding="utf-8").splitlines()  # noqa: E731
    de_en, en_fr = read("supervised/de-en/opus.de-en-train.en"), read("supervised/en-fr/opus.en-fr-train.en")
    everything = (SHARED_DATA / "multi30k_de_en/train.en").read_text(encoding="utf-8").splitlines()[:40]
    assert de_en == everything[:20] and en_fr == everything[20:]
    assert read("supervised/en-fr/opus.en-fr-train.fr")[0] == (
        SHARED_DATA / "multi30k_en_fr/train.fr").read_text(encoding="utf-8").splitlines()[20]  # still aligned
    with pytest.raises(study.StudyError, match="use another --work"):
        study.opus_layout(SHARED_DATA, raw, max_train=40, test_lines=5)  # laid out otherwise


def test_runs_of_each_tag_strategy_and_remedy_have_their_own_folder(tmp_path, capsys):
    args = ["--dry-run", "--archs", "deepnet_source", "--lang-tags", "s-enc-t-dec,t-enc", "--remedies",
            "none,residual_drop,robt", "--seeds", "1", "--stages", "100", "--work", str(tmp_path / "w"),
            "--runs", str(tmp_path / "r")]
    assert study.main(args) == 0
    trains = [line for line in capsys.readouterr().out.splitlines() if "train_opus100.sh" in line]
    folders = [line.split("--run-dir ")[1].split()[0].split("/")[-2] for line in trains]
    assert folders == ["deepnet_source", "deepnet_source_rdrop3", "deepnet_source_robt", "deepnet_source_t-enc",
                       "deepnet_source_t-enc_rdrop3", "deepnet_source_t-enc_robt"]
    assert "data.lang_tags=t-enc" in trains[3] and "data.lang_tags=s-enc-t-dec" in trains[0]
    assert "train.extra_args=[--deepnorm-init,source,--encoder-drop-residual-layer,3]" in trains[4]
    assert ("train.extra_args=[--deepnorm-init,source,--task,translation_multi_robt,--robt-share,0.5,"
            "--robt-from-update,750]") in trains[5]
    assert study.model_name("deepnet_source_t-enc_rdrop3") == "DeepNet, source init, t-enc, residual drop 3"
    assert study.model_name("deepnet_source_t-enc-t-dec_robt") == "DeepNet, source init, t-enc-t-dec, ROBT"
    assert study.model_name("preln") == "Pre-LN"
    assert study.main([*args[:3], "--lang-tags", "x-enc"]) == 2


def test_crossconst_from_scratch_and_as_a_finetune_of_the_run_without_it(tmp_path, capsys):
    """crossconst<A>: the criterion and weight from the first update; crossconst<A>_ft: the base run (trained where this
    machine lacks its checkpoint at the first stage) then FINETUNE_UPDATES from that checkpoint; + joins remedies."""
    base = tmp_path / "r" / "seed1" / "opus100" / "preln" / "6L-6L" / "checkpoints"
    base.mkdir(parents=True)
    (base / "checkpoint_3_1500.pt").touch()  # the base run's checkpoint at the first stage, as training leaves it
    args = ["--dry-run", "--archs", "preln", "--remedies", "crossconst0.25,crossconst0.5_ft,robt+crossconst0.1",
            "--seeds", "1", "--stages", "1500,3000", "--work", str(tmp_path / "w"), "--runs", str(tmp_path / "r")]
    assert study.main(args) == 0
    trains = [line for line in capsys.readouterr().out.splitlines() if "train_opus100.sh" in line]
    folders = [line.split("--run-dir ")[1].split()[0].split("/")[-2] for line in trains]
    assert folders == ["preln_cc0.25", "preln_cc0.5ft", "preln_robt_cc0.1", "preln_cc0.25", "preln_robt_cc0.1"]
    assert "train.crossconst_alpha=0.25 train.criterion=diagnostic_label_smoothed_cross_entropy" in trains[0]
    finetune = trains[1]
    assert f"train.finetune_from_model={base / 'checkpoint_3_1500.pt'}" in finetune
    assert "train.max_update=500" in finetune and "train.warmup_updates=100" in finetune
    assert "translation_multi_robt" in trains[2] and "train.crossconst_alpha=0.1" in trains[2]
    assert study.model_name("preln_cc0.5ft") == "Pre-LN, CrossConST 0.5, fine-tuned"
    from deepnet_experiments import pages  # the pages' tables name the same remedies, combined ones joined

    assert pages.zero_shot_parts("preln_t-enc-t-dec_robt_cc0.1") == ("preln", "t-enc-t-dec", "ROBT + CrossConST 0.1")
    assert pages.is_remedy("CrossConST 0.5, fine-tuned", ["CrossConST"]) and not pages.is_remedy("ROBT", ["none"])
    assert study.finetune_base("robt+crossconst0.25_ft") == "robt" and study.finetune_base("crossconst0.1") is None
    assert study.main([*args[:3], "--remedies", "crossconst0.1_ft+crossconst0.2_ft"]) == 2


def test_dry_run_lists_every_stage_seed_and_arch(tmp_path, capsys):
    args = ["--dry-run", "--archs", "preln,deepnet_source", "--seeds", "1,2", "--stages", "200,100",
            "--work", str(tmp_path / "w"), "--runs", str(tmp_path / "r"), "model.heads=2"]
    assert study.main(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[zero_shot_study]")]
    assert "prepare_opus100.sh" in lines[0] and "binarize.sh" in lines[1]
    trains = [line for line in lines if "train_opus100.sh" in line]
    assert len(trains) == 2 * 2 * 2 and all("--layers 6,6 --cpu" in line for line in trains)
    assert "train.seed=1" in trains[0] and "train.max_update=100" in trains[0] and "train.max_update=200" in trains[-1]
    assert all(line.index("model.heads=4") < line.index("model.heads=2") for line in trains)  # user's overrides last
    assert f"--run-dir {tmp_path / 'r' / 'seed2' / 'opus100' / 'deepnet_source' / '6L-6L'}" in trains[-1]
    assert "--arch deepnet " in trains[-1] and "'train.extra_args=[--deepnorm-init,source]'" in trains[-1]
    assert "--arch preln " in trains[0] and "'train.extra_args=[]'" in trains[0]
    evals = [line for line in lines if "evaluate.sh" in line]
    assert [line.split("--run-dir")[1] for line in evals] == [line.split("--run-dir")[1] for line in trains]
    assert not (tmp_path / "w").exists()
    assert study.main(["--archs", "transformer", "--dry-run"]) == 2
    assert study.main(["--seeds", "x", "--dry-run"]) == 2
    capsys.readouterr()
    assert study.main([*args, "--device", "gpu"]) == 0  # on the GPU: no --cpu, and fp32 as on CPU
    lines = [line for line in capsys.readouterr().out.splitlines() if "train_opus100.sh" in line or "evaluate.sh" in line]
    assert len(lines) == 2 * 8 and all("--cpu" not in line and "train.precision=fp32" in line for line in lines)


def test_a_stage_marked_done_is_skipped(tmp_path, capsys):
    from deepnet_setups import runner

    runs = tmp_path / "r"
    runner.mark_stage(runs / "seed1" / "opus100" / "deepnet" / "6L-6L", 100)
    assert study.main(["--dry-run", "--archs", "deepnet", "--seeds", "1", "--stages", "100,200",
                       "--work", str(tmp_path / "w"), "--runs", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "6L-6L: stage 100 done" in out
    trains = [line for line in out.splitlines() if "train_opus100.sh" in line]
    assert len(trains) == 1 and "train.max_update=200" in trains[0]


def test_a_stage_recorded_without_its_folder_is_skipped(tmp_path, capsys):
    # a new machine: the run folders are gone, the records (copied from the committed ones) remain
    runs = tmp_path / "r"
    runs.mkdir()
    folder = runs / "seed1" / "opus100" / "deepnet" / "6L-6L"
    (runs / "results.jsonl").write_text(json.dumps({"kind": "train", "run_dir": str(folder), "updates": 200}) + "\n"
                                        + json.dumps({"kind": "eval", "run_dir": str(folder), "updates": 100}) + "\n")
    assert study.main(["--dry-run", "--archs", "deepnet", "--seeds", "1", "--stages", "100,200",
                       "--work", str(tmp_path / "w"), "--runs", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "6L-6L: stage 100 done" in out and "stage 200 done" not in out
    trains = [line for line in out.splitlines() if "train_opus100.sh" in line]
    assert len(trains) == 1 and "train.max_update=200" in trains[0]


def eval_record(arch, seed, updates, bleu, on_target):
    directions = [{"direction": d, "bleu": bleu[d], "target_lang_acc": on_target[d]} for d in bleu]
    return {"kind": "eval", "setup": "opus100", "arch": arch, "encoder_layers": 6, "decoder_layers": 6,
            "updates": updates, "run_dir": f"runs/zero_shot/seed{seed}/opus100/{arch}/6L-6L", "directions": directions}


def test_summary_over_seeds(tmp_path):
    bleu1 = {"de-en": 10.0, "en-de": 8.0, "en-fr": 12.0, "fr-en": 14.0, "de-fr": 1.0, "fr-de": 3.0}
    bleu2 = {d: v + 2 for d, v in bleu1.items()}
    acc1 = {d: 100.0 for d in bleu1} | {"de-fr": 20.0, "fr-de": 40.0}
    acc2 = {d: 100.0 for d in bleu1} | {"de-fr": 30.0, "fr-de": 50.0}
    records = [eval_record("deepnet", 1, 1500, bleu1, acc1), eval_record("deepnet", 2, 1500, bleu2, acc2),
               eval_record("preln", 1, 1500, bleu1, acc1),
               dict(eval_record("deepnet_source", 1, 1500, bleu2, acc2), arch="deepnet"),  # its run folder names it
               {"kind": "train", "setup": "opus100", "arch": "deepnet", "encoder_layers": 6, "decoder_layers": 6,
                "updates": 1500, "run_dir": "runs/zero_shot/seed1/opus100/deepnet/6L-6L", "wall_time_s": 600.0},
               {"kind": "eval", "setup": "opus100", "arch": "deepnet", "run_dir": "elsewhere/opus100/deepnet/6L-6L",
                "encoder_layers": 6, "decoder_layers": 6, "updates": 1500, "directions": []}]  # not the study's
    rows = study.write_summary(records, tmp_path)
    assert [(r["model"], r["seeds"]) for r in rows] == [("Pre-LN", "1"), ("DeepNet", "1,2"),
                                                         ("DeepNet, source init", "1")]
    assert rows[2]["de-en bleu"] == (12.0, 0.0)
    deepnet = rows[1]
    assert deepnet["de-en bleu"] == (11.0, pytest.approx(math.sqrt(2)))
    assert deepnet["supervised bleu"] == (12.0, pytest.approx(math.sqrt(2)))
    assert deepnet["zero-shot bleu"] == (3.0, pytest.approx(math.sqrt(2)))
    assert deepnet["zero-shot on-target"] == (35.0, pytest.approx(math.sqrt(50)))
    assert deepnet["train wall s (this stage)"] == (600.0, 0.0)
    assert rows[0]["de-fr on-target"] == (20.0, 0.0)
    table = (tmp_path / "results.md").read_text()
    assert "| DeepNet | 6L-6L | 1500 | 1,2 | 11.00 ± 1.41 |" in table and "de-fr*" in table
    summary = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert summary[1]["zero-shot on-target mean"] == "35.0"
    assert (tmp_path / "zero_shot.png").read_bytes()[:4] == b"\x89PNG"
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == len(records)


def test_commands_txt_keeps_the_commands_of_earlier_machines(tmp_path):
    # OUT/commands.txt was committed from another machine; this one's RUNS/commands.txt lists only its own runs
    out, runs = tmp_path / "out", tmp_path / "runs"
    out.mkdir(), runs.mkdir()
    (out / "commands.txt").write_text("python -m deepnet_experiments.zero_shot_study --seeds 1\n\nprep\ntrain 1\n")
    (runs / "commands.txt").write_text("prep\ntrain 2\n")
    folder = runs / "seed2" / "opus100" / "deepnet" / "6L-6L"
    record = eval_record("deepnet", 2, 100, {"de-en": 1.0}, {"de-en": 100.0}) | {"run_dir": str(folder)}
    (runs / "results.jsonl").write_text(json.dumps(record) + "\n")
    assert study.main(["--summary-only", "--runs", str(runs), "--out", str(out)]) == 0
    assert (out / "commands.txt").read_text().splitlines() == [
        "python -m deepnet_experiments.zero_shot_study --summary-only --runs " + f"{runs} --out {out}", "",
        "prep", "train 1", "train 2"]


def test_commands_sh_shares_out_seeds_and_sends_runs_to_the_gpu(tmp_path):
    """docs/results/zero_shot_tags/commands.sh --seeds --gpu: what gpu.sh starts, one process a seed."""
    here = ROOT / "docs" / "results" / "zero_shot_tags"
    proc = subprocess.run(["bash", here / "commands.sh", "remedy", "t-enc-t-dec", "--archs", "preln", "--remedies",
                           "robt", "--seeds", "2", "--gpu", "--runs", tmp_path, "--dry-run"],
                          capture_output=True, text=True, check=True, env=dict(os.environ, PYTHON=sys.executable))
    trains = [line for line in proc.stdout.splitlines() if "train_opus100.sh" in line]
    assert len(trains) == 1 and "train.seed=2" in trains[0] and "--cpu" not in trains[0]
    assert "seed2/opus100/preln_t-enc-t-dec_robt/6L-6L" in trains[0] and "train.precision=fp32" in trains[0]
    proc = subprocess.run(["bash", here / "gpu.sh"], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage: docs/results/zero_shot_tags/gpu.sh OUT_DIR" in proc.stderr


def test_best_crossconst_meets_the_goal_at_the_least_supervised_cost(tmp_path, capsys):
    zero_shot = ("de-fr", "fr-de")

    def run(folder, seed, supervised, zero_shot_bleu, on_target, updates=1500, pivot=10.0):
        record = eval_record(folder, seed, updates, {d: supervised for d in study.SUPERVISED}
                             | {d: zero_shot_bleu for d in zero_shot}, {d: on_target for d in study.SUPERVISED + zero_shot})
        for d in record["directions"]:
            if d["direction"] in zero_shot:
                d["zero_shot_over_pivot"] = zero_shot_bleu / pivot
        return record

    plain = "deepnet_source_t-enc-t-dec"
    ft = study.FINETUNE_UPDATES
    records = [run(plain, 1, 19.0, 2.0, 90.0),
               run(plain + "_cc0.1", 1, 18.0, 8.5, 100.0),  # meets the goal's zero-shot parts at a cost of 1.0
               run(plain + "_cc0.25", 1, 17.0, 9.5, 100.0),  # too, at 2.0
               run(plain + "_cc0ft", 1, 21.5, 2.5, 92.0, updates=ft),  # the fine-tune at weight 0: 500 more updates
               run(plain + "_cc0.1ft", 1, 20.0, 8.0, 99.0, updates=ft),  # meets them, higher but at a cost of 1.5
               run(plain + "_cc0.5", 2, 19.0, 9.9, 100.0),  # another seed
               run(plain + "_robt_cc0.1", 1, 19.5, 9.9, 100.0)]  # combined: not a CrossConST weight of its own
    assert study.best_crossconst(records, "deepnet_source", "t-enc-t-dec") == "crossconst0.1"
    # a fine-tune without its weight-0 control is not ranked
    assert study.best_crossconst(records[:3] + records[4:], "deepnet_source", "t-enc-t-dec") == "crossconst0.1"
    # none meets them: the highest zero-shot / pivot, a fine-tune too
    records = [records[0], records[3], run(plain + "_cc0.1", 1, 18.0, 6.0, 100.0),
               run(plain + "_cc0.1ft", 1, 20.0, 7.0, 99.0, updates=ft)]
    assert study.best_crossconst(records, "deepnet_source", "t-enc-t-dec") == "crossconst0.1_ft"
    assert study.best_crossconst(records, "preln", "t-enc-t-dec") is None
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    best = ["--best-crossconst", "--lang-tags", "t-enc-t-dec", "--runs", str(tmp_path)]
    assert study.main([*best, "--archs", "deepnet_source"]) == 0 and capsys.readouterr().out == "crossconst0.1_ft\n"
    assert study.main([*best, "--archs", "preln"]) == 2
