"""``dyt_transformer``: Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization", CVPR 2025;
arXiv:2503.10622).

Pre-LN with every LayerNorm replaced by

    DyT(x) = gamma * tanh(alpha * x) + beta,    alpha: one learnt scalar, gamma, beta: learnt per channel

at init alpha = ``--dyt-alpha-init`` (0.5 by default), gamma = 1, beta = 0, as in the authors' code
(facebookresearch/DyT, ``dynamic_tanh.py``: ``DynamicTanh`` with ``alpha_init_value=0.5``, and
``convert_ln_to_dyt``, which replaces every ``nn.LayerNorm`` of a model). Here that is each layer's LayerNorms,
each stack's final LayerNorm and, if ``--layernorm-embedding`` is given, the embedding one: no LayerNorm
remains. One alpha init for all of them: the paper tunes separate inits only for its LLaMA models (with an
extra learnt scale after the embedding), neither of which is reproduced. Layers and init otherwise fairseq's.
"""

from dataclasses import dataclass, field

import torch
from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from .layer_class_model import LAYER_NORM_NAMES, LayerClassTransformerModel, require_pre_ln
from .layers import LayerClassDecoder, LayerClassEncoder
from .preln_transformer import preln_defaults
from .sizes import register_size_variants

DEFAULT_ALPHA_INIT = 0.5


@dataclass
class DyTConfig(TransformerConfig):
    dyt_alpha_init: float = field(default=DEFAULT_ALPHA_INIT,
                                  metadata={"help": "DyT: initial alpha of every gamma * tanh(alpha x) + beta"})


class DynamicTanh(nn.Module):
    def __init__(self, dim, alpha_init=DEFAULT_ALPHA_INIT):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return self.weight * torch.tanh(self.alpha * x) + self.bias

    def extra_repr(self):
        return f"{self.weight.numel()}"


def replace_layer_norms_(module, names, cfg):
    """``module``'s LayerNorms ``names`` (those present) replaced by DyT."""
    for name in names:
        norm = getattr(module, name, None)
        if norm is not None:
            setattr(module, name, DynamicTanh(norm.weight.numel(), cfg.dyt_alpha_init))


class DyTEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        replace_layer_norms_(self, LAYER_NORM_NAMES, cfg)


class DyTDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        replace_layer_norms_(self, LAYER_NORM_NAMES, cfg)


STACK_NORMS = ("layer_norm", "layernorm_embedding")


class DyTEncoder(LayerClassEncoder):
    layer_class = DyTEncoderLayer

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        replace_layer_norms_(self, STACK_NORMS, cfg)


class DyTDecoder(LayerClassDecoder):
    layer_class = DyTDecoderLayer

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        replace_layer_norms_(self, STACK_NORMS, cfg)


@register_model("dyt_transformer")
class DyTTransformerModel(LayerClassTransformerModel):
    config_class = DyTConfig
    encoder_class = DyTEncoder
    decoder_class = DyTDecoder

    @classmethod
    def check_args(cls, args):
        require_pre_ln(args, "DyT")


def dyt_defaults(args):
    preln_defaults(args)
    args.dyt_alpha_init = getattr(args, "dyt_alpha_init", DEFAULT_ALPHA_INIT)


register_size_variants("dyt_transformer", dyt_defaults)
