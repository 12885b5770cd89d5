"""``--encoder-drop-residual-layer K`` (Liu et al. 2021): encoder layer K's self-attention without its residual
connection, in every architecture built on the plugin's layer classes; the other sublayers are untouched."""

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
