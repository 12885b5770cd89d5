"""The multilingual setups (``translation_multi_simple_epoch``) resume exactly after a kill -9.

A real run with the setups' own options (``deepnet_setups.launch.train_args`` for the
OPUS-100 config: language tokens, temperature sampling), on real Multi30k de-en and en-fr text,
as 2 gloo processes under torchrun with ``--update-freq 2`` and 2 data-loader workers per process,
over several epochs. It is killed in the middle of writing a checkpoint (rank 0's atomic save), in
the middle of fairseq's copy to ``checkpoint_last.pt``, and (torchrun and every worker at once, as a
node failure) between checkpoint writes; rerunning the same command each time. Every update logs the
loss of the uninterrupted run and the final parameters are bitwise equal. A last rerun trains nothing.

Slow: 6 torchrun launches of 2 fairseq processes; 12.5 min (747 s, 111 s of it binarising) on the shared
2-core machine at a load average of ~7.
"""

import collections
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from conftest import BIN, ROOT, free_port, run
from test_reliability_resume import kill_shim, losses, train_env  # noqa: F401  (kill_shim: a fixture)

from deepnet_setups import config as cfgmod
from deepnet_setups import launch

pytestmark = pytest.mark.slow

LANGS = ("de", "en", "fr")
PAIRS = 150  # sentence pairs per corpus: 8 updates per epoch below
MAX_UPDATE = 24
SAVE_EVERY = 4


@pytest.fixture(scope="module")
def multilingual_work(tmp_path_factory):
    """de-en and en-fr Multi30k pairs binarised as the multilingual task reads them (one dictionary)."""
    work = tmp_path_factory.mktemp("multilingual")
    raw = work / "raw"
    raw.mkdir()
    sources = {"de-en": "multi30k_de_en", "en-fr": "multi30k_en_fr"}
    counts = collections.Counter()
    for pair, folder in sources.items():
        for lang in pair.split("-"):
            lines = (ROOT.parent / "shared" / "data" / folder / f"train.{lang}").read_text(encoding="utf-8")
            lines = [line.lower() for line in lines.splitlines()[:PAIRS]]
            (raw / f"train.{pair}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
            counts.update(word for line in lines for word in line.split())
    (work / "dict.txt").write_text("".join(f"{w} {c}\n" for w, c in counts.most_common()), encoding="utf-8")
    for pair in sources:
        src, tgt = pair.split("-")
        run([BIN / "fairseq-preprocess", "-s", src, "-t", tgt, "--trainpref", raw / f"train.{pair}",
             "--srcdict", work / "dict.txt", "--tgtdict", work / "dict.txt", "--destdir", work / "bin", "--workers", "1"])
    return work


def train_command(work, save_dir, user_dir):
    """torchrun + 2 CPU processes with the OPUS-100 setup's fairseq options (the kill shim as user dir)."""
    cfg = cfgmod.load(ROOT / "configs" / "opus100.yaml", [
        f"paths.work={work}", "data.langs=[de,en,fr]", "data.lang_pairs=[de-en,en-de,en-fr,fr-en]",
        "data.zero_shot_pairs=[]", "model.embed_dim=64", "model.ffn_dim=128", "model.heads=2",
        "train.max_tokens=400", "train.batch_tokens=1600", f"train.max_update={MAX_UPDATE}", "train.max_epoch=null",
        "train.warmup_updates=8", "train.lr=2e-3", "train.dropout=0.1", f"train.save_interval_updates={SAVE_EVERY}",
        "train.validate_interval_updates=1000", "train.log_interval=1", "train.seed=5",
        "train.extra_args=[--disable-validation, --num-workers, 2, --save-interval, 1000]"])
    args = launch.train_args(cfg, "deepnet", (2, 2), 2, False, save_dir, save_dir / "tb")
    assert args[args.index("--update-freq") + 1] == "2"
    args[args.index("--user-dir") + 1] = str(user_dir)
    return [BIN / "torchrun", "--nproc_per_node=2", "--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1",
            f"--master_port={free_port()}", "-m", "deepnet_setups.cpu_worker", *args]


def start(cmd, log_path, **env):
    log = open(log_path, "w")
    return subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, env=train_env(**env)), log


