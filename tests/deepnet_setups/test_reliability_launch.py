"""The setups' launcher: train.log follows the run line by line and survives a kill of the launcher."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from conftest import ROOT

from deepnet_setups import records, runner

# a stand-in for fairseq-train: 5 per-update json lines (far below any write buffer), then a long update
FAKE_TRAIN = textwrap.dedent("""
    import json, sys, time
    for update in range(1, 6):
        print("2026-01-01 00:00:00 | INFO | train_inner | " + json.dumps({"num_updates": str(update), "loss": "5.5"}))
        sys.stdout.flush()
    time.sleep(300)
""")
RUNNER = "import sys; from deepnet_setups import runner; runner.run(sys.argv[2:], sys.argv[1], None)"


def logged_updates(path):
    return [json.loads(line.split("| train_inner | ")[1])["num_updates"] for line in path.read_text().splitlines()]


def test_train_log_is_written_as_the_run_goes_and_survives_a_kill_9_of_the_launcher(tmp_path):
    log = tmp_path / "train.log"
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, log, sys.executable, "-c", FAKE_TRAIN],
                              stdout=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                              start_new_session=True)  # its own process group, to end the fake run afterwards
    try:
        deadline = time.time() + 60
        while not log.exists() or len(logged_updates(log)) < 5:
            assert runner.poll() is None and time.time() < deadline, "train.log stayed behind the run"
            time.sleep(0.02)
        runner.send_signal(signal.SIGKILL)  # the launcher only
        runner.wait(timeout=60)
        assert logged_updates(log) == ["1", "2", "3", "4", "5"] and log.read_text().endswith("\n")
    finally:
        os.killpg(runner.pid, signal.SIGKILL)  # the orphaned fake run


def test_run_record_is_read_line_by_line():
    reader = runner.TrainLogStats()
    lines = ['x | INFO | train_inner | {"num_updates": "10", "loss": "7.25"}\n',
             'x | INFO | valid | {"valid_loss": "6.5", "valid_num_updates": "10"}\n',
             "x | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0\n",
             'x | INFO | train | {"train_loss": "7.0", "train_num_updates": "12"}\n']
    for line in lines:
        reader.feed(line)
    assert reader.stats == {"final_loss": 7.0, "valid_loss": 6.5, "updates": 12}
    assert not reader.diverged(0) and not reader.diverged(1)
    reader.feed("FloatingPointError: Minimum loss scale reached (0.0001).\n")
    assert reader.diverged(1) and not reader.diverged(0)
    reader.feed('x | INFO | train_inner | {"num_updates": "13", "loss": "inf"}\n')
    assert reader.diverged(0)


def test_a_preempted_record_states_the_update_its_checkpoint_was_saved_at():
    # stopped at 323 with the log at every 100: the record said 300 while its run block (the checkpoint's) said 323
    assert records.recorded_updates(300, 323, preempted=True) == 323
    assert records.recorded_updates(1500, 1500, preempted=False) == 1500
    assert records.recorded_updates(None, 1500, preempted=False) == 1500  # rerun with nothing left to train
    assert records.recorded_updates(3, None, preempted=True) == 3  # no checkpoint: the log is all there is


# SLURM stand-ins: srun's tasks behave as fairseq-train with the plugin on SIGUSR1 (log the preemption line,
# exit 75; srun passes signals on to its tasks and returns their highest status); scontrol records its call
PREEMPTED_SRUN = textwrap.dedent("""\
    #!/usr/bin/env bash
    trap 'echo "x | WARNING | deepnet_fairseq.training.train_loop | SIGUSR1 received: all 2 ranks stop after update 3, \\
    saved in run/checkpoints/checkpoint_last.pt; exiting with status 75 (rerun the same command to resume)"; exit 75' USR1
    echo 'x | INFO | train_inner | {"num_updates": "3", "loss": "5.5"}'
    while true; do sleep 0.05; done
""")
RECORDING_SCONTROL = '#!/usr/bin/env bash\necho "$@" >> "$(dirname "$0")/scontrol.calls"\n'


def test_launcher_passes_a_signal_on_and_requeues_the_slurm_job_when_training_exits_75(tmp_path):
    from deepnet_fairseq.training.preemption import PREEMPTED_EXIT_STATUS

    assert runner.PREEMPTED_EXIT_STATUS == PREEMPTED_EXIT_STATUS == 75
    bin_dir, work = tmp_path / "slurm_bin", tmp_path / "work"
    bin_dir.mkdir()
    (work / "bin").mkdir(parents=True)
    (work / "bin" / ".done").touch()
    for name, text in (("srun", PREEMPTED_SRUN), ("scontrol", RECORDING_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), SLURM_JOB_ID="4242", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "deepnet_setups.launch", ROOT / "configs/iwslt14_de_en.yaml", "--arch", "deepnet",
         "--layers", "2,2", "--cpu", "--nodes", "2", "--launcher", "slurm", "--run-dir", run_dir,
         f"paths.work={work}", f"paths.results={tmp_path / 'results.jsonl'}", "train.max_tokens=1024"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.time() + 60
        while not (run_dir / "train.log").exists() or "train_inner" not in (run_dir / "train.log").read_text():
            assert launcher.poll() is None and time.time() < deadline, launcher.stdout.read()
            time.sleep(0.02)
        launcher.send_signal(signal.SIGUSR1)  # as SLURM's `#SBATCH --signal=B:USR1@120` does
        out, _ = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 75, out
    assert "[train] preempted after update 3: checkpoint_last.pt saved; SLURM job 4242 requeued" in out
    assert (bin_dir / "scontrol.calls").read_text() == "requeue 4242\n"
    record = json.loads((tmp_path / "results.jsonl").read_text())
    assert (record["returncode"], record["preempted"], record["diverged"], record["updates"]) == (75, True, False, 3)
    assert not (run_dir / "train.done").exists()
