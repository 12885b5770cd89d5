"""Faults a cluster deals out, injected into real fairseq-train runs; every run's logged losses are
compared with an uninterrupted run's, update by update, and the final parameters bitwise:

- a preemption signal (SIGUSR1/SIGTERM): one process; two gloo processes with one rank signalled,
  then both: every rank stops at the same update, status 75, nothing lost, nothing repeated;
- a full disk while fairseq copies a checkpoint to ``checkpoint_last.pt``: one line, the previous
  ``checkpoint_last.pt`` intact, no partial file, and the rerun resumes exactly;
- ``kill -9`` of one of two gloo processes: the other names it and exits within the lost-rank timeout;
- a second trainer started on the same save dir: refused at its start, naming the first (a killed
  first one's lock is taken over); a checkpoint file that vanishes while written is not called a full disk;
- a NaN in one sublayer's output and a loss spike (``--divergence-rollback``, ``--divergence-loss-spike``):
  the update is skipped from the last good state, logged with the sublayer, and past the bound training
  stops with the guard's error;
- fp16's gradient overflowing at the minimum loss scale (``--divergence-fp16-fallback bf16``): the run
  goes on in bf16, and the same command resumes in bf16.

2L-2L DeepNet d64, dropout 0, 400 real Multi30k pairs (8 updates per epoch), json log every update.
One process runs ``--update-freq 2``, two processes one batch each: the same updates, bitwise
(docs/reliability.md), so one reference serves every run. A test-only user dir injects the faults.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import BIN, ROOT, TINY_MODEL, free_port
from test_reliability_resume import losses, train_env

from deepnet_fairseq.training import verify_checkpoint
from deepnet_fairseq.training.checkpoints import LOCK_NAME
from deepnet_fairseq.training.preemption import PREEMPTED_EXIT_STATUS
from deepnet_fairseq.training.rollback import LOSS_AVERAGE_KEY, PRECISION_KEY

MAX_UPDATE = 40
SAVE_EVERY = 6
LOST_RANK_TIMEOUT = 10  # seconds; the default is 60

FAULT_SHIM = textwrap.dedent('''
    """Test-only plugin wrapper: a full disk from a chosen update on; a fault in one module at chosen updates."""
    import builtins, errno, os
    import deepnet_fairseq  # noqa: F401  the plugin itself
    from deepnet_fairseq.criterions.diagnostic_label_smoothed_cross_entropy import _current_update as _update

    _full = os.environ.get("DISK_FULL", "")  # "<update>:<file name part>": writes to that file fail
    if _full:
        _at, _part = _full.split(":")
        _open = builtins.open

        class _FullDisk:
            """A file on a disk with 100 kB left: a write past that fails with ENOSPC."""
            def __init__(self, f):
                self._f, self._room = f, 100_000
            def write(self, data):
                if len(data) > self._room:
                    self._f.write(bytes(data)[: self._room])
                    self._room = 0
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self._room -= len(data)
                return self._f.write(data)
            def __getattr__(self, name):
                return getattr(self._f, name)
            def __enter__(self):
                return self
            def __exit__(self, *exc):
                self._f.close()

        def open(file, mode="r", *args, **kwargs):
            f = _open(file, mode, *args, **kwargs)
            if "w" in mode and _part in os.path.basename(str(file)) and _update() >= int(_at):
                return _FullDisk(f)
            return f

        builtins.open = open

    # "<kind>@<module>@<update>:<tries>,...": that update's first <tries> tries (a rollback retries it) meet
    # the fault in the module's output: nan (a NaN), spike (x30: a finite loss spike), gradinf (its gradient inf)
    _left = {}
    for _item in filter(None, os.environ.get("FAULTS", "").split(",")):
        _kind, _module, _when = _item.split("@")
        _left[(_kind, _module, int(_when.split(":")[0]))] = int(_when.split(":")[1])
    if _left:
        from fairseq.trainer import Trainer

        _train_step, _armed = Trainer.train_step, set()

        def _fault(kind, name):
            def hook(module, inputs, out):
                if (kind, name) not in _armed:
                    return out
                if kind == "gradinf":
                    out.register_hook(lambda grad: grad * float("inf"))
                    return out
                return out * (float("nan") if kind == "nan" else 30.0)
            return hook

        def train_step(self, samples, raise_oom=False):
            if not getattr(self, "_faults_hooked", False):
                for kind, name in {(k, m) for k, m, _ in _left}:
                    self.get_model().get_submodule(name).register_forward_hook(_fault(kind, name))
                self._faults_hooked = True
            update = self.get_num_updates() + 1
            _armed.clear()
            for (kind, name, at), tries in _left.items():
                if at == update and tries > 0:
                    _armed.add((kind, name))
                    _left[(kind, name, at)] = tries - 1
            return _train_step(self, samples, raise_oom)

        Trainer.train_step = train_step
''')


@pytest.fixture(scope="module")
def fault_shim(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shim") / "fault_shim"
    folder.mkdir()
    (folder / "__init__.py").write_text(FAULT_SHIM)
    return folder


def train_cmd(data, save_dir, user_dir, *extra):
    return [BIN / "fairseq-train", data, "--user-dir", user_dir, "--task", "translation_exact_resume",
            "--arch", "deepnet_transformer", "--encoder-layers", "2", "--decoder-layers", "2", *TINY_MODEL,
            "--seed", "3", "--max-tokens", "500", "--dropout", "0",
            "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
            "--criterion", "diagnostic_label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--cpu",
            "--divergence-guard", "--divergence-loss-spike", "3",  # its loss average must resume exactly too
            "--max-update", str(MAX_UPDATE), "--save-interval-updates", str(SAVE_EVERY), "--save-interval", "1000",
            "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0",
            "--log-format", "json", "--log-interval", "1", "--save-dir", save_dir, *extra]


def one_process(data, save_dir, user_dir, *extra):
    return train_cmd(data, save_dir, user_dir, "--update-freq", "2", *extra)


def two_processes(data, save_dir, user_dir, *extra):
    port = free_port()
    return [train_cmd(data, save_dir, user_dir, "--distributed-world-size", "2", "--distributed-rank", str(rank),
                      "--distributed-no-spawn", "--distributed-init-method", f"tcp://127.0.0.1:{port}",
                      "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
                      "--lost-rank-timeout", str(LOST_RANK_TIMEOUT), *extra) for rank in (0, 1)]


class Run:
    """fairseq-train processes (one per rank), each logging to <name>_<rank>.log."""

    def __init__(self, folder, name, cmds, new_session=False, **env):
        self.logs = [folder / f"{name}_{rank}.log" for rank in range(len(cmds))]
        self.procs = [subprocess.Popen([str(c) for c in cmd], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                       env=train_env(**env), start_new_session=new_session)
                      for cmd, log in zip(cmds, self.logs)]

    def text(self, rank=0):
        return self.logs[rank].read_text()

    def wait_for_update(self, update):
        deadline = time.time() + 300
        while max(losses(self.text()), default=0) < update:
            assert all(p.poll() is None for p in self.procs) and time.time() < deadline, self.text()[-3000:]
            time.sleep(0.02)

    def wait(self):
        try:
            return [p.wait(timeout=300) for p in self.procs]
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()


@pytest.fixture(scope="module")
def reference(multi30k_small_bin, tmp_path_factory, fault_shim):
    """The uninterrupted run: {update: logged loss}, {update: logged lr}, final checkpoint."""
    folder = tmp_path_factory.mktemp("reference")
    run = Run(folder, "ref", [one_process(multi30k_small_bin, folder / "save", fault_shim)])
    assert run.wait() == [0], run.text()[-3000:]
    text = run.text()
    assert sorted(losses(text)) == list(range(1, MAX_UPDATE + 1))
    return losses(text), logged(text, "lr"), folder / "save" / "checkpoint_last.pt"


def logged(text, key):
    import json

    return {int(row["num_updates"]): row[key] for row in
            (json.loads(line.split("| train_inner |", 1)[1]) for line in text.splitlines() if "| train_inner |" in line)}


def assert_as_uninterrupted(text, reference, first, last=None):
    """The run logged updates first..last (last: wherever it stopped), each with the reference's loss."""
    got = losses(text)
    assert min(got) == first and (last is None or max(got) == last), sorted(got)
    assert {u: reference[0][u] for u in got} == got
    return max(got)


