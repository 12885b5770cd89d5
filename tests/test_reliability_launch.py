"""The setups' launcher: train.log follows the run line by line and survives a kill of the launcher."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from conftest import ROOT

from deepnet_fairseq.setups import launch

# a stand-in for fairseq-train: 5 per-update json lines (far below any write buffer), then a long update
FAKE_TRAIN = textwrap.dedent("""
    import json, sys, time
    for update in range(1, 6):
        print("2026-01-01 00:00:00 | INFO | train_inner | " + json.dumps({"num_updates": str(update), "loss": "5.5"}))
        sys.stdout.flush()
    time.sleep(300)
""")
RUNNER = "import sys; from deepnet_fairseq.setups import launch; launch.run(sys.argv[2:], sys.argv[1], None)"


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
    reader = launch.TrainLogStats()
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
