"""Checkpoints load with torch's weights-only unpickler; a malicious pickle is refused."""

import ast
import os

import pytest
import torch

import deepnet_fairseq  # noqa: F401  (allow-list)
from deepnet_fairseq.training.checkpoints import allowed_global_names
from fairseq import checkpoint_utils

from conftest import BIN, USER_DIR, run


def test_plain_checkpoint_needs_only_allow_listed_globals(deepnet_run):
    save, _ = deepnet_run
    ckpt = save / "checkpoint_last.pt"
    # asked in a fresh interpreter without the plugin: torch names every global it would refuse
    probe = ("import sys, torch; print(sorted(torch.serialization.get_unsafe_globals_in_checkpoint(sys.argv[1])))")
    needed = set(ast.literal_eval(run([BIN / "python", "-c", probe, ckpt]).stdout))
    assert needed == {"argparse.Namespace"}
    assert needed <= allowed_global_names()
    state = checkpoint_utils.load_checkpoint_to_cpu(str(ckpt))  # weights-only, with the plugin's allow-list
    assert state["cfg"]["model"].arch == "deepnet_transformer_iwslt_de_en"
    assert state["model"]["encoder.layers.0.deepnorm_alpha"].item() == pytest.approx(0.81 * 6 ** (5 / 16))


def test_weights_only_is_not_switched_off():
    assert os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD") in (None, "", "0")
    code = open(deepnet_fairseq.training.checkpoints.__file__).read()
    assert "weights_only=False" not in code


class Exploit:
    marker = None

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def write_malicious_checkpoint(path, marker):
    Exploit.marker = marker
    torch.save({"args": None, "cfg": {"model": Exploit()}, "model": {}}, path)


def test_malicious_pickle_is_refused_by_fairseq_loader(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    write_malicious_checkpoint(path, marker)
    with pytest.raises(Exception, match="(?i)weights.only|unsupported global"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not marker.exists()


def test_malicious_pickle_is_refused_by_fairseq_generate(tmp_path, multi30k_bin):
    marker = tmp_path / "pwned"
    path = tmp_path / "checkpoint_evil.pt"
    write_malicious_checkpoint(path, marker)
    proc = run([BIN / "fairseq-generate", multi30k_bin, "--user-dir", USER_DIR, "--path", path, "--cpu",
                "--gen-subset", "test", "--max-sentences", "8"], check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    last_line = proc.stderr.strip().splitlines()[-1]  # one line naming the file and what was refused
    assert last_line.startswith(f"error: {path}: refused by torch's weights-only loader (Weights only load failed")
    assert "posix.system" in last_line
    assert not marker.exists()
