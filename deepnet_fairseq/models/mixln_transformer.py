"""``mixln_transformer``: Mix-LN (Li et al. 2025, "Mix-LN: Unleashing the Power of Deeper Layers by Combining
Pre-LN and Post-LN", ICLR 2025; arXiv:2412.13795).

In each stack of L layers the first ``floor(a * L)`` layers are Post-LN and the others Pre-LN:

    layer l < floor(a L):   x <- LN(x + G(x))       (0-based l)
    layer l >= floor(a L):  x <- x + G(LN(x))

``a = --mixln-post-fraction``, 0.25 by default (the paper's choice). Encoder and decoder count their own layers
(``floor(a N)`` and ``floor(a M)``). As in the authors' code (LLaMA's ``LlamaModel``, whose final norm is
built whatever the layers' placement; ``NORM_TYPE=post_pre`` with ``POST_NUM`` Post-LN layers, e.g. 3 of 12
and 6 of 24), each stack keeps Pre-LN's final LayerNorm, so ``--*-normalize-before`` stay on and each layer
overrides fairseq's ``normalize_before`` by its index. Layers and init are fairseq's.
"""

import math
from dataclasses import dataclass, field

from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from .layer_class_model import LayerClassTransformerModel
from .layers import LayerClassDecoder, LayerClassEncoder
from .preln_transformer import preln_defaults
from .sizes import register_size_variants

DEFAULT_POST_FRACTION = 0.25


@dataclass
class MixLNConfig(TransformerConfig):
    mixln_post_fraction: float = field(
        default=DEFAULT_POST_FRACTION,
        metadata={"help": "Mix-LN: the first floor(a * layers) layers of each stack are Post-LN, the rest Pre-LN"})


def post_ln_layers(fraction, layers):
    """How many of a stack's first layers are Post-LN: floor(fraction * layers) (exact for decimal fractions)."""
    return math.floor(fraction * layers + 1e-9)


class MixLNEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False, layer_index=0):
        super().__init__(cfg, return_fc=return_fc)
        self.normalize_before = layer_index >= post_ln_layers(cfg.mixln_post_fraction, cfg.encoder.layers)


class MixLNDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False, layer_index=0):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        self.normalize_before = layer_index >= post_ln_layers(cfg.mixln_post_fraction, cfg.decoder.layers)


class MixLNEncoder(LayerClassEncoder):
    layer_class = MixLNEncoderLayer

    def new_layer(self, layer_class, cfg, index):
        return layer_class(cfg, return_fc=self.return_fc, layer_index=index)


class MixLNDecoder(LayerClassDecoder):
    layer_class = MixLNDecoderLayer

    def new_layer(self, cfg, no_encoder_attn, index):
        return self.layer_class(cfg, no_encoder_attn, layer_index=index)


@register_model("mixln_transformer")
class MixLNTransformerModel(LayerClassTransformerModel):
    config_class = MixLNConfig
    encoder_class = MixLNEncoder
    decoder_class = MixLNDecoder

    @classmethod
    def check_args(cls, args):
        if not (getattr(args, "encoder_normalize_before", False) and getattr(args, "decoder_normalize_before", False)):
            raise ValueError("--encoder/--decoder-normalize-before: Mix-LN keeps Pre-LN's final LayerNorms and sets "
                             "each layer's placement itself (--mixln-post-fraction); they must stay on")
        if getattr(args, "no_decoder_final_norm", False):
            raise ValueError("--no-decoder-final-norm: Mix-LN keeps the final decoder LayerNorm")
        fraction = getattr(args, "mixln_post_fraction", DEFAULT_POST_FRACTION)
        if not 0 <= fraction <= 1:
            raise ValueError(f"--mixln-post-fraction must be between 0 and 1, got {fraction}")


def mixln_defaults(args):
    preln_defaults(args)
    args.mixln_post_fraction = getattr(args, "mixln_post_fraction", DEFAULT_POST_FRACTION)  # recorded in checkpoints


register_size_variants("mixln_transformer", mixln_defaults)
