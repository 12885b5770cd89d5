"""--flush-denormal (train.flush_denormal): off unless asked; from the setups' config it reaches fairseq-train, which
flushes float32 denormals to zero before its first update and says so."""

import torch

from conftest import BIN, ROOT, TINY_MODEL, USER_DIR, run

from deepnet_setups import config as cfgmod
from deepnet_setups import launch

CONFIG = ROOT / "configs/iwslt14_de_en.yaml"
SMALLEST_NORMAL = torch.finfo(torch.float32).tiny


def fairseq_train_args(overrides):
    return launch.train_args(cfgmod.load(CONFIG, overrides), "postln", (6, 6), 1, False, "save", "tb")


def test_the_setups_key_reaches_fairseq_train_and_is_off_by_default():
    assert "--flush-denormal" in fairseq_train_args(["train.flush_denormal=true"])
    assert "--flush-denormal" not in fairseq_train_args([])


def test_fairseq_train_flushes_denormals_when_asked(multi30k_small_bin, tmp_path):
    # the probe runs in fairseq-train's process: the model's first forward sees whether a denormal survives
    probe = tmp_path / "probe.py"
    probe.write_text(f"""import torch
from fairseq.models import transformer
forward = transformer.TransformerModel.forward
def checked(self, *args, **kwargs):
    print("denormal survives:", bool(torch.tensor([{SMALLEST_NORMAL!r}], dtype=torch.float32)[0] / 4 > 0))
    return forward(self, *args, **kwargs)
transformer.TransformerModel.forward = checked
""")
    out = {}
    for flag in ([], ["--flush-denormal"]):
        cmd = [BIN / "python", "-c", f"exec(open({str(probe)!r}).read()); from fairseq_cli.train import cli_main; "
               "cli_main()", multi30k_small_bin, "--user-dir", USER_DIR, "--task", "translation_exact_resume",
               "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", *TINY_MODEL, "--cpu",
               "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "1",
               "--disable-validation", "--no-save", "--num-workers", "0", *flag]
        proc = run(cmd, env={"PYTHONPATH": str(ROOT)})
        out[bool(flag)] = proc.stdout + proc.stderr
    assert "denormal survives: True" in out[False] and "flushed to zero" not in out[False]
    assert "denormal survives: False" in out[True] and "float32 denormals are flushed to zero" in out[True]