def assert_same_parameters(path, reference):
    got, want = torch.load(path), torch.load(reference[2])
    assert got["model"].keys() == want["model"].keys() and all(torch.equal(got["model"][k], want["model"][k])
                                                               for k in want["model"])
    average = [c["last_optimizer_state"]["param_groups"][0][LOSS_AVERAGE_KEY] for c in (got, want)]
    assert average[0] == average[1] and 1 < average[0] < 20, average  # --divergence-loss-spike's reference


def updates_in(path):
    return torch.load(path)["optimizer_history"][-1]["num_updates"]


def preempted_line(text):
    lines = [line for line in text.splitlines() if f"exiting with status {PREEMPTED_EXIT_STATUS}" in line]
    assert len(lines) == 1, text[-3000:]
    return lines[0]


@pytest.mark.slow  # ~40 s of interrupted runs; make test keeps the rollback, lock and write-failure tests
def test_one_process_preempted_then_disk_full_loses_nothing(multi30k_small_bin, fault_shim, reference, tmp_path):
    save = tmp_path / "save"
    last = save / "checkpoint_last.pt"

    # 1. SIGUSR1 mid-interval: the update in progress ends, checkpoint_last.pt is saved, status 75
    run = Run(tmp_path, "signal", [one_process(multi30k_small_bin, save, fault_shim)])
    run.wait_for_update(3)
    signalled = time.time()
    run.procs[0].send_signal(signal.SIGUSR1)
    assert run.wait() == [PREEMPTED_EXIT_STATUS], run.text()[-3000:]
    print(f"one process: SIGUSR1 to exit {time.time() - signalled:.1f} s")  # docs/reliability.md (pytest -s)
    stopped = assert_as_uninterrupted(run.text(), reference, 1)
    assert f"SIGUSR1 received: all 1 ranks stop after update {stopped}" in preempted_line(run.text())
    assert updates_in(last) == stopped

    # 2. resumes at stopped + 1; the disk fills while fairseq copies the next interval checkpoint to
    #    checkpoint_last.pt: one line naming it, the previous checkpoint_last.pt intact, no partial file
    interval = (stopped // SAVE_EVERY + 1) * SAVE_EVERY
    full = Run(tmp_path, "full", [one_process(multi30k_small_bin, save, fault_shim)],
               DISK_FULL=f"{interval}:checkpoint_last")
    assert full.wait() == [1]
    errors = [line for line in full.text().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in full.text(), full.text()[-3000:]
    assert (f"error: could not write checkpoint {last} ([Errno 28] No space left on device); a checkpoint needs "
            in errors[0] and f"{last} is unchanged; free space and rerun to resume" in errors[0])
    assert_as_uninterrupted(full.text(), reference, stopped + 1, interval)
    verify_checkpoint(last)
    assert updates_in(last) == stopped
    for path in save.iterdir():  # every file under a checkpoint name is complete; no .tmp is left (nor the lock)
        assert path.suffix == ".pt", path
        verify_checkpoint(path)

    # 3. space freed: the same command resumes from the complete file whose copy failed (newer than
    #    checkpoint_last.pt) and trains to the end, as the reference
    copied = list(save.glob(f"checkpoint_*_{interval}.pt"))  # none if the save was at an epoch's end
    done = Run(tmp_path, "done", [one_process(multi30k_small_bin, save, fault_shim)])
    assert done.wait() == [0], done.text()[-3000:]
    assert_as_uninterrupted(done.text(), reference, (interval if copied else stopped) + 1, MAX_UPDATE)
    assert not copied or f"{copied[0]} is newer than {last}" in done.text()
    assert_same_parameters(last, reference)


@pytest.mark.slow  # ~20 s of two interrupted runs
def test_a_run_resumed_mid_epoch_saves_on_a_process_group_signal(multi30k_small_bin, fault_shim, reference, tmp_path):
    # A resume mid-epoch without a data buffer forks the DataLoader worker inside fairseq's load_checkpoint: it
    # must already leave the signal to the trainer (`kill -TERM -- -PGID` of a lane, or SLURM's, signals both).
    save = tmp_path / "save"
    run = Run(tmp_path, "first", [one_process(multi30k_small_bin, save, fault_shim)])
    run.wait_for_update(3)
    run.procs[0].send_signal(signal.SIGUSR1)
    assert run.wait() == [PREEMPTED_EXIT_STATUS], run.text()[-3000:]
    first = assert_as_uninterrupted(run.text(), reference, 1)
    assert first % 8, "the first run must stop mid-epoch (8 updates an epoch)"

    # no buffer, as fairseq's multilingual task builds its iterator: the resume then starts the worker
    unbuffered = ("--num-workers", "1", "--data-buffer-size", "0")
    run = Run(tmp_path, "group", [one_process(multi30k_small_bin, save, fault_shim, *unbuffered)], new_session=True)
    run.wait_for_update(first + 2)
    os.killpg(run.procs[0].pid, signal.SIGTERM)  # the trainer and its worker
    assert run.wait() == [PREEMPTED_EXIT_STATUS], run.text()[-3000:]
    second = assert_as_uninterrupted(run.text(), reference, first + 1)
    assert f"SIGTERM received: all 1 ranks stop after update {second}" in preempted_line(run.text())
    assert updates_in(save / "checkpoint_last.pt") == second


def test_the_signal_handler_is_installed_before_the_checkpoint_loads(tmp_path):
    # the unit-level half of the test above, for make test: fairseq's load_checkpoint may fork DataLoader workers
    from types import SimpleNamespace

    from deepnet_fairseq.training import preemption, train_loop

    class Loaded(Exception):
        pass

    handlers = []

    def load_checkpoint(cfg, trainer):
        handlers.append(signal.getsignal(signal.SIGTERM))
        raise Loaded

    trainer = SimpleNamespace(cfg=SimpleNamespace(task=None, criterion=None), criterion=None, data_parallel_rank=0)
    cfg = SimpleNamespace(no_save=True, save_dir=str(tmp_path), checkpoint_suffix="", restore_file="checkpoint_last.pt")
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        with pytest.raises(Loaded):
            train_loop.start_of_training(load_checkpoint)(cfg, trainer)
    finally:  # this pytest process keeps its own handlers, and children it forks later their signals
        preemption.request.signals = []
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert handlers == [preemption.request._handle]


@pytest.mark.slow  # six two-process runs (~100 s); the one-process faults above stay in make test
def test_two_processes_preempted_or_a_rank_killed_lose_nothing(multi30k_small_bin, fault_shim, reference, tmp_path):
    save = tmp_path / "save"
    last = save / "checkpoint_last.pt"

    # 1. SIGUSR1 to rank 1 only: both ranks agree at the end of the update, rank 0 saves, both exit 75
    run = Run(tmp_path, "rank1", two_processes(multi30k_small_bin, save, fault_shim))
    run.wait_for_update(3)
    signalled = time.time()
    run.procs[1].send_signal(signal.SIGUSR1)
    assert run.wait() == [PREEMPTED_EXIT_STATUS] * 2, run.text()[-3000:]
    print(f"two processes, rank 1 signalled: signal to both exited {time.time() - signalled:.1f} s")
    first = assert_as_uninterrupted(run.text(), reference, 1)
    assert f"a signal reached another rank: all 2 ranks stop after update {first}" in preempted_line(run.text())
    assert updates_in(last) == first

    # 2. SIGTERM to both (as SLURM sends it), a few updates after the resume
    run = Run(tmp_path, "both", two_processes(multi30k_small_bin, save, fault_shim))
    run.wait_for_update(first + 3)
    for proc in run.procs:
        proc.send_signal(signal.SIGTERM)
    assert run.wait() == [PREEMPTED_EXIT_STATUS] * 2, run.text()[-3000:]
    second = assert_as_uninterrupted(run.text(), reference, first + 1)
    # Rank 0 names the signal if its own handler ran before it read the flag for the ranks' agreement; when the
    # SIGTERM lands while rank 0 waits in that all-reduce (rank 1 already flagged), its handler runs only after,
    # and rank 0 reports the other rank's signal. Either way both ranks caught SIGTERM (status 75, not -15).
    line = preempted_line(run.text())
    assert any(f"{what}: all 2 ranks stop after update {second}" in line
               for what in ("SIGTERM received", "a signal reached another rank")), line
    assert updates_in(last) == second

    # 3. kill -9 of rank 1 after the next interval save: rank 0 names it within the lost-rank timeout
    run = Run(tmp_path, "killed", two_processes(multi30k_small_bin, save, fault_shim))
    saved = (second // SAVE_EVERY + 1) * SAVE_EVERY
    run.wait_for_update(saved + 1)
    killed_at = time.time()
    run.procs[1].send_signal(signal.SIGKILL)
    assert run.procs[0].wait(timeout=LOST_RANK_TIMEOUT + 30) == 1
    detected = time.time() - killed_at
    assert run.wait() == [1, -signal.SIGKILL]
    errors = [line for line in run.text().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in run.text(), run.text()[-3000:]
    assert errors[0].startswith("error: lost rank 1: no heartbeat for ") and errors[0].endswith(
        f" s (--lost-rank-timeout {LOST_RANK_TIMEOUT}); rank 0 stops; rerun the command to resume from checkpoint_last.pt")
    assert LOST_RANK_TIMEOUT - 2 < detected < LOST_RANK_TIMEOUT + 20, detected  # peers poll every timeout/6
    print(f"kill -9 of rank 1 to rank 0's exit: {detected:.1f} s (--lost-rank-timeout {LOST_RANK_TIMEOUT})")
    assert_as_uninterrupted(run.text(), reference, second + 1)
    assert updates_in(last) == saved

    # 4. the same command again: resumes after the last save and trains to the end, as the reference
    run = Run(tmp_path, "done", two_processes(multi30k_small_bin, save, fault_shim))
    assert run.wait() == [0, 0], run.text()[-3000:]
    assert_as_uninterrupted(run.text(), reference, saved + 1, MAX_UPDATE)
    assert_same_parameters(last, reference)


def test_rollback_skips_a_nan_update_and_a_loss_spike_and_stops_past_the_bound(multi30k_small_bin, fault_shim,
                                                                                reference, tmp_path):
    """A NaN in encoder layer 1's FFN output at update 5 (once), and the logits x30 at update 9 (a finite loss
    spike, three tries in a row), with two rollbacks allowed, each halving the learning rate."""
    save = tmp_path / "save"
    run = Run(tmp_path, "nan", [one_process(multi30k_small_bin, save, fault_shim, "--divergence-rollback", "2",
                                            "--divergence-rollback-lr-factor", "0.5")],
              FAULTS="nan@encoder.layers.1.fc2@5:1,spike@decoder.output_projection@9:3")
    assert run.wait() == [1]
    text = run.text()
    rollbacks = [line.split(" | ")[-1] for line in text.splitlines() if "divergence rollback" in line]
    nan = "loss nan per token (non-finite); first non-finite output in sublayer enc1_ffn"
    spike = (r"loss ([\d.e+]+) per token > 3 x its running average ([\d.e+]+) \(--divergence-loss-spike\); "
             r"largest gradient in sublayer \w+ \([\d.e+]+\)")
    assert len(rollbacks) == 2, text[-3000:]
    assert rollbacks[0] == (f"divergence rollback 1/2: update 5: {nan}; model and optimizer stay at update 4, "
                            "batch skipped, learning rate x0.5 from now on")
    found = re.fullmatch(f"divergence rollback 2/2: update 9: {spike}; model and optimizer stay at update 8, "
                         r"batch skipped, learning rate x0.25 from now on", rollbacks[1])
    assert found and float(found[1]) > 3 * float(found[2]), rollbacks[1]
    assert re.fullmatch(r"deepnet_fairseq\.instrumentation\.monitors\.DivergenceError: training diverged at update 9: "
                        f"{spike}; rolled back 2 times already \\(--divergence-rollback\\). "
                        r"The last saved checkpoint is untouched\.", text.strip().splitlines()[-1]), text[-1000:]
    # updates 1-4 as the uninterrupted run; 5-8 trained on the next batches at half the learning rate
    got, lr = losses(text), logged(text, "lr")
    assert sorted(got) == list(range(1, 9))
    assert {u: got[u] for u in range(1, 5)} == {u: reference[0][u] for u in range(1, 5)}
    assert all(got[u] != reference[0][u] for u in range(5, 9))  # other batches, other weights
    assert [float(lr[u]) / float(reference[1][u]) for u in range(1, 9)] == [1.0] * 4 + [0.5] * 4
    verify_checkpoint(save / "checkpoint_last.pt")
    assert updates_in(save / "checkpoint_last.pt") == SAVE_EVERY
    assert not (save / "crash.pt").exists()  # fairseq's NaN path (crash.pt, NaN detector re-run) not taken


@pytest.mark.slow  # ~45 s of two fp16 runs on CPU (fallback, then resume); make test keeps the other faults
def test_fp16_at_the_minimum_loss_scale_falls_back_to_bf16_and_resumes_in_bf16(multi30k_small_bin, fault_shim,
                                                                              reference, tmp_path):
    """fp16 on CPU (fairseq needs --fp16-no-flatten-grads there, and a first overflow that is already at the
    minimum scale: its non-fatal overflow path calls .cuda()): an infinite gradient in decoder layer 0's FFN
    at update 5. With --divergence-fp16-fallback bf16 the run goes on in bf16; the same command resumes in bf16."""
    fp16 = ["--fp16", "--fp16-no-flatten-grads", "--fp16-init-scale", "1", "--min-loss-scale", "1",
            "--divergence-fp16-fallback", "bf16"]
    save = tmp_path / "save"
    run = Run(tmp_path, "fallback", [one_process(multi30k_small_bin, save, fault_shim, *fp16, "--max-update", "12")],
              FAULTS="gradinf@decoder.layers.0.fc2@5:1")
    assert run.wait() == [0], run.text()[-3000:]
    text = run.text()
    line = [line.split(" | ")[-1] for line in text.splitlines() if "fp16 fall-back" in line]
    assert line == ["fp16 fall-back: update 5: the fp16 gradient still overflows at the minimum loss scale "
                    "(--min-loss-scale 1), non-finite gradient in 7 of 10 sublayers, starting at sublayer dec0_ffn; "
                    "model and optimizer stay at update 4, batch skipped; training goes on in bf16 "
                    "(--divergence-fp16-fallback)"], text[-3000:]
    got, scale = losses(text), logged(text, "loss_scale")
    assert sorted(got) == list(range(1, 13))
    # against the uninterrupted fp32 run: fp16 on the same batches, then bf16 on the next batches (one behind)
    assert all(abs(float(got[u]) - float(reference[0][u])) <= 0.005 * float(reference[0][u]) for u in range(1, 5))
    assert all(abs(float(got[u]) - float(reference[0][u])) < 0.03 * float(reference[0][u]) for u in range(5, 13))
    assert [scale[u] for u in (4, 5, 12)] == ["1", None, None]  # no loss scale after the fall-back
    assert torch.load(save / "checkpoint_last.pt")["last_optimizer_state"]["param_groups"][0][PRECISION_KEY] == "bf16"

    resumed = Run(tmp_path, "resumed", [one_process(multi30k_small_bin, save, fault_shim, *fp16, "--max-update", "14")])
    assert resumed.wait() == [0], resumed.text()[-3000:]
    assert ("fp16 fall-back: this run went on in bf16 before it was saved; so does the resumed run "
            "(--divergence-fp16-fallback)") in resumed.text()
    assert sorted(losses(resumed.text())) == [13, 14] and logged(resumed.text(), "loss_scale")[14] is None


@pytest.mark.parametrize("step", ["write", "copy"])
def test_a_failed_checkpoint_write_keeps_the_previous_file_and_leaves_no_partial_one(tmp_path, monkeypatch, step):
    """fairseq's two ways of writing a checkpoint: torch.save of the first file (through a .tmp), then a copy
    to the others (checkpoint_last.pt), both as the plugin installs them into fairseq's checkpoint_utils."""
    import errno

    from fairseq import checkpoint_utils

    from deepnet_fairseq.training import checkpoints
    from deepnet_fairseq.training.checkpoints import CheckpointWriteError

    last = tmp_path / "checkpoint_last.pt"
    torch.save({"model": {"w": torch.zeros(1000)}}, last)
    before = last.read_bytes()

    def half_then_full(data, handle):
        handle.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if step == "write":
        monkeypatch.setattr(torch, "save", lambda obj, handle: half_then_full(obj, handle))
        action = lambda: checkpoint_utils.torch_persistent_save({"model": {"w": torch.ones(1000)}}, str(last))  # noqa: E731
    else:
        source = tmp_path / "checkpoint_2_20.pt"
        torch.save({"model": {"w": torch.ones(1000)}}, source)
        monkeypatch.setattr(checkpoints.shutil, "copyfileobj", lambda src, dst, length: half_then_full(src, dst))
        action = lambda: checkpoint_utils.PathManager.copy(str(source), str(last), overwrite=True)  # noqa: E731
    with pytest.raises(CheckpointWriteError) as raised:
        action()
    assert str(raised.value).startswith(f"could not write checkpoint {last} ([Errno 28] No space left on device); "
                                        "a checkpoint needs 0.0 MiB, ") and "MiB free there; " in str(raised.value)
    assert str(raised.value).endswith(f"{last} is unchanged; free space and rerun to resume")
    assert last.read_bytes() == before and not list(tmp_path.glob("*.tmp"))


def test_a_save_interrupted_by_an_error_without_an_oserror_is_not_blamed_on_the_disk(tmp_path):
    from deepnet_fairseq.training.checkpoints import write_failed

    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    err = RuntimeError("DataLoader worker (pid 7) is killed by signal: Terminated. ")  # torch's SIGCHLD handler
    assert str(write_failed(str(tmp_path / "checkpoint_1_6.pt"), err, 0)) == (
        f"could not write checkpoint {tmp_path}/checkpoint_1_6.pt (RuntimeError: DataLoader worker (pid 7) is killed "
        f"by signal: Terminated. ); {tmp_path}/checkpoint_last.pt is unchanged; the error is not the disk's; "
        "rerun to resume")


def test_a_checkpoint_file_that_vanishes_while_written_is_not_blamed_on_the_disk(tmp_path, monkeypatch):
    """Another process in the same folder renames our .tmp away (ENOENT): the advice names that, not free space."""
    from fairseq import checkpoint_utils

    from deepnet_fairseq.training.checkpoints import CheckpointWriteError

    replace = os.replace

    def renamed_by_another_trainer(src, dst):
        os.remove(src)
        replace(src, dst)

    monkeypatch.setattr(os, "replace", renamed_by_another_trainer)
    last = tmp_path / "checkpoint_last.pt"
    with pytest.raises(CheckpointWriteError) as raised:
        checkpoint_utils.torch_persistent_save({"model": {"w": torch.ones(10)}}, str(last))
    assert str(raised.value) == (
        f"could not write checkpoint {last} ([Errno 2] No such file or directory); a file vanished while it was "
        f"written: another process is writing to {tmp_path} or deleted it (one trainer per --save-dir); "
        "stop it and rerun to resume")


def test_a_trainer_lock_left_by_a_killed_trainer_is_taken_over(tmp_path, caplog):
    import socket

    from deepnet_fairseq.training.checkpoints import SaveDirLock, hold_save_dir

    child = os.fork()
    if child == 0:  # a trainer that holds the folder and is killed (kill -9: no clean release)
        SaveDirLock(str(tmp_path))
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(child, 0)
    holder = (tmp_path / LOCK_NAME).read_text()
    assert holder.startswith(f"pid {child} on {socket.gethostname()} since ")
    with caplog.at_level("WARNING"):
        lock = hold_save_dir(str(tmp_path))
    assert [r.getMessage() for r in caplog.records] == [
        f"taking over {tmp_path / LOCK_NAME} from {holder.strip()}, which ended without releasing it"]
    assert (tmp_path / LOCK_NAME).read_text().startswith(f"pid {os.getpid()} on ")
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()  # a normal exit leaves nothing to take over


def test_a_second_trainer_on_one_save_dir_is_refused_naming_the_holder(multi30k_small_bin, tmp_path):
    """A job launched twice (or requeued while the old process still runs): the second stops at its start."""
    import socket

    from conftest import USER_DIR

    from deepnet_fairseq.training.checkpoints import SaveDirInUse, SaveDirLock, hold_save_dir

    save = tmp_path / "save"
    save.mkdir()
    lock = hold_save_dir(str(save))  # this process is the first trainer
    try:
        holder = (save / LOCK_NAME).read_text().strip()
        assert re.fullmatch(rf"pid {os.getpid()} on {re.escape(socket.gethostname())} since [\d-]+ [\d:]+", holder)
        with pytest.raises(SaveDirInUse):
            SaveDirLock(str(save))
        proc = subprocess.run([str(c) for c in one_process(multi30k_small_bin, save, USER_DIR)], env=train_env(),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr and [line for line in proc.stderr.splitlines() if "error" in line] == [
            f"error: {save} is in use by another trainer: {holder} ({save / LOCK_NAME}); wait for it to end, "
            "or stop it, or pass another --save-dir"], proc.stderr[-3000:]
        assert sorted(p.name for p in save.iterdir()) == [LOCK_NAME]  # nothing written
        assert (save / LOCK_NAME).read_text().strip() == holder
    finally:
        lock.release()


def test_a_run_that_saves_nothing_takes_no_lock(multi30k_small_bin, tmp_path):
    """--no-save writes no checkpoint, so quick probes side by side in one folder never refuse each other."""
    from conftest import USER_DIR

    from deepnet_fairseq.training.checkpoints import hold_save_dir

    save = tmp_path / "save"
    save.mkdir()
    lock = hold_save_dir(str(save))  # another trainer holds the folder
    try:
        holder = (save / LOCK_NAME).read_text()
        proc = subprocess.run([str(c) for c in one_process(multi30k_small_bin, save, USER_DIR, "--no-save",
                                                              "--max-update", "2")],
                              env=train_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "in use by another trainer" not in proc.stderr
        assert (save / LOCK_NAME).read_text() == holder  # the holder's lock untouched
    finally:
        lock.release()


def test_save_on_signals_names_catchable_signals_or_none():
    from deepnet_fairseq.training.preemption import parse_signals

    assert parse_signals("SIGUSR1,SIGTERM") == [signal.SIGUSR1, signal.SIGTERM]
    assert parse_signals(" usr2 ") == [signal.SIGUSR2]
    assert parse_signals("none") == [] == parse_signals("")
    with pytest.raises(ValueError, match="'SIGKILL' is not a signal that can be caught"):
        parse_signals("SIGTERM,KILL")


@pytest.mark.parametrize("options, message", [
    ({"divergence_loss_spike": 3.0}, "need --divergence-guard"),
    ({"divergence_fp16_fallback": "bf16"}, "need --divergence-guard"),
    ({"divergence_guard": True, "divergence_loss_spike": 0.9}, "--divergence-loss-spike must be > 1 (0 = off)"),
    ({"divergence_guard": True, "divergence_loss_spike": -1.0}, "--divergence-loss-spike must be >= 0"),
])
def test_divergence_options_are_checked(options, message):
    from types import SimpleNamespace

    from deepnet_fairseq.criterions.diagnostic_label_smoothed_cross_entropy import (
        DiagnosticLabelSmoothedCrossEntropyCriterion as Criterion,
    )

    with pytest.raises(ValueError, match=re.escape(message)):
        Criterion(SimpleNamespace(target_dictionary=None), False, 0.1, **options)
    Criterion(SimpleNamespace(target_dictionary=None), False, 0.1, **dict(options, divergence_guard=True,
                                                                          divergence_loss_spike=3.0))


SIGNAL_EVERY_PROCESS = """
import os, signal, subprocess, torch
from deepnet_fairseq.training import preemption

preemption.request.install([signal.SIGTERM])
batches = iter(torch.utils.data.DataLoader(range(40), num_workers=1))
first = next(batches)
subprocess.run(["kill", "-TERM", "--", f"-{os.getpgrp()}"])  # as SLURM's preemption: this process and its worker
rest = list(batches)
print(preemption.request.received, 1 + len(rest))
left_open = iter(torch.utils.data.DataLoader(range(40), num_workers=1))
next(left_open)  # a worker still running at exit: multiprocessing ends it (a SIGTERM from its parent)
"""


def test_a_signal_to_every_process_leaves_the_data_loader_to_the_trainer():
    # without the plugin's handling torch's worker dies of the signal and the loop raises (exit status 1)
    proc = subprocess.run([sys.executable, "-c", SIGNAL_EVERY_PROCESS], cwd=ROOT, start_new_session=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, "SIGTERM 40\n"), proc.stderr[-3000:]
