"""``dsinit_transformer``: depth-scaled initialisation (Zhang, Titov and Sennrich 2019, "Improving
Deep Transformer with Depth-Scaled Initialization and Merged Attention", EMNLP).

Post-LN Transformer whose weight matrices in layer ``l`` (1-based, counted separately in the
encoder and the decoder) are drawn from ``U(-gamma, gamma)`` with

    gamma = alpha * sqrt(6 / (d_in + d_out)) / sqrt(l),   alpha = 1,

i.e. Xavier-uniform with gain ``1/sqrt(l)``: deeper layers start with smaller outputs, which
shrinks the variance reaching each residual sum. Biases, LayerNorms and embeddings keep fairseq's
init. The paper's merged attention (a separate speed-up) is not part of this baseline.
"""

import math

from fairseq.models import register_model
from torch import nn

from .layer_class_model import LayerClassTransformerModel, require_post_ln
from .layers import LayerClassDecoder, LayerClassEncoder
from .postln_transformer import postln_defaults
from .sizes import register_size_variants


def depth_scaled_init_(layers):
    """Xavier-uniform with gain 1/sqrt(l) for every weight matrix of the l-th layer."""
    for depth, layer in enumerate(layers, start=1):
        for name, param in layer.named_parameters():
            if name.endswith("weight") and param.dim() == 2:
                nn.init.xavier_uniform_(param, gain=1.0 / math.sqrt(depth))


class DSInitEncoder(LayerClassEncoder):
    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        depth_scaled_init_(self.layers)


class DSInitDecoder(LayerClassDecoder):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        depth_scaled_init_(self.layers)


@register_model("dsinit_transformer")
class DSInitTransformerModel(LayerClassTransformerModel):
    encoder_class = DSInitEncoder
    decoder_class = DSInitDecoder

    @classmethod
    def check_args(cls, args):
        require_post_ln(args, "DS-Init")


register_size_variants("dsinit_transformer", postln_defaults)
