"""Interrupted training resumes exactly: kill -9 between and during checkpoint writes, then rerun.

Real fairseq-train runs (2L-2L d64 DeepNet on 400 real Multi30k pairs, ~12 updates per epoch, so the
resumes land mid-epoch after an epoch boundary, where fairseq's own ``translation`` task drifts).
A test-only user dir wraps the plugin and, when asked through an environment variable, SIGKILLs
the process in the middle of a checkpoint write (half the bytes written), exactly where a real
``kill -9`` would leave a partial file.
"""

import json
import os
import signal
import subprocess
import textwrap
import time
import zipfile
from types import SimpleNamespace

import pytest
import torch

from conftest import BIN, ROOT, TINY_MODEL, USER_DIR, run

from deepnet_fairseq.training import CorruptCheckpointError, verify_checkpoint
from deepnet_fairseq.training.checkpoints import catch_up_last_checkpoint, repair_last_checkpoint
from deepnet_fairseq.training.train_loop import update_checkpoint_at_epoch_end

MAX_UPDATE = 36
SAVE_EVERY = 10

KILL_SHIM = textwrap.dedent('''
    """Test-only plugin wrapper: SIGKILL in the middle of a checkpoint write when asked to."""
    import io, os, signal
    import deepnet_fairseq  # noqa: F401  the plugin itself
    import deepnet_fairseq.training  # noqa: F401  (registers translation_exact_resume)

    _where = os.environ.get("KILL_DURING", "")  # "save:<file part>" or "copy:<file part>"
    if _where:
        _kind, _part = _where.split(":")

        def _half_then_die(data, f):
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)

        if _kind == "save":  # fairseq's atomic write: torch.save into <name>.tmp, then rename
            import torch
            _save = torch.save

            def save(obj, f, *args, **kwargs):
                if _part in getattr(f, "name", ""):
                    buf = io.BytesIO()
                    _save(obj, buf, *args, **kwargs)
                    _half_then_die(buf.getvalue(), f)
                return _save(obj, f, *args, **kwargs)

            torch.save = save
        else:  # the copy of the first checkpoint to checkpoint_last.pt (the plugin's: through a .tmp)
            from fairseq import checkpoint_utils
            _copy = checkpoint_utils.PathManager.copy

            def copy(src, dst, overwrite=False):
                if _part in src and dst.endswith("checkpoint_last.pt"):
                    with open(src, "rb") as s, open(dst + ".tmp", "wb") as d:
                        _half_then_die(s.read(), d)
                return _copy(src, dst, overwrite)

            checkpoint_utils.PathManager.copy = staticmethod(copy)
''')


@pytest.fixture(scope="module")
def kill_shim(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shim") / "reliability_shim"
    folder.mkdir()
    (folder / "__init__.py").write_text(KILL_SHIM)
    return folder


def train_cmd(data, save_dir, user_dir, task="translation_exact_resume"):
    return [BIN / "fairseq-train", data, "--user-dir", user_dir, "--task", task,
            "--arch", "deepnet_transformer", "--encoder-layers", "2", "--decoder-layers", "2", *TINY_MODEL,
            "--seed", "3", "--max-tokens", "500", "--dropout", "0.1",
            "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--cpu",
            "--max-update", str(MAX_UPDATE), "--save-interval-updates", str(SAVE_EVERY), "--save-interval", "1000",
            "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0",
            "--log-format", "json", "--log-interval", "1", "--save-dir", save_dir]


def train_env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), **extra)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def losses(log_text):
    """{update: logged loss string} from fairseq's per-update json log lines."""
    found = {}
    for line in log_text.splitlines():
        if "| train_inner |" in line:
            row = json.loads(line.split("| train_inner |", 1)[1])
            found[int(row["num_updates"])] = row["loss"]
    return found


def launch(cmd, log_path, **env):
    log = open(log_path, "w")
    return subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, env=train_env(**env)), log


def checkpoint_updates(path):
    return torch.load(path, map_location="cpu")["optimizer_history"][-1]["num_updates"]


def model_state(path):
    return torch.load(path, map_location="cpu")["model"]


