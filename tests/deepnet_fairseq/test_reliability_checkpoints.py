"""Distributed training on CPU, distributed resume and checkpoint safety, with real fairseq-train runs.

One module fixture trains the plugin's ``deepnet_transformer`` (2L-2L d64, dropout 0, 400 real
Multi30k pairs) twice, at the same time: one process with ``--update-freq 2`` (and ``--eval-bleu``,
whose validation does not touch the training state), and two processes (torch.distributed, gloo,
one batch each per update). Both then resume from their checkpoints for two more updates: the
2-process resume is fairseq's distributed path, where rank 0 reads the checkpoint and broadcasts it
through ``torch.save``/``torch.load`` (weights-only). A test-only user dir records those broadcast
payloads so that their globals can be checked against the plugin's allow-list.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import BIN, ROOT, TINY_MODEL, USER_DIR, free_port, run

import deepnet_fairseq  # noqa: F401  (allow-list)
from deepnet_fairseq.training.checkpoints import allowed_global_names

pytestmark = pytest.mark.slow  # its fixture is a two-process run (~45 s); make test-slow (CI) runs the module

FIRST, SECOND = 4, 6  # updates before and after the resume


RECORD_SHIM = textwrap.dedent('''
    """Test-only plugin wrapper: keep a copy of every object fairseq broadcasts with torch.save."""
    import io, itertools, os
    import torch
    import deepnet_fairseq  # noqa: F401  the plugin itself

    _save, _count = torch.save, itertools.count()

    def save(obj, f, *args, **kwargs):
        _save(obj, f, *args, **kwargs)
        if isinstance(f, io.BytesIO) and os.environ.get("RECORD_BROADCASTS"):
            path = os.path.join(os.environ["RECORD_BROADCASTS"], f"rank{os.environ['RANK_ID']}_{next(_count)}.pt")
            with open(path, "wb") as out:
                out.write(f.getvalue())

    torch.save = save
''')


def train_args(data, save_dir, user_dir, max_update):
    return [BIN / "fairseq-train", data, "--user-dir", user_dir,
            "--arch", "deepnet_transformer", "--encoder-layers", "2", "--decoder-layers", "2", *TINY_MODEL,
            "--seed", "3", "--max-tokens", "500", "--dropout", "0",
            "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--cpu",
            "--max-update", str(max_update), "--save-interval-updates", "2", "--no-epoch-checkpoints",
            "--num-workers", "0", "--log-format", "json", "--log-interval", "1", "--save-dir", save_dir]


def start(cmd, log, **env):
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **env)
    full_env["PATH"] = f"{BIN}{os.pathsep}{full_env.get('PATH', '')}"
    return subprocess.Popen([str(c) for c in cmd], stdout=open(log, "w"), stderr=subprocess.STDOUT, env=full_env)


def wait_all(procs):
    """{log path: exit status}."""
    return {log: proc.wait(timeout=600) for proc, log in procs}


def assert_succeeded(status):
    for log, code in status.items():
        assert code == 0, f"{log} (exit {code}):\n{open(log).read()[-3000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, multi30k_small_bin):
    """{'single': dir, 'dist': dir, 'logs': dir, 'broadcasts': dir} after training, resume included."""
    work = tmp_path_factory.mktemp("ckpt_runs")
    shim = work / "record_shim"
    shim.mkdir()
    (shim / "__init__.py").write_text(RECORD_SHIM)
    broadcasts = work / "broadcasts"
    broadcasts.mkdir()
    single, dist = work / "single", work / "dist"
    eval_bleu = ["--eval-bleu", "--eval-bleu-args", '{"beam": 1, "max_len_b": 10}', "--eval-bleu-detok", "space",
                 "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]
    status = {}
    for phase, max_update in (("first", FIRST), ("resume", SECOND)):
        port = free_port()
        procs = [(start([*train_args(multi30k_small_bin, single, shim, max_update), "--update-freq", "2", *eval_bleu],
                        work / f"single_{phase}.log", RANK_ID="s"), work / f"single_{phase}.log")]
        for rank in (0, 1):
            log = work / f"dist_{phase}_{rank}.log"
            cmd = [*train_args(multi30k_small_bin, dist, shim, max_update), "--disable-validation",
                   "--distributed-world-size", "2", "--distributed-rank", str(rank), "--distributed-no-spawn",
                   "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-backend", "gloo",
                   "--ddp-backend", "legacy_ddp"]
            procs.append((start(cmd, log, RANK_ID=str(rank),
                                RECORD_BROADCASTS=str(broadcasts) if phase == "resume" else ""), log))
        status[phase] = wait_all(procs)
        if phase == "first":
            assert_succeeded(status[phase])
        for name in ("single", "dist"):  # keep the checkpoint of each phase
            shutil.copyfile(work / name / "checkpoint_last.pt", work / f"{name}_{phase}.pt")
    return {"work": work, "single": single, "dist": dist, "broadcasts": broadcasts, "status": status}


def params(path):
    return torch.load(path, map_location="cpu")["model"]


def max_difference(a, b):
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.mark.parametrize("phase,updates", [("first", FIRST), ("resume", SECOND)])
def test_two_processes_match_one_process_with_update_freq_2(runs, phase, updates):
    assert_succeeded(runs["status"][phase])
    work = runs["work"]
    single, dist = torch.load(work / f"single_{phase}.pt"), torch.load(work / f"dist_{phase}.pt")
    for state in (single, dist):
        assert state["optimizer_history"][-1]["num_updates"] == updates
    # the same batches are summed in the same order; measured difference on CPU: 0.0 (bitwise)
    assert max_difference(single["model"], dist["model"]) <= 1e-6
    if phase == "resume":  # the resumed updates did change the parameters
        assert max_difference(params(work / "single_first.pt"), single["model"]) > 1e-4


def test_distributed_resume_loads_on_rank_0_and_continues(runs):
    assert_succeeded(runs["status"]["resume"])
    log = (runs["work"] / "dist_resume_0.log").read_text()
    assert f"Loaded checkpoint {runs['dist'] / 'checkpoint_last.pt'} (epoch 1 @ {FIRST} updates)" in log
    assert '"num_updates": "5"' in log and '"num_updates": "6"' in log


def needed_globals(*paths):
    """{path: globals its pickle names beyond torch's defaults}, measured without the plugin loaded
    (in this process the plugin's allow-list hides them), then loaded here, weights-only."""
    script = ("import json, sys, torch; print(json.dumps({p: sorted(torch.serialization."
              "get_unsafe_globals_in_checkpoint(p)) for p in sys.argv[1:]}))")
    found = json.loads(run([sys.executable, "-c", script, *paths]).stdout)
    for path, names in found.items():
        missing = set(names) - allowed_global_names()
        assert not missing, f"{path} needs globals that are not allow-listed: {sorted(missing)}"
        torch.load(path, map_location="cpu")  # weights-only, with the plugin's allow-list
    return {path: set(names) for path, names in found.items()}


def test_checkpoints_and_distributed_broadcasts_need_only_allow_listed_globals(runs):
    plain, with_bleu = str(runs["dist"] / "checkpoint_1_4.pt"), str(runs["single"] / "checkpoint_best.pt")
    payloads = [str(p) for p in sorted(runs["broadcasts"].glob("rank0_*.pt"))]
    assert payloads, "the distributed resume broadcast nothing"
    found = needed_globals(plain, with_bleu, *payloads)
    assert found[plain] == {"argparse.Namespace"}
    assert "argparse.Namespace" in found[with_bleu]  # (+ numpy types when meters hold numpy values)
    broadcast = set().union(*(found[p] for p in payloads))
    assert {"omegaconf.dictconfig.DictConfig", "builtins.dict", "fairseq.distributed.utils._TensorPlaceholder"} <= broadcast


def test_averaged_checkpoint_is_the_mean_and_loads_weights_only(runs, tmp_path):
    from fairseq import checkpoint_utils

    from deepnet_fairseq.average import average_checkpoints

    paths = [runs["single"] / "checkpoint_1_2.pt", runs["single"] / "checkpoint_1_4.pt"]
    out = average_checkpoints(paths, tmp_path / "averaged.pt")
    assert set(torch.serialization.get_unsafe_globals_in_checkpoint(out)) <= allowed_global_names()
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(out)])  # weights-only, like generate
    a, b = params(paths[0]), params(paths[1])
    got = models[0].state_dict()
    key = "encoder.layers.0.fc1.weight"
    assert torch.allclose(got[key], (a[key] + b[key]) / 2, atol=1e-7) and not torch.equal(a[key], b[key])


