"""``dsinit_transformer``: depth-scaled initialisation (Zhang, Titov and Sennrich 2019, "Improving
Deep Transformer with Depth-Scaled Initialization and Merged Attention", EMNLP).

A Post-LN Transformer whose weight matrices in layer ``l`` (1-based, counted separately in the
encoder and the decoder) start smaller the deeper the layer, which shrinks the variance reaching
each residual sum. Two readings of "smaller", chosen with ``--dsinit-formula``:

- ``code`` (default), the authors' released code (bzhangGo/zero, ``models/transformer.py`` with
  ``deep_transformer_init``; ``func.py``): TensorFlow's
  ``variance_scaling_initializer(scale=l^(-1/2), mode="fan_avg", distribution="uniform")``, i.e.
  ``U(-b, b)`` with ``b = sqrt(6 l^(-1/2) / (fan_in + fan_out))``: Xavier times ``l^(-1/4)``, since
  the scale multiplies the variance. Self-attention projects q, k and v with one fused
  ``[d, 3d]`` matrix (``fan_out = 3d`` for each of them); cross-attention has separate q, k, v;
  every bias of the layer starts at 0.
- ``paper``, the formula as printed: ``U(-b, b)`` with ``b = sqrt(6 / (fan_in + fan_out)) / sqrt(l)``
  (Xavier times ``l^(-1/2)``) for every weight matrix on its own; biases keep fairseq's init.

LayerNorms and embeddings keep fairseq's init (the same as the authors'). The paper's merged
attention (a separate speed-up) is not part of this baseline.
"""

import math
from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig
from torch import nn

from .layer_class_model import LayerClassTransformerModel, require_post_ln
from .layers import LayerClassDecoder, LayerClassEncoder
from .postln_transformer import postln_defaults
from .sizes import register_size_variants


@dataclass
class DSInitConfig(TransformerConfig):
    dsinit_formula: ChoiceEnum(["code", "paper"]) = field(default="code", metadata={
        "help": "DS-Init: 'code' = the authors' released code (Xavier x l^-1/4, fused self-attention q/k/v, "
                "zero biases); 'paper' = the printed formula (Xavier x l^-1/2 per matrix)"})


def variance_scaling_uniform_(weight, scale, fan_in, fan_out):
    """TensorFlow's ``variance_scaling_initializer(scale, mode="fan_avg", distribution="uniform")``."""
    bound = math.sqrt(3 * scale / ((fan_in + fan_out) / 2))
    nn.init.uniform_(weight, -bound, bound)


def depth_scaled_init_code_(layer, depth):
    """The authors' code: variance scale ``1/sqrt(l)``, fused self-attention q/k/v, zero biases."""
    attn = layer.self_attn
    fused = {attn.q_proj, attn.k_proj, attn.v_proj}
    for module in layer.modules():
        if isinstance(module, nn.Linear):
            fan_out, fan_in = module.weight.shape
            variance_scaling_uniform_(module.weight, depth ** -0.5, fan_in, 3 * fan_out if module in fused else fan_out)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


def depth_scaled_init_paper_(layer, depth):
    """The printed formula: Xavier-uniform with gain ``1/sqrt(l)`` for every weight matrix."""
    for name, param in layer.named_parameters():
        if name.endswith("weight") and param.dim() == 2:
            nn.init.xavier_uniform_(param, gain=1.0 / math.sqrt(depth))


DEPTH_SCALED_INIT = {"code": depth_scaled_init_code_, "paper": depth_scaled_init_paper_}


def depth_scaled_init_(layers, formula):
    for depth, layer in enumerate(layers, start=1):
        DEPTH_SCALED_INIT[str(formula)](layer, depth)


class DSInitEncoder(LayerClassEncoder):
    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        depth_scaled_init_(self.layers, cfg.dsinit_formula)


class DSInitDecoder(LayerClassDecoder):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        depth_scaled_init_(self.layers, cfg.dsinit_formula)


@register_model("dsinit_transformer")
class DSInitTransformerModel(LayerClassTransformerModel):
    config_class = DSInitConfig
    encoder_class = DSInitEncoder
    decoder_class = DSInitDecoder

    @classmethod
    def check_args(cls, args):
        require_post_ln(args, "DS-Init")


register_size_variants("dsinit_transformer", postln_defaults)
