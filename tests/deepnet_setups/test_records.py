"""The records' schema: every committed record passes it (after scripts' migration), the migration derives what
it can and leaves the rest unknown, and a record that misstates its run is named."""

import json
from pathlib import Path

import pytest
from conftest import ROOT

from deepnet_setups import records

COMMITTED = sorted((ROOT / "docs").rglob("*.jsonl"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_committed_record_is_in_the_schema_and_migrating_it_changes_nothing(path):
    found = records.read(path)
    assert found
    for number, record in enumerate(found, 1):
        assert records.problems(record) == [], f"{path}:{number}"
        assert records.migrate(record, path) == record, f"{path}:{number}: not yet migrated"


def test_the_lent_gpu_runs_are_marked_with_their_gpu_and_command():
    gpu = records.read(ROOT / "docs/results/source_init/gpu/results.jsonl")
    assert {(r["run"]["device"], r["run"]["gpu"], r["run"]["precision"], r["run"]["width"]) for r in gpu} == \
        {("cuda", "NVIDIA H200", "fp16", 256)}
    assert all(r["run"]["command"][0] == "fairseq-train" and "--fp16" in r["run"]["command"] for r in gpu)
    cpu = records.read(ROOT / "docs/results/source_init/results.jsonl")
    assert {(r["run"]["device"], r["run"]["precision"]) for r in cpu} == {("cpu", "fp32")}  # whatever the config said


def test_migration_derives_from_the_record_and_leaves_the_unknown_unknown(tmp_path):
    old = {"kind": "eval", "arch": "deepnet", "encoder_layers": 6, "decoder_layers": 6, "updates": 1500,
           "run_dir": "/work/runs/zero_shot/seed1/opus100/deepnet/6L-6L", "device": "cpu",
           "deepnorm": {"encoder_alpha": 1.4, "init": "source"},
           "settings": {"model": {"embed_dim": 64, "ffn_dim": 256, "heads": 4, "deepnorm_init": "paper",
                                  "encoder_layers": 100},
                        "train": {"lr": 0.002, "warmup_updates": 100, "seed": 1, "precision": "fp16",
                                  "extra_args": ["--deepnorm-init", "source", "--lr", "0.001"]}}}
    new = records.migrate(old, tmp_path / "results.jsonl")
    assert "settings" not in new and "device" not in new
    assert new["config"]["model"] == old["settings"]["model"] and "precision" not in new["config"]["train"]
    assert new["eval_device"] == "cpu"
    assert new["run"] == {"device": "cpu", "gpu": None, "precision": "fp32", "width": 64, "ffn": 256, "heads": 4,
                          "encoder_layers": 6, "decoder_layers": 6, "lr": 0.001, "warmup_updates": 100, "seed": 1,
                          "updates": 1500, "init": "source", "command": None, "git_commit": None, "versions": None}
    bare = records.migrate({"kind": "train", "arch": "preln", "encoder_layers": 18, "decoder_layers": 18,
                            "run_dir": "runs/m30k_table/iwslt14_de_en/preln/18L-18L", "updates": 1500}, tmp_path / "r.jsonl")
    assert "init" not in bare["run"] and bare["run"]["width"] is None and bare["run"]["seed"] is None
    assert records.problems(bare) == []


def test_a_record_that_misstates_its_run_is_named():
    record = {"arch": "preln", "encoder_layers": 6, "run": {key: None for key in records.RUN_KEYS}}
    record["run"].update(device="cpu", precision="fp16", encoder_layers=10)
    record["config"] = {"train": {"precision": "fp16"}}
    assert records.problems(record) == ["run.init is not a field of the schema", "a CPU run computes in fp32, not fp16",
                                        "run.encoder_layers 10 disagrees with the record's 6",
                                        "a CPU run's config names GPU-only keys (precision, fp16 loss scale)"]
    assert records.problems({"arch": "deepnet"}) == ["no run block"]


def test_a_preempted_run_states_the_update_it_was_saved_at(tmp_path):
    """Launchers before 2026-12-07 gave a preempted run the last logged update (300) beside its checkpoint's (323)."""
    run = {**{key: None for key in records.RUN_KEYS if key != "init"}, "device": "cpu", "updates": 323}
    record = {"kind": "train", "arch": "preln", "preempted": True, "updates": 300, "run": run}
    assert records.problems(record) == ["a preempted run stopped at its checkpoint's update 323, not 300"]
    migrated = records.migrate(record, tmp_path / "results.jsonl")
    assert migrated["updates"] == 323 and records.problems(migrated) == []
    finished = {**record, "preempted": False, "diverged": True}  # a diverged run got as far as its log says
    assert records.migrate(finished, tmp_path / "results.jsonl")["updates"] == 300


def test_the_check_command_fails_on_a_bad_file(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"arch": "preln", "run_dir": "runs/preln/6L-6L", "settings": {}}) + "\n")
    assert records.main(["check", str(path)]) == 1
    assert f"{path}:1: no run block" in capsys.readouterr().err
    assert records.main(["migrate", str(path)]) == 0 and records.main(["check", str(path)]) == 0
