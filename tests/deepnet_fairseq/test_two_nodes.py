"""Distributed CPU training for real, through ``scripts/train_iwslt.sh --cpu`` (gloo, one process per node):
two processes on one node (``--procs 2``), two nodes on the loopback address (two launchers, torchrun's
``--nodes 2 --node-rank R --master-addr 127.0.0.1``), and ``--launcher slurm`` under a stand-in ``srun``
that starts two tasks with SLURM's variables. The launcher derives ``--update-freq 2`` for one process
and 1 for two, so each run must log the losses of the single-process run, update by update, and end
with its parameters (the equivalence test_reliability_checkpoints.py proves with plain fairseq-train).
2L-2L DeepNet at d32, 6 updates on the IWSLT-14 setup's Multi30k data.
"""

import json
import os
import signal
import subprocess

import pytest
import torch
from conftest import SCRIPTS, free_port, run
from test_reliability_resume import losses, train_env

import deepnet_fairseq  # noqa: F401  (allow-lists fairseq's checkpoint classes)

pytestmark = pytest.mark.slow  # three two-process runs, ~75 s; make test-slow (CI) runs them

UPDATES = 6
TINY = ["model.embed_dim=32", "model.ffn_dim=64", "model.heads=2", "model.share_all_embeddings=true",
        "model.share_decoder_input_output_embed=false", "train.dropout=0.0", f"train.max_update={UPDATES}",
        "train.max_tokens=1024", "train.batch_tokens=2048", "train.log_interval=1",
        f"train.save_interval_updates={UPDATES}"]

# SLURM's srun for one machine: `srun --nodes=N --ntasks-per-node=T PROGRAM ARGS` starts N x T local tasks
# with the variables srun gives each task (fairseq's distributed_utils.infer_init_method reads them); node i
# is 127.0.0.(i+1), a loopback address. scontrol only expands the node list, here a plain comma list.
SRUN = r"""#!/usr/bin/env bash
set -u
nodes=1 per_node=1
while [[ $1 == --* ]]; do
  case $1 in --nodes=*) nodes=${1#*=} ;; --ntasks-per-node=*) per_node=${1#*=} ;; esac
  shift
done
hosts=$(seq -s, -f "127.0.0.%g" 1 "$nodes")
export SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_NNODES=$nodes SLURM_NTASKS=$((nodes * per_node)) \
  SLURM_NTASKS_PER_NODE=$per_node SLURM_NODELIST=$hosts SLURM_JOB_NODELIST=$hosts SLURM_STEP_NODELIST=$hosts
pids=()
for ((node = 0; node < nodes; node++)); do
  for ((local = 0; local < per_node; local++)); do
    SLURM_NODEID=$node SLURM_LOCALID=$local SLURM_PROCID=$((node * per_node + local)) "$@" &
    pids+=($!)
  done
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
SCONTROL = """#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] && tr , '\\n' <<< "$3"
"""


def train_cmd(work, tmp, *options):
    return ["bash", SCRIPTS / "train_iwslt.sh", "--arch", "deepnet", "--layers", "2,2", "--cpu", "--run-dir", tmp / "run",
            f"paths.work={work}", f"paths.results={tmp / 'results.jsonl'}", *TINY, *options]


def record(tmp):
    lines = (tmp / "results.jsonl").read_text().splitlines()
    assert len(lines) == 1  # from node 0 only
    row = json.loads(lines[0])
    return row["world_size"], row["update_freq"], row["updates"], row["returncode"]


@pytest.fixture(scope="module")
def reference(iwslt_work, tmp_path_factory):
    """One process, update-freq 2: {update: logged loss}, final parameters."""
    tmp = tmp_path_factory.mktemp("one_process")
    run(train_cmd(iwslt_work, tmp))
    assert record(tmp) == (1, 2, UPDATES, 0)
    return losses((tmp / "run/train.log").read_text()), tmp / "run/checkpoints/checkpoint_last.pt"


def assert_trains_as_one_process(folder, reference):
    want_losses, want_checkpoint = reference
    got = losses((folder / "train.log").read_text())
    assert sorted(got) == list(range(1, UPDATES + 1)) and got == want_losses
    got, want = (torch.load(folder / "checkpoints/checkpoint_last.pt")["model"], torch.load(want_checkpoint)["model"])
    assert got.keys() == want.keys()
    # the same batches summed in the same order: measured difference 0.0 (bitwise)
    assert max((got[k].double() - want[k].double()).abs().max().item() for k in want) <= 1e-6


def test_two_processes_on_one_node_train_as_one_process_with_update_freq_2(iwslt_work, reference, tmp_path):
    proc = run(train_cmd(iwslt_work, tmp_path, "--procs", "2", "--master-port", free_port()))
    log = (tmp_path / "run/train.log").read_text()
    assert "distributed init (rank 0)" in log and "distributed init (rank 1)" in log
    assert "torchrun" in proc.stdout and "--distributed-backend gloo" in proc.stdout
    assert record(tmp_path) == (2, 1, UPDATES, 0)
    assert_trains_as_one_process(tmp_path / "run", reference)


def test_two_nodes_on_loopback_train_as_one_process_with_update_freq_2(iwslt_work, reference, tmp_path):
    """Two launchers, one per node, sharing the run folder as on a shared file system."""
    port = free_port()
    nodes = []
    try:
        for rank in (0, 1):
            with open(tmp_path / f"node{rank}.out", "w") as out:
                cmd = train_cmd(iwslt_work, tmp_path, "--nodes", "2", "--node-rank", rank, "--master-addr", "127.0.0.1",
                                "--master-port", port)
                nodes.append(subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
                                              env=train_env(), start_new_session=True))
        codes = [node.wait(timeout=600) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    outputs = [(tmp_path / f"node{rank}.out").read_text() for rank in (0, 1)]
    assert codes == [0, 0], "\n".join(f"--- node {r} ---\n{out[-3000:]}" for r, out in enumerate(outputs))
    for rank, out in enumerate(outputs):  # both stop cleanly
        assert f"--nnodes=2 --node_rank={rank} --master_addr=127.0.0.1" in out and "[train] finished" in out
    assert "distributed init (rank 1)" in (tmp_path / "run/train.node1.log").read_text()
    assert record(tmp_path) == (2, 1, UPDATES, 0)
    assert_trains_as_one_process(tmp_path / "run", reference)


def test_two_nodes_under_slurm_train_as_one_process_with_update_freq_2(iwslt_work, reference, tmp_path):
    bin_dir = tmp_path / "slurm_bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{train_env()['PATH']}"}
    proc = run(train_cmd(iwslt_work, tmp_path, "--nodes", "2", "--launcher", "slurm", "--master-port", free_port()),
               env=env)
    assert "[train] srun --nodes=2 --ntasks-per-node=1 " in proc.stdout and "[train] finished" in proc.stdout
    log = (tmp_path / "run/train.log").read_text()
    assert "distributed init (rank 0): tcp://127.0.0.1:" in log and "distributed init (rank 1)" in log
    assert record(tmp_path) == (2, 1, UPDATES, 0)
    assert_trains_as_one_process(tmp_path / "run", reference)
