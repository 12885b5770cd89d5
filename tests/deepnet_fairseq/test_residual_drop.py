"""``--encoder-drop-residual-layer K`` (Liu et al. 2021): encoder layer K's self-attention without its residual
connection, in every architecture built on the plugin's layer classes; the other sublayers are untouched."""

import subprocess

import pytest
import torch
from test_models import build

SHAPE = ("--encoder-layers", 3, "--decoder-layers", 2, "--encoder-embed-dim", 16, "--decoder-embed-dim", 16,
         "--encoder-ffn-embed-dim", 32, "--decoder-ffn-embed-dim", 32, "--encoder-attention-heads", 2,
         "--decoder-attention-heads", 2, "--dropout", 0)


@pytest.mark.parametrize("arch", ["deepnet_transformer", "preln_transformer"])
def test_only_the_chosen_layers_self_attention_loses_its_residual(arch):
    torch.manual_seed(0)
    plain = build(arch, *SHAPE)
    torch.manual_seed(0)
    dropped = build(arch, *SHAPE, "--encoder-drop-residual-layer", 1)
    assert plain.state_dict().keys() == dropped.state_dict().keys()  # same parameters: checkpoints unchanged
    dropped.load_state_dict(plain.state_dict())
    x = torch.randn(5, 2, 16)  # (time, batch, channels)
    same = [torch.allclose(a(x, None), b(x, None)) for a, b in zip(plain.encoder.layers, dropped.encoder.layers)]
    assert same == [True, False, True]
    assert dropped.encoder.layers[1].residual_calls == 2  # fairseq's forward: self-attention's, then the FFN's


def test_a_layer_outside_the_encoder_is_refused():
    with pytest.raises(ValueError, match=r"--encoder-drop-residual-layer 3: the encoder has layers 0 to 2"):
        build("deepnet_transformer", *SHAPE, "--encoder-drop-residual-layer", 3)


def test_a_run_with_the_residual_drop_resumes_exactly(multi30k_small_bin, tmp_path):
    """It adds no state: stopped at update 10 (a checkpoint) and rerun to 20, the run logs the uninterrupted run's
    losses. Shorter than the resume tests' 36 updates: three fairseq-train starts are most of this test's time."""
    from test_reliability_resume import SAVE_EVERY, losses, train_cmd, train_env

    from conftest import ROOT

    last = 2 * SAVE_EVERY
    logs = {}
    for name, stops in (("straight", [last]), ("resumed", [SAVE_EVERY, last])):
        logs[name] = ""
        for stop in stops:
            cmd = [str(c) for c in train_cmd(multi30k_small_bin, tmp_path / name, ROOT / "deepnet_fairseq")]
            cmd[cmd.index("--max-update") + 1] = str(stop)
            proc = subprocess.run([*cmd, "--encoder-drop-residual-layer", "1"], capture_output=True, text=True,
                                  env=train_env())
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
            logs[name] += proc.stdout + proc.stderr
    straight, resumed = losses(logs["straight"]), losses(logs["resumed"])
    assert sorted(resumed) == sorted(straight) == list(range(1, last + 1))
    assert resumed == straight
