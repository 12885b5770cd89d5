"""Every checkpoint-loading entry point names a bad file; rerunning a finished fairseq-train does nothing.

fairseq-generate / fairseq-interactive with ``--user-dir deepnet_fairseq`` and the hub API
(``TransformerModel.from_pretrained``) get a truncated, a foreign and a malicious file. A finished
run rerun with the same command trains no update (fairseq alone trains one more and saves it).
"""

import pytest
import torch

from conftest import BIN, TINY_MODEL, USER_DIR, run

import deepnet_fairseq  # noqa: F401  (the plugin: allow-list and checked loaders)
from deepnet_fairseq.training import CorruptCheckpointError


@pytest.fixture(scope="module")
def dict_only_data(tmp_path_factory):
    """Enough of a data-bin for the translation task's setup (dictionaries only)."""
    folder = tmp_path_factory.mktemp("dicts")
    for lang in ("de", "en"):
        (folder / f"dict.{lang}.txt").write_text("ein 5\nhund 3\n")
    return folder


@pytest.fixture(scope="module")
def bad_checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad")
    torch.save({"model": {"w": torch.zeros(5000)}, "optimizer_history": []}, folder / "full.pt")
    data = (folder / "full.pt").read_bytes()
    (folder / "truncated.pt").write_bytes(data[: len(data) // 2])
    torch.save({"w": torch.zeros(3)}, folder / "foreign.pt")  # a plain state dict, not a fairseq checkpoint
    return folder


EXPECTED = {"truncated.pt": "truncated or not a torch checkpoint",
            "foreign.pt": "not a fairseq checkpoint (no 'model' entry; it holds keys ['w'])"}


# each a fairseq process (~8 s): make test keeps one, make test-slow (CI) the other; the hub test below has both
@pytest.mark.parametrize("name", ["truncated.pt", pytest.param("foreign.pt", marks=pytest.mark.slow)])
def test_fairseq_generate_names_a_bad_checkpoint_in_one_line(dict_only_data, bad_checkpoints, name):
    path = bad_checkpoints / name
    proc = run([BIN / "fairseq-generate", dict_only_data, "--user-dir", USER_DIR, "--path", path, "--cpu",
                "-s", "de", "-t", "en", "--gen-subset", "test"], check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {path}: {EXPECTED[name]}")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # a fairseq process (~10 s) on the loader fairseq-generate's test above goes through
def test_fairseq_interactive_names_a_truncated_checkpoint(dict_only_data, bad_checkpoints):
    path = bad_checkpoints / "truncated.pt"
    proc = run([BIN / "fairseq-interactive", dict_only_data, "--user-dir", USER_DIR, "--path", path, "--cpu",
                "-s", "de", "-t", "en"], input="ein hund\n", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {path}: truncated or not a torch checkpoint")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hub_from_pretrained_names_a_bad_checkpoint(dict_only_data, bad_checkpoints, name):
    from fairseq.models.transformer import TransformerModel

    with pytest.raises(CorruptCheckpointError) as info:
        TransformerModel.from_pretrained(str(bad_checkpoints), checkpoint_file=name,
                                         data_name_or_path=str(dict_only_data), user_dir=USER_DIR)
    assert str(info.value).startswith(f"{bad_checkpoints / name}: {EXPECTED[name]}")
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.slow  # two fairseq-train runs (~25 s)
@pytest.mark.parametrize("task", ["translation_exact_resume"])  # the multilingual task: test_reliability_multilingual.py
def test_rerunning_a_finished_run_trains_nothing(multi30k_small_bin, tmp_path, task):
    cmd = [BIN / "fairseq-train", multi30k_small_bin, "--user-dir", USER_DIR, "--task", task, "--arch", "deepnet_transformer",
           "--encoder-layers", "1", "--decoder-layers", "1", *TINY_MODEL, "--optimizer", "adam", "--lr", "1e-3",
           "--max-tokens", "500", "--max-update", "4", "--save-dir", tmp_path, "--no-epoch-checkpoints",
           "--disable-validation", "--num-workers", "0", "--cpu", "--log-format", "json", "--log-interval", "1"]
    first = run(cmd)
    assert '"num_updates": "4"' in first.stdout + first.stderr
    last = tmp_path / "checkpoint_last.pt"
    before = last.stat().st_mtime_ns
    again = run(cmd)
    text = again.stdout + again.stderr
    assert "nothing to train: the checkpoint is at update 4, --max-update is 4" in text
    assert "train_inner" not in text and '"num_updates": "5"' not in text
    assert last.stat().st_mtime_ns == before  # no checkpoint written
    assert torch.load(last)["optimizer_history"][-1]["num_updates"] == 4