def kill_tree(pid):
    """SIGKILL a process and all its descendants at once, as a node failure would (torchrun starts its
    workers in sessions of their own, so a process group does not reach them)."""
    tree, i = [pid], 0
    while i < len(tree):
        for children in Path(f"/proc/{tree[i]}/task").glob("*/children"):
            try:
                tree += [int(child) for child in children.read_text().split()]
            except OSError:
                pass
        i += 1
    for member in reversed(tree):  # workers first: torchrun gets no chance to react
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass


def finish(proc, log, log_path):
    try:
        returncode = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
        log.close()
    return returncode, log_path.read_text()


def checkpoint_updates(path):
    return torch.load(path)["optimizer_history"][-1]["num_updates"]


def test_killed_multilingual_run_resumes_exactly(multilingual_work, kill_shim, tmp_path):
    reference, text = finish(*start(train_command(multilingual_work, tmp_path / "reference", kill_shim),
                                    tmp_path / "ref.log"), tmp_path / "ref.log")
    assert reference == 0, text[-3000:]
    want = losses(text)
    assert sorted(want) == list(range(1, MAX_UPDATE + 1)), text[-3000:]
    # 8 updates per epoch: 3 epochs, and update 16 ends epoch 2 (the resumes below land in epochs 1, 2, 3)
    assert "begin training epoch 3" in text and "begin training epoch 4" not in text

    save = tmp_path / "interrupted"
    cmd = train_command(multilingual_work, save, kill_shim)
    last = save / "checkpoint_last.pt"
    seen = {}
    # 1. update 8 ends epoch 1, where fairseq writes only checkpoint_last.pt (torch.save into a .tmp, then
    #    a rename): rank 0 is killed half-way through that write; checkpoint_last.pt stays at update 4
    code, text = finish(*start(cmd, tmp_path / "a.log", KILL_DURING="save:_last.pt"), tmp_path / "a.log")
    assert code != 0 and checkpoint_updates(last) == 4 and (save / "checkpoint_last.pt.tmp").exists(), text[-3000:]
    seen.update(losses(text))
    # 2. rerun: resumes at 4 (mid epoch 1); killed half-way through the copy of update 12's checkpoint
    #    to checkpoint_last.pt
    code, text = finish(*start(cmd, tmp_path / "b.log", KILL_DURING="copy:_12.pt"), tmp_path / "b.log")
    assert code != 0 and min(losses(text)) == 5, text[-3000:]
    seen.update(losses(text))
    # 3. rerun: checkpoint_last.pt (update 4's: the plugin's copy writes a .tmp first) is replaced by the
    #    newer update 12's (mid epoch 2, after an epoch boundary); torchrun and its workers are killed
    #    between checkpoint writes (after update 17)
    proc, log = start(cmd, tmp_path / "c.log")
    deadline = time.time() + 600
    while max(losses((tmp_path / "c.log").read_text()), default=0) < 17:
        assert proc.poll() is None and time.time() < deadline, (tmp_path / "c.log").read_text()[-3000:]
        time.sleep(0.05)
    kill_tree(proc.pid)
    code, text = finish(proc, log, tmp_path / "c.log")
    assert "is newer than" in text and min(losses(text)) == 13, text[-3000:]
    assert max(losses(text)) < 20, "the kill was meant to land between checkpoint writes"
    seen.update(losses(text))
    # 4. rerun to the end from update 16's checkpoint, written exactly at the end of epoch 2
    position = torch.load(last)["extra_state"]["train_iterator"]
    assert (position["epoch"], position["iterations_in_epoch"]) == (3, 0), position
    code, text = finish(*start(cmd, tmp_path / "d.log"), tmp_path / "d.log")
    assert code == 0 and min(losses(text)) == 17, text[-3000:]
    seen.update(losses(text))

    assert seen == want  # every update, before and after each resume, logs the uninterrupted run's loss
    got, ref = torch.load(last)["model"], torch.load(tmp_path / "reference" / "checkpoint_last.pt")["model"]
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref), "parameters differ"

    # 5. the same command once more: nothing to train, nothing written
    before = last.stat().st_mtime_ns
    code, text = finish(*start(cmd, tmp_path / "e.log"), tmp_path / "e.log")
    assert code == 0 and not losses(text) and last.stat().st_mtime_ns == before, text[-3000:]
    assert f"nothing to train: the checkpoint is at update {MAX_UPDATE}" in text