@pytest.mark.slow  # ~50 s of killed and resumed runs; make test keeps the damaged-checkpoint tests
def test_kill_9_between_and_during_checkpoint_writes_resumes_exactly(multi30k_small_bin, kill_shim, tmp_path):
    # the uninterrupted reference run, alongside the interrupted ones (2 cores)
    ref_proc, ref_log = launch(train_cmd(multi30k_small_bin, tmp_path / "reference", kill_shim), tmp_path / "ref.log")

    save = tmp_path / "interrupted"
    cmd = train_cmd(multi30k_small_bin, save, kill_shim)
    last = save / "checkpoint_last.pt"
    seen = {}

    # 1. killed while fairseq writes checkpoint_2_20.pt.tmp (its atomic save): last stays at update 10
    proc, log = launch(cmd, tmp_path / "a.log", KILL_DURING="save:_20.pt")
    assert proc.wait(timeout=300) == -signal.SIGKILL
    log.close()
    assert (save / "checkpoint_2_20.pt.tmp").exists() and not (save / "checkpoint_2_20.pt").exists()
    verify_checkpoint(last)
    assert checkpoint_updates(last) == SAVE_EVERY
    seen.update(losses((tmp_path / "a.log").read_text()))

    # 2. the same command again: resumes at 10; killed half-way through the copy to checkpoint_last.pt
    #    (fairseq's copy wrote into checkpoint_last.pt itself and left it truncated; the plugin's copy
    #    writes a .tmp first, so checkpoint_last.pt is still update 10's)
    proc, log = launch(cmd, tmp_path / "b.log", KILL_DURING="copy:_20.pt")
    assert proc.wait(timeout=300) == -signal.SIGKILL
    log.close()
    text = (tmp_path / "b.log").read_text()
    assert min(losses(text)) == SAVE_EVERY + 1
    verify_checkpoint(last)
    assert checkpoint_updates(last) == SAVE_EVERY and (save / "checkpoint_last.pt.tmp").exists()
    seen.update(losses(text))

    # 3. again: the newer, complete checkpoint_2_20.pt takes checkpoint_last.pt's place, training resumes
    #    at 20; this time killed by the test between checkpoint writes (after update 24)
    proc, log = launch(cmd, tmp_path / "c.log")
    deadline = time.time() + 300
    while max(losses((tmp_path / "c.log").read_text()), default=0) < 24:
        assert proc.poll() is None and time.time() < deadline, (tmp_path / "c.log").read_text()[-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    log.close()
    text = (tmp_path / "c.log").read_text()
    assert f"{save / 'checkpoint_2_20.pt'} is newer than {last} (a save stopped while copying it there)" in text
    assert min(losses(text)) == 2 * SAVE_EVERY + 1
    assert max(losses(text)) < 3 * SAVE_EVERY, "the kill was meant to land between checkpoint writes"
    seen.update(losses(text))

    # 4. again, to the end: resumes at 20
    done = run(cmd, env={"PYTHONPATH": str(ROOT)})
    final = losses(done.stdout + done.stderr)
    assert min(final) == 2 * SAVE_EVERY + 1
    seen.update(final)

    assert ref_proc.wait(timeout=300) == 0, (tmp_path / "ref.log").read_text()[-3000:]
    ref_log.close()
    reference = losses((tmp_path / "ref.log").read_text())
    assert sorted(reference) == list(range(1, MAX_UPDATE + 1))
    # every update, before and after each resume, logs the loss of the uninterrupted run ...
    assert seen == reference
    # ... and the final parameters are bitwise identical
    got, want = model_state(last), model_state(tmp_path / "reference" / "checkpoint_last.pt")
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), "resumed run ended with different parameters"


def test_an_interval_update_that_ends_an_epoch_gets_its_update_checkpoint(multi30k_small_bin, tmp_path):
    # fairseq writes no checkpoint_<E>_<U>.pt at an epoch's last update, so with --no-epoch-checkpoints
    # "average the last K" left that update out (train_loop.update_checkpoint_at_epoch_end)
    cmd = [str(c) for c in train_cmd(multi30k_small_bin, tmp_path, USER_DIR)]
    for option, value in (("--max-update", "8"), ("--save-interval-updates", "1"), ("--max-tokens", "2000")):
        cmd[cmd.index(option) + 1] = value
    run(cmd)
    saved = {(int(p.stem.split("_")[1]), int(p.stem.split("_")[2])) for p in tmp_path.glob("checkpoint_*_*.pt")}
    assert {1, 2} <= {epoch for epoch, _ in saved}  # the run crossed an epoch's end (a few updates an epoch)
    assert sorted(update for _, update in saved) == list(range(1, 9))
    end = max(update for epoch, update in saved if epoch == 1)
    assert checkpoint_updates(tmp_path / f"checkpoint_1_{end}.pt") == end


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint_last.pt"
    torch.save({"model": {"w": torch.arange(20000, dtype=torch.float32)}, "extra": [1, 2, 3]}, path)
    return path


def test_the_epoch_end_copy_is_not_taken_for_a_stopped_save(good_checkpoint, tmp_path):
    # a resume takes a checkpoint newer than checkpoint_last.pt for a save stopped while copying it there: the
    # epoch-end copy, written after checkpoint_last.pt, must not look newer (it rewrote a finished run's file)
    last = tmp_path / "checkpoint_last.pt"
    last.write_bytes(good_checkpoint.read_bytes())
    os.utime(last, (1e9, 1e9))
    cfg = SimpleNamespace(no_save=False, no_last_checkpoints=False, save_interval_updates=5, save_dir=str(tmp_path))
    trainer = SimpleNamespace(get_num_updates=lambda: 10, checkpoint_suffix="",
                              should_save_checkpoint_on_current_rank=True)
    update_checkpoint_at_epoch_end(cfg, trainer, SimpleNamespace(epoch=2, end_of_epoch=lambda: True))
    assert (tmp_path / "checkpoint_2_10.pt").read_bytes() == last.read_bytes()
    assert catch_up_last_checkpoint(str(last)) is None


