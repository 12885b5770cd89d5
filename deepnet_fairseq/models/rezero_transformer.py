"""``rezero_transformer``: ReZero (Bachlechner, Majumder, Mao, Cottrell and McAuley 2020,
"ReZero is All You Need: Fast Convergence at Large Depth").

No LayerNorm anywhere; every sublayer is a residual branch gated by a learnable scalar that
starts at zero,

    x <- x + alpha * F(x),    alpha = 0 at init,

so each layer is the identity map at initialisation. As in the authors' reference code, one
``alpha`` per layer is shared by the layer's sublayers (attention(s) and FFN).
"""

import torch
from fairseq.models import register_model
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from .layer_class_model import LayerClassTransformerModel, remove_layer_norms, require_no_layer_norm
from .layers import LayerClassDecoder, LayerClassEncoder
from .postln_transformer import postln_defaults
from .sizes import register_size_variants


class ReZeroLayerMixin:
    def init_rezero(self):
        remove_layer_norms(self)
        self.rezero_alpha = nn.Parameter(torch.zeros(1))

    def residual_connection(self, x, residual):
        return residual + self.rezero_alpha * x


class ReZeroEncoderLayer(ReZeroLayerMixin, TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.init_rezero()


class ReZeroDecoderLayer(ReZeroLayerMixin, TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        self.init_rezero()


class ReZeroEncoder(LayerClassEncoder):
    layer_class = ReZeroEncoderLayer


class ReZeroDecoder(LayerClassDecoder):
    layer_class = ReZeroDecoderLayer


@register_model("rezero_transformer")
class ReZeroTransformerModel(LayerClassTransformerModel):
    encoder_class = ReZeroEncoder
    decoder_class = ReZeroDecoder

    @classmethod
    def check_args(cls, args):
        require_no_layer_norm(args, "ReZero")


register_size_variants("rezero_transformer", postln_defaults)
