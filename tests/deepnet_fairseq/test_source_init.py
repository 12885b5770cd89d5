"""``--deepnorm-init source``: the decoder uses its source sooner than with the paper's init, and the model
exports exactly (to fairseq's transformer and to CTranslate2). Its weights are checked in test_models.py;
the study behind it is in docs/diagnostics.md ("DeepNet without the plateau")."""

import json
import os
import subprocess

import pytest

from conftest import BIN, ROOT, TINY_MODEL, USER_DIR, run
from deepnet_experiments.synthetic import write_reverse_map_task

# two 18L-18L models trained (~65 s): make test-slow (CI); make test keeps the constants and gains (test_models.py)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """4L-4L DeepNet, paper init and source init, 50 updates on the package's reverse-and-map task (the target
    is unpredictable without the source), src_dep probed every 10 updates (measured at the last probe, update
    41: source init 0.84 bits, paper init 0.29). Returns the work folder (raw/, bin/,
    source/checkpoint_last.pt) and {init: {update: src_dep}}."""
    work = tmp_path_factory.mktemp("source_init")
    write_reverse_map_task(work / "raw", train=2000, valid=100, test=120)
    run([BIN / "fairseq-preprocess", "-s", "src", "-t", "tgt", "--trainpref", work / "raw" / "train",
         "--validpref", work / "raw" / "valid", "--testpref", work / "raw" / "test", "--destdir", work / "bin",
         "--workers", "1"])
    procs = {}
    for init in ("paper", "source"):
        cmd = [BIN / "fairseq-train", work / "bin", "--user-dir", USER_DIR, "--cpu", "--seed", "1",
               "--arch", "deepnet_transformer", "--deepnorm-init", init, "--encoder-layers", "4",
               "--decoder-layers", "4", *TINY_MODEL, "--dropout", "0.1", "--optimizer", "adam",
               "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt",
               "--warmup-updates", "20",
               "--criterion", "diagnostic_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               "--diag-source-dependence-interval", "10", "--max-tokens", "1500", "--max-update", "50",
               *(["--no-epoch-checkpoints"] if init == "source" else ["--no-save"]), "--save-dir", work / init,
               "--log-format", "json", "--log-interval", "10", "--num-workers", "0"]
        procs[init] = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    curves = {}
    for init, proc in procs.items():
        log = proc.communicate()[0]
        assert proc.returncode == 0, log[-3000:]
        assert f"({init} init)" in log
        records = [json.loads(line.split("| train_inner | ", 1)[1]) for line in log.splitlines()
                   if "| train_inner | " in line]
        curves[init] = {int(r["num_updates"]): float(r["src_dep"]) for r in records if "src_dep" in r}
    return work, curves


def test_source_init_uses_the_source_sooner_than_the_paper_init(trained):
    paper, source = trained[1]["paper"], trained[1]["source"]
    assert sorted(paper) == sorted(source) and len(paper) >= 5
    late = [u for u in sorted(paper) if u > 20]  # after the warm-up
    assert all(source[u] > paper[u] for u in late), (paper, source)
    assert source[late[-1]] > paper[late[-1]] + 0.2, (paper, source)


def test_source_init_model_exports_exactly(trained, tmp_path):
    """Folded into fairseq's transformer: the same scores and beam-5 hypotheses; to CTranslate2 without a setup
    (tokens in and out): fairseq-generate's hypotheses."""
    from deepnet_fairseq import translate
    from deepnet_text import textprep as tp
    from test_deploy import MAX_LEN, assert_fold_exact, export_to, fairseq_generate_valid

    work, _ = trained
    checkpoint = work / "source" / "checkpoint_last.pt"
    export_to(checkpoint, "transformer", tmp_path / "plain.pt")
    assert_fold_exact(checkpoint, tmp_path / "plain.pt", work / "bin")
    export_to(checkpoint, "ctranslate2", tmp_path / "ct2")
    assert translate.main([str(tmp_path / "ct2"), "--max-len-b", str(MAX_LEN),
                           "--input", str(work / "raw" / "valid.src"), "--output", str(tmp_path / "valid.tgt")]) == 0
    expected = fairseq_generate_valid(work / "bin", checkpoint, tmp_path / "generate")
    assert tp.read_lines(tmp_path / "valid.tgt") == expected and len(set(expected)) > 50
