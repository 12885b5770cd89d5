"""``normformer_transformer``: NormFormer (Shleifer, Weston and Ott 2021, "NormFormer: Improved
Transformer Pretraining with Extra Normalization").

Pre-LN (``x <- x + G(LN(x))``, final LayerNorm) plus three operations per layer, each selected by
fairseq 0.12's own options, all on by default here:

- ``--scale-attn``: a LayerNorm on the self-attention output, ``x + LN(MHA(LN(x)))``;
- ``--scale-heads``: a learnable scale ``gamma_h`` (init 1) per attention head;
- ``--scale-fc``: a LayerNorm after the FFN activation, ``W2 LN(act(W1 LN(x)))``.

fairseq implements them in its decoder layer (and ``--scale-resids``, a learnable per-dimension
weight on the FFN residual, off here as in the paper's large models); its encoder layer ignores
them, so the encoder layer below adds the same operations with fairseq's hooks (a forward hook on
the self-attention, ``build_fc2``), in the same places. As in fairseq, the head scale multiplies
the attention output's ``head_dim``-sized slices after the output projection.
"""

from dataclasses import dataclass, field

import torch
from fairseq import utils
from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig
from fairseq.modules import LayerNorm
from fairseq.modules.quant_noise import quant_noise
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import nn

from .layer_class_model import LayerClassTransformerModel, NormedLinear, require_pre_ln
from .layers import LayerClassEncoder
from .preln_transformer import preln_defaults
from .sizes import register_size_variants


@dataclass
class NormFormerConfig(TransformerConfig):
    scale_attn: bool = field(default=False, metadata={"help": "NormFormer: LayerNorm on the self-attention output"})
    scale_fc: bool = field(default=False, metadata={"help": "NormFormer: LayerNorm after the FFN activation"})
    scale_heads: bool = field(default=False, metadata={"help": "NormFormer: learnable per-head attention scale"})
    scale_resids: bool = field(default=False, metadata={"help": "NormFormer: learnable FFN residual weight (decoder)"})


def normformer_attention_output(attn, inputs, output):
    """Forward hook of the encoder self-attention: head scale, then LayerNorm, on its output."""
    x, weights = output
    if attn.head_scale is not None:
        length, batch, dim = x.shape
        x = (x.view(length, batch, attn.num_heads, attn.head_dim) * attn.head_scale[:, None]).view(length, batch, dim)
    if attn.output_layer_norm is not None:
        x = attn.output_layer_norm(x)
    return x, weights


class NormFormerEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        scale_heads = utils.safe_getattr(cfg, "scale_heads", False)
        scale_attn = utils.safe_getattr(cfg, "scale_attn", False)
        self.self_attn.head_scale = nn.Parameter(torch.ones(self.self_attn.num_heads)) if scale_heads else None
        self.self_attn.output_layer_norm = LayerNorm(self.embed_dim) if scale_attn else None
        self.self_attn.register_forward_hook(normformer_attention_output)

    def build_fc2(self, input_dim, output_dim, q_noise, qn_block_size):
        if not utils.safe_getattr(self.cfg, "scale_fc", False):
            return super().build_fc2(input_dim, output_dim, q_noise, qn_block_size)
        return quant_noise(NormedLinear(input_dim, output_dim), p=q_noise, block_size=qn_block_size)


class NormFormerEncoder(LayerClassEncoder):
    layer_class = NormFormerEncoderLayer


@register_model("normformer_transformer")
class NormFormerTransformerModel(LayerClassTransformerModel):
    config_class = NormFormerConfig
    encoder_class = NormFormerEncoder

    @classmethod
    def check_args(cls, args):
        require_pre_ln(args, "NormFormer")


def normformer_defaults(args):
    preln_defaults(args)
    for option in ("scale_attn", "scale_fc", "scale_heads"):
        setattr(args, option, getattr(args, option, True))
    args.scale_resids = getattr(args, "scale_resids", False)


register_size_variants("normformer_transformer", normformer_defaults)
