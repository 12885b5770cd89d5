"""``--deepnorm-init source``: the decoder uses its source sooner than with the paper's init (issue: DeepNet
without the plateau). Its constants and weights are in test_models.py; the study is in docs/diagnostics.md."""

import json
import os
import subprocess

import pytest

from conftest import BIN, ROOT, TINY_MODEL, USER_DIR, run
from deepnet_fairseq.synthetic import write_reverse_map_task


@pytest.fixture(scope="module")
def src_dep_by_init(tmp_path_factory):
    """6L-6L DeepNet, paper init and source init, 60 updates on the package's reverse-and-map task (the target
    is unpredictable without the source), src_dep probed every 10 updates: {init: {update: src_dep}}."""
    work = tmp_path_factory.mktemp("source_init")
    write_reverse_map_task(work / "raw", train=2000, valid=100, test=10)
    run([BIN / "fairseq-preprocess", "-s", "src", "-t", "tgt", "--trainpref", work / "raw" / "train",
         "--validpref", work / "raw" / "valid", "--destdir", work / "bin", "--workers", "1"])
    procs = {}
    for init in ("paper", "source"):
        cmd = [BIN / "fairseq-train", work / "bin", "--user-dir", USER_DIR, "--cpu", "--seed", "1",
               "--arch", "deepnet_transformer", "--deepnorm-init", init, "--encoder-layers", "6",
               "--decoder-layers", "6", *TINY_MODEL, "--dropout", "0.1", "--optimizer", "adam",
               "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "20",
               "--criterion", "diagnostic_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               "--diag-source-dependence-interval", "10", "--max-tokens", "1500", "--max-update", "60", "--no-save",
               "--save-dir", work / init, "--log-format", "json", "--log-interval", "10", "--num-workers", "0"]
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
    return curves


def test_source_init_uses_the_source_sooner_than_the_paper_init(src_dep_by_init):
    paper, source = src_dep_by_init["paper"], src_dep_by_init["source"]
    assert sorted(paper) == sorted(source) and len(paper) >= 5
    late = [u for u in sorted(paper) if u > 20]  # after the warm-up
    assert all(source[u] > paper[u] for u in late), (paper, source)
    assert source[late[-1]] > paper[late[-1]] + 0.2, (paper, source)