@pytest.mark.parametrize("damage", ["truncated", "empty", "flipped byte", "not a checkpoint"])
def test_damaged_checkpoint_is_detected_naming_the_file(good_checkpoint, tmp_path, damage):
    data = good_checkpoint.read_bytes()
    with zipfile.ZipFile(good_checkpoint) as archive:  # a byte inside the tensor record's data
        info = next(i for i in archive.infolist() if i.filename.endswith("data/0"))
    inside = info.header_offset + 30 + len(info.filename) + len(info.extra) + 100
    blob = {
        "truncated": data[: len(data) // 2],
        "empty": b"",
        "flipped byte": data[:inside] + bytes([data[inside] ^ 0x01]) + data[inside + 1:],
        "not a checkpoint": b"hello\n" * 100,
    }[damage]
    bad = tmp_path / "checkpoint_7_70.pt"
    bad.write_bytes(blob)
    with pytest.raises(CorruptCheckpointError, match=str(bad)):
        verify_checkpoint(bad)
    verify_checkpoint(good_checkpoint)  # the intact file passes


def test_flipped_byte_loads_silently_without_the_check(good_checkpoint, tmp_path):
    """Why verify_checkpoint reads CRCs: torch.load itself does not notice a flipped tensor byte."""
    data = bytearray(good_checkpoint.read_bytes())
    with zipfile.ZipFile(good_checkpoint) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("data/0"))
    inside = info.header_offset + 30 + len(info.filename) + len(info.extra) + 100
    data[inside] ^= 0x01
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    loaded = torch.load(bad)["model"]["w"]
    assert not torch.equal(loaded, torch.arange(20000, dtype=torch.float32))  # silently wrong values


def test_fairseq_train_refuses_a_damaged_restore_file(multi30k_small_bin, kill_shim, tmp_path, good_checkpoint):
    bad = tmp_path / "checkpoint_1_10.pt"
    bad.write_bytes(good_checkpoint.read_bytes()[:1000])
    proc = run([*train_cmd(multi30k_small_bin, tmp_path / "save", kill_shim), "--restore-file", bad], check=False,
               env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {bad}: truncated")  # one line, no traceback
    assert not (tmp_path / "save" / "checkpoint_last.pt").exists()


def test_nothing_complete_to_fall_back_to_is_an_error_naming_the_file(tmp_path):
    last = tmp_path / "checkpoint_last.pt"
    last.write_bytes(b"PK\x03\x04 partial")
    (tmp_path / "checkpoint_1_10.pt").write_bytes(b"")
    with pytest.raises(CorruptCheckpointError, match=f"{last}: truncated.*no complete checkpoint"):
        repair_last_checkpoint(str(last))
    assert last.read_bytes() == b"PK\x03\x04 partial"  # left in place for the user to inspect


def test_damaged_last_checkpoint_is_replaced_by_the_newest_complete_one(tmp_path, good_checkpoint):
    older, newer, last = (tmp_path / n for n in ("checkpoint_1_10.pt", "checkpoint_2_20.pt", "checkpoint_last.pt"))
    older.write_bytes(good_checkpoint.read_bytes())
    newer.write_bytes(good_checkpoint.read_bytes())
    os.utime(older, (1, 1))
    last.write_bytes(good_checkpoint.read_bytes()[:5000])
    assert repair_last_checkpoint(str(last)) == str(newer)
    assert last.read_bytes() == newer.read_bytes()
    assert (tmp_path / "checkpoint_last.pt.corrupt").stat().st_size == 5000
    assert repair_last_checkpoint(str(last)) is None  # intact now: nothing to do


def test_plugin_user_dir_registers_the_exact_resume_task():
    proc = run([BIN / "python", "-c", "import deepnet_fairseq; from fairseq.tasks import TASK_REGISTRY; "
                "print('translation_exact_resume' in TASK_REGISTRY)"], check=False)
    assert proc.stdout.strip() == "True", proc.stderr[-2000:]


def test_checkpoint_check_command(good_checkpoint, tmp_path, capsys):
    from deepnet_fairseq.training.checkpoints import main

    bad = tmp_path / "checkpoint_3_30.pt"
    bad.write_bytes(good_checkpoint.read_bytes()[:777])
    assert main([str(good_checkpoint)]) == 0
    assert main([str(good_checkpoint), str(bad)]) == 1
    out = capsys.readouterr()
    assert out.out.strip() == f"ok: {good_checkpoint}\nok: {good_checkpoint}".strip()
    assert out.err.strip() == f"error: {bad}: truncated or not a torch checkpoint (777 bytes; File is not a zip file)"
