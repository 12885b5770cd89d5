"""``subln_transformer``: Sub-LayerNorm with Magneto's init (Wang, Ma, Huang, Dong, Wang, Peng,
Wu, Bajaj, Singhal, Benhaim, Patra, Liu, Chaudhary, Song and Wei 2022, "Foundation Transformers",
ICML 2023 as "Magneto: A Foundation Transformer").

Sub-LN keeps Pre-LN's LayerNorm at the start of each sublayer (and the final LayerNorm) and adds
a second one inside the self-attention and the FFN, before the output projection:

    self-attention:   x + W_O LN(Attention(W_Q LN(x), W_K LN(x), W_V LN(x)))
    FFN:              x + W_2 LN(act(W_1 LN(x)))
    cross-attention:  x + W_O Attention(W_Q LN(x), W_K m, W_V m)   (no inner LayerNorm)

Init, as the authors' torchscale code does it (microsoft/torchscale, ``architecture/encoder.py`` and
``decoder.py``, ``component/multihead_attention.py``, ``component/feedforward_network.py``): every
projection starts from torch's ``nn.Linear`` default (torchscale's attention never calls its own
``reset_parameters``); then weights *and biases* of the FFN and of the self-attention's value and
output projections are multiplied by gamma (the cross-attention is left as it is), with

    encoder-only / decoder-only (L layers):  gamma = sqrt(log(2L))
    encoder-decoder:  encoder gamma = sqrt(log(3M) * log(2N) / 3),  decoder gamma = sqrt(log(3M)).

The inner LayerNorm sits inside fairseq's ``MultiheadAttention`` (its ``out_proj`` becomes
``Linear(LN(.))``), so the self-attention uses fairseq's own reference path rather than torch's
fused kernel, which would bypass ``out_proj``'s forward.
"""

import math

from fairseq.models import register_model
from fairseq.modules.quant_noise import quant_noise
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from .layer_class_model import LayerClassTransformerModel, NormedLinear, require_pre_ln
from .layers import LayerClassDecoder, LayerClassEncoder
from .preln_transformer import preln_defaults
from .sizes import register_size_variants


def magneto_gains(encoder_layers, decoder_layers):
    """(encoder gamma, decoder gamma); 0 layers = no such stack (its gamma is None)."""
    n, m = encoder_layers, decoder_layers
    if n and m:
        return math.sqrt(math.log(3 * m) * math.log(2 * n) / 3), math.sqrt(math.log(3 * m))
    return (math.sqrt(math.log(2 * n)) if n else None), (math.sqrt(math.log(2 * m)) if m else None)


def sub_ln_attention_(attn):
    """Put a LayerNorm before the attention's output projection (keeping its weights)."""
    out_proj = NormedLinear(attn.out_proj.in_features, attn.out_proj.out_features, bias=attn.out_proj.bias is not None)
    out_proj.load_state_dict(attn.out_proj.state_dict(), strict=False)
    attn.out_proj = out_proj
    attn._set_skip_embed_dim_check()  # fairseq's own attention path, which calls out_proj
    return attn


def magneto_init_(layer, gain):
    """torchscale's init: ``nn.Linear`` defaults, then FFN and self-attention v/out (weights and biases) x gain."""
    for attn in (layer.self_attn, getattr(layer, "encoder_attn", None)):
        if attn is not None:
            for linear in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
                nn.Linear.reset_parameters(linear)
    for linear in (layer.fc1, layer.fc2, layer.self_attn.v_proj, layer.self_attn.out_proj):
        for param in linear.parameters(recurse=False):
            param.data.mul_(gain)


class SubLNLayerMixin:
    def build_fc2(self, input_dim, output_dim, q_noise, qn_block_size):
        return quant_noise(NormedLinear(input_dim, output_dim), p=q_noise, block_size=qn_block_size)

    def build_self_attention(self, embed_dim, cfg, *args, **kwargs):
        return sub_ln_attention_(super().build_self_attention(embed_dim, cfg, *args, **kwargs))


class SubLNEncoderLayer(SubLNLayerMixin, TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        magneto_init_(self, magneto_gains(cfg.encoder.layers, cfg.decoder.layers)[0])


class SubLNDecoderLayer(SubLNLayerMixin, TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        magneto_init_(self, magneto_gains(cfg.encoder.layers, cfg.decoder.layers)[1])


class SubLNEncoder(LayerClassEncoder):
    layer_class = SubLNEncoderLayer


class SubLNDecoder(LayerClassDecoder):
    layer_class = SubLNDecoderLayer


@register_model("subln_transformer")
class SubLNTransformerModel(LayerClassTransformerModel):
    encoder_class = SubLNEncoder
    decoder_class = SubLNDecoder

    @classmethod
    def check_args(cls, args):
        require_pre_ln(args, "Sub-LN")


register_size_variants("subln_transformer", preln_defaults)
