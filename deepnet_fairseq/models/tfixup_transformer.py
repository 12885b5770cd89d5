"""``tfixup_transformer``: T-Fixup (Huang, Perez, Ba and Volkovs 2020, "Improving Transformer
Optimization Through Better Initialization", ICML).

No LayerNorm (and, in the paper, no learning-rate warm-up); stability comes from the init alone.
Initialised as the authors' fairseq code does it (layer6ai-labs/T-Fixup,
``fairseq/modules/transformer_layer.py::fixup_initialization`` and ``fairseq/models/transformer.py``),
with N encoder and M decoder layers:

1. Xavier-uniform for every weight matrix, zero FFN biases (the authors' ``Linear``); fairseq's
   attention init otherwise (its ``q/k/v`` Xavier gain ``1/sqrt(2)``, zero ``out_proj`` bias);
   input embeddings ``N(0, d^-1/2)`` (fairseq's).
2. Encoder: self-attention ``v`` (times ``sqrt(2)``, which cancels fairseq's ``1/sqrt(2)`` gain:
   Xavier, as the paper says) and output projections, both FFN matrices: times ``0.67 N^(-1/4)``.
3. Decoder: the same for self- and cross-attention and the FFN, times ``(9M)^(-1/4)``.
4. Encoder embedding times ``(9N)^(-1/4)``, decoder embedding times ``(9M)^(-1/4)``; with
   ``--share-all-embeddings`` the one shared table is scaled once, by the encoder's factor.

fairseq's ``sqrt(d)`` embedding scale is kept (``--no-scale-embedding`` turns it off), as in the
authors' code.
"""

import math

from fairseq.models import register_model
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from .layer_class_model import LayerClassTransformerModel, remove_layer_norms, require_no_layer_norm
from .layers import LayerClassDecoder, LayerClassEncoder
from .postln_transformer import postln_defaults
from .sizes import register_size_variants


def tfixup_layer_scales(encoder_layers, decoder_layers):
    """(encoder layer scale, decoder layer scale) of T-Fixup."""
    return 0.67 * encoder_layers ** (-1 / 4), (9 * decoder_layers) ** (-1 / 4)


def tfixup_embedding_scale(layers):
    """The input-embedding scale of a stack of ``layers`` layers: ``(9 L)^(-1/4)``."""
    return (9 * layers) ** (-1 / 4)


def tfixup_init_(layer, scale):
    """Xavier FFN with zero biases, then scale the FFN and the attention value/output projections."""
    for linear in (layer.fc1, layer.fc2):
        nn.init.xavier_uniform_(linear.weight)
        nn.init.zeros_(linear.bias)
    matrices = [layer.fc1.weight, layer.fc2.weight]
    for attn in (layer.self_attn, getattr(layer, "encoder_attn", None)):
        if attn is not None:
            attn.v_proj.weight.data.mul_(math.sqrt(2))  # fairseq's 1/sqrt(2) gain -> plain Xavier
            matrices += [attn.v_proj.weight, attn.out_proj.weight]
    for weight in matrices:
        weight.data.mul_(scale)


class TFixupEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        remove_layer_norms(self)
        tfixup_init_(self, tfixup_layer_scales(cfg.encoder.layers, cfg.decoder.layers)[0])


class TFixupDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        remove_layer_norms(self)
        tfixup_init_(self, tfixup_layer_scales(cfg.encoder.layers, cfg.decoder.layers)[1])


class TFixupEncoder(LayerClassEncoder):
    layer_class = TFixupEncoderLayer

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        embed_tokens.weight.data.mul_(tfixup_embedding_scale(cfg.encoder.layers))
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)


class TFixupDecoder(LayerClassDecoder):
    layer_class = TFixupDecoderLayer

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        if not cfg.share_all_embeddings:  # a shared table was scaled by the encoder
            embed_tokens.weight.data.mul_(tfixup_embedding_scale(cfg.decoder.layers))
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)


@register_model("tfixup_transformer")
class TFixupTransformerModel(LayerClassTransformerModel):
    encoder_class = TFixupEncoder
    decoder_class = TFixupDecoder

    @classmethod
    def check_args(cls, args):
        require_no_layer_norm(args, "T-Fixup")


register_size_variants("tfixup_transformer", postln_defaults)