def test_averaging_a_truncated_checkpoint_names_the_file(runs, tmp_path):
    from deepnet_fairseq.average import average_checkpoints

    bad = tmp_path / "checkpoint_1_4.pt"
    bad.write_bytes((runs["single"] / "checkpoint_1_4.pt").read_bytes()[:4096])
    with pytest.raises(Exception, match="checkpoint_1_4.pt"):
        average_checkpoints([runs["single"] / "checkpoint_1_2.pt", bad], tmp_path / "averaged.pt")
    assert not (tmp_path / "averaged.pt").exists()


def test_resuming_a_deepnet_checkpoint_as_preln_is_a_clear_error(runs, multi30k_small_bin, tmp_path):
    ckpt = runs["work"] / "dist_first.pt"
    cmd = [*train_args(multi30k_small_bin, tmp_path / "save", USER_DIR, 6), "--disable-validation"]
    cmd[cmd.index("deepnet_transformer")] = "preln_transformer"
    proc = run([*cmd, "--restore-file", ckpt], check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"Cannot load model parameters from checkpoint {ckpt}; please ensure that the architectures match" in out
    assert not (tmp_path / "save" / "checkpoint_last.pt").exists()


def test_loading_a_deepnet_checkpoint_into_post_ln_is_refused(runs):
    from fairseq import checkpoint_utils, tasks
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    state = checkpoint_utils.load_checkpoint_to_cpu(str(runs["work"] / "dist_first.pt"))
    model_cfg = state["cfg"].model
    model_cfg.arch = "transformer"
    for option in ("encoder_normalize_before", "decoder_normalize_before"):
        delattr(model_cfg, option)
    ARCH_CONFIG_REGISTRY["transformer"](model_cfg)
    model = ARCH_MODEL_REGISTRY["transformer"].build_model(model_cfg, tasks.setup_task(state["cfg"].task))
    # DeepNet keeps alpha as a persistent buffer, so the strict load that fairseq's trainer does (and
    # turns into "please ensure that the architectures match") refuses the checkpoint
    with pytest.raises(RuntimeError, match="deepnorm_alpha"):
        model.load_state_dict(state["model"], strict=True, model_cfg=model_cfg)
