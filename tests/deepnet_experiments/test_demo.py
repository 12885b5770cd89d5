"""``make demo``'s program at a tiny setting: its outputs and their shape (the real contrast is in the README)."""

import json
import math
import sys

import pytest

from conftest import ROOT, run


@pytest.mark.slow  # four fairseq-train runs (~40 s): make test-slow (CI)
def test_demo_prints_a_short_report_and_writes_the_summary(tmp_path):
    from deepnet_experiments.demo import LABEL_WIDTH

    proc = run([sys.executable, "-m", "deepnet_experiments.demo", "--layers", "2", "--updates", "12", "--warmup", "4",
                "--train-pairs", "200", "--out", tmp_path], cwd=ROOT)
    output = proc.stdout + proc.stderr
    assert "DEBUG" not in output and len(output.splitlines()) < 100
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["depth"] == "2L-2L" and "accuracy" in summary["heldout_metric"]
    assert set(summary["models"]) == {"Post-LN", "Pre-LN", "DeepNet, paper init", "DeepNet, source init"}
    for label, model in summary["models"].items():
        assert model["diverged"] is False
        assert 0 < model["final_loss"] < 10 and 0 <= model["heldout"] <= 100
        assert f"{label:{LABEL_WIDTH}} 2L-2L: final loss {model['final_loss']:.3f}" in proc.stdout
    # the task: reversal through a 16-word lexicon, so a model that ignores the source scores ~log2(17) bits
    assert math.log2(16) <= summary["unigram_entropy_bits"] <= math.log2(17)
    for name in ("comparison.txt", "comparison.png"):
        assert (tmp_path / name).stat().st_size > 500
    # the runs train at once: each needs its own save dir (fairseq writes and deletes a probe file there)
    commands = sorted((tmp_path / "runs").glob("*/command.txt"))
    assert len(commands) == 4 and all(f"--save-dir {c.parent / 'checkpoints'}" in c.read_text() for c in commands)


def test_demo_rejects_bad_options(tmp_path):
    proc = run([sys.executable, "-m", "deepnet_experiments.demo", "--layers", "0", "--out", tmp_path], cwd=ROOT, check=False)
    assert proc.returncode == 2 and "--layers must be >= 1" in proc.stderr
    proc = run([sys.executable, "-m", "deepnet_experiments.demo", "--raw-dir", tmp_path, "--out", tmp_path / "o"],
               cwd=ROOT, check=False)
    assert proc.returncode != 0 and "demo: missing" in proc.stderr


def test_readme_quotes_the_committed_fresh_demo_run():
    """The README's demo lines are what a fresh `make demo` printed (docs/results/demo/summary.json,
    with the defaults of deepnet_experiments.demo)."""
    from deepnet_experiments.demo import LABEL_WIDTH, parse_args

    summary = json.loads((ROOT / "docs" / "results" / "demo" / "summary.json").read_text())
    defaults = parse_args([])
    assert summary["depth"] == f"{defaults.layers}L-{defaults.layers}L"
    assert {k: summary["settings"][k] for k in ("updates", "lr", "warmup", "seed")} == \
        {"updates": defaults.updates, "lr": defaults.lr, "warmup": defaults.warmup, "seed": defaults.seed}
    readme = (ROOT / "README.md").read_text()
    for label, model in summary["models"].items():
        line = (f"{label:{LABEL_WIDTH}} {summary['depth']}: final loss {model['final_loss']:.3f} bits/token, "
                f"held-out accuracy {model['heldout']:.1f}%")
        assert line in readme, line
    assert (ROOT / "docs" / "results" / "demo" / "comparison.txt").read_text().splitlines()[0].startswith("model")
