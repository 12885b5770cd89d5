"""Shared fixtures: paths, a CLI runner, and a small binarised slice of real Multi30k de-en.

``make test`` runs the suite on pytest-xdist's workers, a whole module at a time (``--dist loadfile``: its
module fixtures build once), the longest first (``pytest_collection_modifyitems``). Each worker runs the
session fixtures it needs, so the costly ones build once under a file lock (``built_once``).
"""

import fcntl
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
SHARED_DATA = ROOT.parent / "shared" / "data"
BIN = Path(sys.executable).parent  # the venv's bin: fairseq-train, fairseq-generate, ...
USER_DIR = str(ROOT / "deepnet_fairseq")

# A tiny but deep model shape that trains in seconds on one CPU thread.
TINY_MODEL = [
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]


def run(cmd, cwd=None, input=None, env=None, check=True):
    """Run a command; on failure show its output. Returns the CompletedProcess (text)."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full_env["PATH"] = f"{BIN}{os.pathsep}{full_env.get('PATH', '')}"
    if env:
        full_env.update(env)
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, input=input, env=full_env,
                          capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
                             f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
    return proc


def built_once(tmp_path_factory, name, build):
    """The folder ``name``, filled by ``build(folder)`` once per test session: the first pytest-xdist
    worker to ask builds it under a lock, the others wait for it and reuse it."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent  # the session's folder, above the workers' own
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


def free_port():
    """A TCP port free on the loopback address now (for a gloo or torchrun master)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def multi30k():
    path = SHARED_DATA / "multi30k_de_en"
    if not (path / "train.de").exists():
        pytest.fail(f"missing real test data: {path} (the project expects ../shared/data beside it)")
    return path


def binarise_multi30k_slice(multi30k, work, splits):
    """Binarise the first lines of Multi30k de-en files (joined dictionary); returns the bin folder.

    ``splits`` maps a fairseq split to (Multi30k file stem, line count), e.g. {"train": ("train", 400)}.
    """
    prefix_options = {"train": "--trainpref", "valid": "--validpref", "test": "--testpref"}
    options = []
    for split, (stem, count) in splits.items():
        for lang in ("de", "en"):
            lines = (multi30k / f"{stem}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            (work / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        options += [prefix_options[split], work / split]
    run([BIN / "fairseq-preprocess", "-s", "de", "-t", "en", *options, "--destdir", work / "bin",
         "--joined-dictionary", "--workers", "1"])
    return work / "bin"


@pytest.fixture(scope="session")
def multi30k_bin(tmp_path_factory, multi30k):
    """First 3000 training pairs (and 200 valid / 100 test) of Multi30k de-en, joined dictionary."""
    splits = {"train": ("train", 3000), "valid": ("valid", 200), "test": ("test2016", 100)}
    work = built_once(tmp_path_factory, "multi30k", lambda work: binarise_multi30k_slice(multi30k, work, splits))
    return work / "bin"


@pytest.fixture(scope="session")
def multi30k_small_bin(tmp_path_factory, multi30k):
    """First 400 training pairs (~12 updates an epoch at --max-tokens 500) and 24 valid pairs, joined dictionary:
    for the tests that train a few updates or only need a dictionary."""
    splits = {"train": ("train", 400), "valid": ("valid", 24)}
    work = built_once(tmp_path_factory, "multi30k_small", lambda work: binarise_multi30k_slice(multi30k, work, splits))
    return work / "bin"


@pytest.fixture(scope="session")
def deepnet_run(tmp_path_factory, multi30k_bin):
    """A 6L-6L d64 DeepNet trained 40 updates through the real fairseq-train CLI (shared by tests):
    (checkpoint folder, its output). Loss 13.8 bits at update 10, 9.6 at 40 (8.9 at 60)."""
    save = built_once(tmp_path_factory, "deepnet_run", lambda save: train_deepnet(multi30k_bin, save))
    return save, (save / "train.log").read_text()


def train_deepnet(multi30k_bin, save):
    proc = run([BIN / "fairseq-train", multi30k_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "1",
                "--arch", "deepnet_transformer_iwslt_de_en", "--encoder-layers", "6", "--decoder-layers", "6",
                *TINY_MODEL, "--share-all-embeddings", "--dropout", "0.1",
                "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt",
                "--warmup-updates", "20", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                "--max-tokens", "1500", "--max-update", "40", "--save-dir", save, "--no-epoch-checkpoints",
                "--log-format", "json", "--log-interval", "10", "--num-workers", "0"])
    (save / "train.log").write_text(proc.stdout + proc.stderr)


# the IWSLT-14 setup on Multi30k de-en: plain text layout, 10k training lines, 3k BPE merges
IWSLT_DATA = ["data.layout=plain", "data.test=[test2016]", "prep.max_train_lines=10000", "prep.bpe_merges=3000"]


@pytest.fixture(scope="session")
def iwslt_raw(tmp_path_factory, multi30k):
    """Multi30k de-en as the IWSLT-14 setup's raw folder (plain layout), test2016 cut to its first 300 lines."""
    def build(raw):
        for lang in ("de", "en"):
            for stem in ("train", "valid"):
                (raw / f"{stem}.{lang}").symlink_to(multi30k / f"{stem}.{lang}")
            lines = (multi30k / f"test2016.{lang}").read_text(encoding="utf-8").splitlines()[:300]
            (raw / f"test2016.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")

    return built_once(tmp_path_factory, "iwslt_raw", build)


@pytest.fixture(scope="session")
def iwslt_work(tmp_path_factory, iwslt_raw):
    """The IWSLT-14 setup's prepared and binarised text (its paths.work), made by its own scripts."""
    def build(work):
        args = [f"paths.work={work}", *IWSLT_DATA]
        run(["bash", SCRIPTS / "prepare_iwslt14.sh", "--raw-dir", iwslt_raw, "--workers", "2", *args])
        run(["bash", SCRIPTS / "binarize.sh", "--config", ROOT / "configs/iwslt14_de_en.yaml", "--workers", "2", *args])

    return built_once(tmp_path_factory, "iwslt_work", build)


# The modules that take longest, started first so that no worker starts one at the end: make test's, by their
# tests' summed durations in a quiet `make test --durations=0` (2026-12-07, 4:08 in all: deploy ~125 s,
# pipelines ~100 with the iwslt_work fixture, cli with deepnet_run ~70, crossconst ~60, faults ~60, new_schemes ~45,
# residual_drop ~35), then make test-slow's (setup_opus, setup_wmt, reliability_multilingual, two_nodes with
# iwslt_work, reliability_checkpoints, source_init). Modules that share a session fixture are apart, so that one
# worker does not wait on another's build.
LONGEST_FIRST = ("test_deploy", "test_setup_pipelines", "test_cli", "test_crossconst", "test_reliability_faults",
                 "test_new_schemes", "test_residual_drop", "test_diagnostics", "test_reliability_resume",
                 "test_compile_layers", "test_setup_config", "test_flush_denormal", "test_checkpoints",
                 "test_reliability_bad_input", "test_reliability_entry_points",
                 "test_setup_opus", "test_setup_wmt", "test_reliability_multilingual", "test_two_nodes",
                 "test_reliability_checkpoints", "test_source_init")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__, len(rank)))  # stable: the others keep their order


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes many minutes on the 2-core machine; `make test` skips it, "
                                       "`make test-all` runs it")
