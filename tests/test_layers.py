"""The layering contract (.importlinter, import-linter): imports run downward only, from the benchmarks and
experiment drivers through the setups and the deploy path to training, criterions, instrumentation and models."""

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

LINT = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("deepnet_fairseq", "deepnet_setups", "deepnet_experiments", "benchmarks", "deepnet_text", "deepnet_methods")


def lint(root):
    return subprocess.run([str(LINT), "--config", str(root / ".importlinter"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, env={"PYTHONPATH": str(root), "PATH": str(LINT.parent)})


def test_the_tree_keeps_its_layers():
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout


def test_a_back_import_breaks_the_contract(tmp_path):
    """A model that imports a setup (a back-arrow) fails the contract, naming the import."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path)
    (tmp_path / "deepnet_fairseq/models/back_arrow.py").write_text("from deepnet_setups import config  # noqa\n")
    proc = lint(tmp_path)
    assert proc.returncode != 0 and "0 kept, 1 broken" in proc.stdout
    assert "deepnet_fairseq.models.back_arrow -> deepnet_setups.config" in proc.stdout
