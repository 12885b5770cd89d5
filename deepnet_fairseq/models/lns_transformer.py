"""``lns_transformer``: LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth in Large Language Models";
arXiv:2502.05795).

Pre-LN whose LayerNorm outputs in layer l (1-based, counted in each stack) are multiplied by ``1/sqrt(l)``:

    x <- x + G(LN(x) / sqrt(l))

for every sublayer of the layer (self-attention, cross-attention, FFN), as the authors' code does
(lmsdss/LayerNorm-Scaling, ``peft_pretraining/modeling_llama.py``, ``NORM_TYPE=LNS``: both of a LLaMA layer's
norms times ``1 / math.sqrt(layer_index + 1)``, ``layer_index`` 0-based). The final LayerNorm of each stack is not
scaled (the code's ``LlamaModel.norm`` is not). Layers and init are fairseq's.

Each scaled LayerNorm keeps its factor as a persistent buffer ``lns_scale``: checkpoints record it, and an LNS
checkpoint does not load silently into a Pre-LN model of the same shape. Since ``s * LN(x) = LN'(x)`` with
LN' = LN with weight and bias times s, an LNS model is exactly a Pre-LN model with those LayerNorm weights.
"""

import math

import torch
from fairseq.models import register_model
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from .layer_class_model import LAYER_NORM_NAMES, LayerClassTransformerModel, require_pre_ln
from .layers import LayerClassDecoder, LayerClassEncoder
from .preln_transformer import preln_defaults
from .sizes import register_size_variants


class ScaledLayerNorm(nn.LayerNorm):
    """``LN(x) * lns_scale``."""

    def __init__(self, normalized_shape, scale, eps=1e-5):
        super().__init__(normalized_shape, eps=eps)
        self.register_buffer("lns_scale", torch.tensor(float(scale)))

    def forward(self, x):
        return super().forward(x) * self.lns_scale


def scale_layer_norms_(layer, layer_index):
    """Replace the layer's LayerNorms (gain 1, bias 0 at init, as fairseq's) by ones scaled by 1/sqrt(l)."""
    for name in LAYER_NORM_NAMES:
        norm = getattr(layer, name, None)
        if norm is not None:
            setattr(layer, name, ScaledLayerNorm(norm.normalized_shape, 1 / math.sqrt(layer_index + 1), eps=norm.eps))


class LNSEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False, layer_index=0):
        super().__init__(cfg, return_fc=return_fc)
        scale_layer_norms_(self, layer_index)


class LNSDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False, layer_index=0):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        scale_layer_norms_(self, layer_index)


class LNSEncoder(LayerClassEncoder):
    layer_class = LNSEncoderLayer

    def new_layer(self, layer_class, cfg, index):
        return layer_class(cfg, return_fc=self.return_fc, layer_index=index)


class LNSDecoder(LayerClassDecoder):
    layer_class = LNSDecoderLayer

    def new_layer(self, cfg, no_encoder_attn, index):
        return self.layer_class(cfg, no_encoder_attn, layer_index=index)


@register_model("lns_transformer")
class LNSTransformerModel(LayerClassTransformerModel):
    encoder_class = LNSEncoder
    decoder_class = LNSDecoder

    @classmethod
    def check_args(cls, args):
        require_pre_ln(args, "LayerNorm Scaling")


register_size_variants("lns_transformer", preln_defaults)
