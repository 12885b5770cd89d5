"""``tfixup_transformer``: T-Fixup (Huang, Perez, Ba and Volkovs 2020, "Improving Transformer
Optimization Through Better Initialization", ICML).

No LayerNorm (and, in the paper, no learning-rate warm-up); stability comes from the init alone.
With N encoder and M decoder layers:

1. Xavier init for every weight matrix (fairseq's default for attention; FFN matrices are
   re-drawn with ``xavier_uniform_``); input embeddings ``N(0, d^-1/2)`` (fairseq's default).
2. Decoder: attention value ``v`` and output ``w`` projections (self and cross) and both FFN
   matrices scaled by ``(9M)^(-1/4)``; the input embeddings of encoder and decoder as well.
3. Encoder: attention ``v``/``w`` and both FFN matrices scaled by ``0.67 N^(-1/4)``.

fairseq's ``sqrt(d)`` embedding scale is kept (``--no-scale-embedding`` turns it off).
"""

from fairseq.models import register_model
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from .layer_class_model import LayerClassTransformerModel, remove_layer_norms, require_no_layer_norm
from .layers import LayerClassDecoder, LayerClassEncoder
from .postln_transformer import postln_defaults
from .sizes import register_size_variants


def tfixup_scales(encoder_layers, decoder_layers):
    """(encoder scale, decoder-and-embedding scale) of T-Fixup."""
    return 0.67 * encoder_layers ** (-1 / 4), (9 * decoder_layers) ** (-1 / 4)


def tfixup_init_(layer, scale):
    """Xavier FFN, then scale the value/output projections and FFN matrices by ``scale``."""
    for linear in (layer.fc1, layer.fc2):
        nn.init.xavier_uniform_(linear.weight)
    matrices = [layer.fc1.weight, layer.fc2.weight]
    for attn in (layer.self_attn, getattr(layer, "encoder_attn", None)):
        if attn is not None:
            matrices += [attn.v_proj.weight, attn.out_proj.weight]
    for weight in matrices:
        weight.data.mul_(scale)


class TFixupEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        remove_layer_norms(self)
        tfixup_init_(self, tfixup_scales(cfg.encoder.layers, cfg.decoder.layers)[0])


class TFixupDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        remove_layer_norms(self)
        tfixup_init_(self, tfixup_scales(cfg.encoder.layers, cfg.decoder.layers)[1])


class TFixupEncoder(LayerClassEncoder):
    layer_class = TFixupEncoderLayer


class TFixupDecoder(LayerClassDecoder):
    layer_class = TFixupDecoderLayer


@register_model("tfixup_transformer")
class TFixupTransformerModel(LayerClassTransformerModel):
    encoder_class = TFixupEncoder
    decoder_class = TFixupDecoder

    @classmethod
    def check_args(cls, args):
        require_no_layer_norm(args, "T-Fixup")

    @classmethod
    def build_embedding(cls, cfg, dictionary, embed_dim, path=None):
        embedding = super().build_embedding(cfg, dictionary, embed_dim, path)
        embedding.weight.data.mul_(tfixup_scales(cfg.encoder.layers, cfg.decoder.layers)[1])
        return embedding


register_size_variants("tfixup_transformer", postln_defaults)
