"""``periln_transformer``: Peri-LN (Kim, Lee, Park, Oh, Kim, Yoo, Shin, Han, Shin and Yoo 2025, "Peri-LN:
Revisiting Normalization Layer in the Transformer Architecture", ICML 2025; arXiv:2502.02732).

A LayerNorm around every sublayer, on its input (Pre-LN's) and on its output, with the residual stream itself
never normalised:

    x <- x + Dropout(LN_out(F(LN_in(x))))      F: self-attention, cross-attention (decoder), FFN

plus the final LayerNorm of each stack (as Pre-LN) and a LayerNorm on the embedding output (the paper's
optional ``y_0 = Norm(x_embed)``; fairseq's ``--layernorm-embedding``, on by default here,
``--periln-no-embedding-norm`` turns it off). ``F`` ends with its output projection (attention ``out_proj``,
FFN ``fc2``); the output LayerNorm comes before fairseq's residual dropout, so that dropout acts on the
normalised branch as it acts on Pre-LN's branch. Init is fairseq's (the paper changes none; the output
LayerNorms start at gain 1, bias 0 and are learnt).

Hooks: the FFN's ``fc2`` is ``OutputNormedLinear`` (``LN(Linear(x))``, ``build_fc2``); each attention keeps
fairseq's module (and its fused kernel) and gets its output LayerNorm as ``output_layer_norm`` with a forward
hook that normalises the attention output (``build_self_attention`` / ``build_encoder_attention``).
The authors released no code; the formula is the paper's eq. (3).
"""

from dataclasses import dataclass, field

from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig
from fairseq.modules import LayerNorm
from fairseq.modules.quant_noise import quant_noise
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from .layer_class_model import LayerClassTransformerModel, require_pre_ln
from .layers import LayerClassDecoder, LayerClassEncoder
from .preln_transformer import preln_defaults
from .sizes import register_size_variants


@dataclass
class PeriLNConfig(TransformerConfig):
    periln_no_embedding_norm: bool = field(
        default=False, metadata={"help": "Peri-LN: no LayerNorm on the embedding output (the paper's optional one)"})


class OutputNormedLinear(nn.Linear):
    """``LN(Linear(x))``: the projection, then a LayerNorm over its output features."""

    def __init__(self, in_features, out_features, bias=True):
        super().__init__(in_features, out_features, bias=bias)
        self.output_layer_norm = LayerNorm(out_features)

    def forward(self, x):
        return self.output_layer_norm(super().forward(x))


def normalize_attention_output(attn, inputs, output):
    """Forward hook of an attention: its output through its ``output_layer_norm`` (the weights pass through)."""
    x, weights = output
    return attn.output_layer_norm(x), weights


def output_normed(attn, cfg):
    attn.output_layer_norm = LayerNorm(attn.embed_dim, export=cfg.export)
    attn.register_forward_hook(normalize_attention_output)
    return attn


class PeriLNLayerMixin:
    def build_fc2(self, input_dim, output_dim, q_noise, qn_block_size):
        return quant_noise(OutputNormedLinear(input_dim, output_dim), p=q_noise, block_size=qn_block_size)

    def build_self_attention(self, embed_dim, cfg, *args, **kwargs):
        return output_normed(super().build_self_attention(embed_dim, cfg, *args, **kwargs), cfg)


class PeriLNEncoderLayer(PeriLNLayerMixin, TransformerEncoderLayerBase):
    pass


class PeriLNDecoderLayer(PeriLNLayerMixin, TransformerDecoderLayerBase):
    def build_encoder_attention(self, embed_dim, cfg):
        return output_normed(super().build_encoder_attention(embed_dim, cfg), cfg)


class PeriLNEncoder(LayerClassEncoder):
    layer_class = PeriLNEncoderLayer


class PeriLNDecoder(LayerClassDecoder):
    layer_class = PeriLNDecoderLayer


@register_model("periln_transformer")
class PeriLNTransformerModel(LayerClassTransformerModel):
    config_class = PeriLNConfig
    encoder_class = PeriLNEncoder
    decoder_class = PeriLNDecoder

    @classmethod
    def check_args(cls, args):
        require_pre_ln(args, "Peri-LN")
        if getattr(args, "periln_no_embedding_norm", False) and getattr(args, "layernorm_embedding", False):
            raise ValueError("--layernorm-embedding contradicts --periln-no-embedding-norm")


def periln_defaults(args):
    preln_defaults(args)
    args.layernorm_embedding = getattr(args, "layernorm_embedding",
                                       not getattr(args, "periln_no_embedding_norm", False))


register_size_variants("periln_transformer", periln_defaults)
