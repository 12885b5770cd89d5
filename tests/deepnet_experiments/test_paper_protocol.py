"""scripts/paper_protocol_multi30k.sh (deepnet_experiments/paper_protocol.py) without training: its commands,
the stages it skips and marks, its --help and its errors."""

import pytest
from conftest import ROOT, SHARED_DATA, run

from deepnet_experiments import paper_protocol
from deepnet_setups import runner

SCRIPT = ["bash", ROOT / "scripts" / "paper_protocol_multi30k.sh"]


def test_dry_run_lists_every_stage_and_arch_but_the_marked_ones(tmp_path):
    work, runs = tmp_path / "w", tmp_path / "r"
    (work / "bin").mkdir(parents=True)
    (work / "bin" / ".done").touch()  # prepared: no prepare and binarize steps
    runner.mark_stage(runs / "iwslt14_de_en" / "deepnet" / "6L-4L", 100)
    lines = run([*SCRIPT, "--dry-run", "--archs", "deepnet,postln", "--layers", "6,4", "--stages", "100,200",
                 "--work", work, "--runs", runs], cwd=tmp_path).stdout.splitlines()  # from another folder
    assert "[paper_protocol] deepnet 6L-4L: stage 100 already trained and evaluated" in lines
    trains = [line for line in lines if "train_iwslt.sh" in line]
    evals = [line for line in lines if "evaluate.sh" in line]
    assert [line.split("--arch ")[1].split()[0] for line in trains] == ["postln", "deepnet", "postln"]
    assert all("--layers 6,4 --cpu" in line and "model.embed_dim=64" in line for line in trains)
    assert "train.max_update=100" in trains[0] and "train.max_update=200" in trains[-1]
    assert [line.split("--arch")[1] for line in evals] == [line.split("--arch")[1] for line in trains]
    assert not any("prepare_iwslt14.sh" in line for line in lines)
    assert not list(runs.rglob("evaluated_at_200"))  # a dry run marks nothing


def test_help_data_preparation_and_bad_input(tmp_path):
    assert "--stages LIST" in run([*SCRIPT, "--help"], cwd=tmp_path).stdout
    lines = run([*SCRIPT, "--dry-run", "--archs", "deepnet", "--stages", "5", "--work", tmp_path / "w",
                 "--raw-dir", SHARED_DATA / "multi30k_de_en"], cwd=tmp_path).stdout.splitlines()
    assert "prepare_iwslt14.sh --raw-dir" in lines[0] and "binarize.sh --config" in lines[1]
    for bad, message in ((["--archs", "foo"], "unknown arch 'foo'"), (["--stages", "0"], "--stages must be positive"),
                         (["--layers", "6"], "--layers must be N,M"), (["--bogus"], "unknown option '--bogus'"),
                         (["--work"], "option --work needs a value")):
        proc = run([*SCRIPT, "--dry-run", *bad], cwd=tmp_path, check=False)
        assert proc.returncode == 2 and message in proc.stderr, bad
    proc = run([*SCRIPT, "--dry-run", "--work", tmp_path / "w", "--raw-dir", tmp_path / "none"], cwd=tmp_path,
               check=False)
    assert proc.returncode == 1 and "no raw Multi30k" in proc.stderr


def test_a_finished_stage_is_marked_and_a_failed_step_stops_with_its_status(tmp_path, monkeypatch):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name in ("train_iwslt.sh", "evaluate.sh"):
        (scripts / name).write_text(f"#!/bin/bash\necho {name} >> {tmp_path / 'calls'}\n")
        (scripts / name).chmod(0o755)
    monkeypatch.setattr(paper_protocol, "SCRIPTS", scripts)
    (tmp_path / "w" / "bin").mkdir(parents=True)
    (tmp_path / "w" / "bin" / ".done").touch()
    args = ["--archs", "deepnet", "--layers", "2,2", "--work", str(tmp_path / "w"), "--runs", str(tmp_path / "r")]
    assert paper_protocol.main([*args, "--stages", "10,20"]) == 0
    assert paper_protocol.main([*args, "--stages", "10,20"]) == 0  # done: nothing runs again
    assert (tmp_path / "calls").read_text().split() == ["train_iwslt.sh", "evaluate.sh"] * 2
    assert runner.stage_done(tmp_path / "r" / "iwslt14_de_en" / "deepnet" / "2L-2L", 20)
    (scripts / "evaluate.sh").write_text("#!/bin/bash\nexit 3\n")
    with pytest.raises(SystemExit) as stop:
        paper_protocol.main([*args, "--stages", "30"])
    assert stop.value.code == 3 and not runner.stage_done(tmp_path / "r" / "iwslt14_de_en" / "deepnet" / "2L-2L", 30)
