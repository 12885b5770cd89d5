"""``residual_transformer``: ResiDual (Xie, Zhang, Chen, Kim, Zhang, Zhou, Yang, Huang, Li, Zhang,
Bian and Liu 2023, "ResiDual: Transformer with Dual Residual Connections").

Two residual streams through one stack of Post-LN layers: the Post-LN stream ``x`` is what the
layers compute (``x <- LN(x + F(x))`` in every sublayer), and a second, Pre-LN-like stream ``r``
adds up the same sublayer outputs without normalising: ``r <- r + F(x)``, starting from the
embedding output. The stack's output is their sum, with one more LayerNorm on the dual stream:

    output = x_L + LN_dual(r_L),    r_L = embedding output + sum over every sublayer of F

as in the authors' fairseq code (microsoft/ResiDual, ``resi_dual/resi_dual_layers.py`` and
``resi_dual/resi_dual.py``, with its defaults ``enc_alpha = dec_alpha = 1`` and
``*_res_input_norm_scale = 1``; the dual-stream LayerNorm has eps 1e-7 there and here). The layers
and their init are fairseq's Post-LN layers; a ResiDual layer also returns the sum of its sublayer
outputs (its increment of ``r``), which the stack's layer loop (see ``layer_loop.py``) adds up.
"""

import functools

from fairseq.models import register_model
from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from .layer_class_model import LayerClassTransformerModel, require_post_ln
from .layer_loop import (LayerLoop, LoopDecoderMixin, LoopEncoderMixin, layer_output, refuse_layer_dropping,
                         with_layer_output)
from .layers import LayerClassDecoder, LayerClassEncoder
from .postln_transformer import postln_defaults
from .sizes import register_size_variants

DUAL_STREAM_LAYER_NORM_EPS = 1e-7  # microsoft/ResiDual's final LayerNorm


class ResiDualLayerMixin:
    """A Post-LN layer that returns ``(fairseq's output..., sum of its sublayer outputs)``."""

    def forward(self, x, *args, **kwargs):
        self._sublayer_outputs = []  # the F of each residual sum of this call, in forward order
        out = super().forward(x, *args, **kwargs)
        increment, self._sublayer_outputs = sum(self._sublayer_outputs), None
        return (*out, increment) if isinstance(out, tuple) else (out, increment)

    def residual_connection(self, x, residual):
        self._sublayer_outputs.append(x)
        return residual + x


class ResiDualEncoderLayer(ResiDualLayerMixin, TransformerEncoderLayerBase):
    pass


class ResiDualDecoderLayer(ResiDualLayerMixin, TransformerDecoderLayerBase):
    pass


class DualStreamMixin:
    """The stack's layer loop: carries ``r`` from layer to layer, returns ``x_L + LN_dual(r_L)``."""

    def init_dual_stream(self, embed_dim):
        self.layers = LayerLoop(self.layers)
        self.dual_stream_layer_norm = LayerNorm(embed_dim, eps=DUAL_STREAM_LAYER_NORM_EPS)

    def layer_loop(self, layers):
        dual_stream = []  # [r] of this forward pass, started by the first layer's step
        for index, layer in enumerate(layers):
            yield functools.partial(self.run_layer, layer, index == len(layers) - 1, dual_stream)

    def run_layer(self, layer, is_last, dual_stream, x, *args, **kwargs):
        if not dual_stream:
            dual_stream.append(x)  # r_0 = the embedding output
        *out, increment = layer(x, *args, **kwargs)
        dual_stream[0] = dual_stream[0] + increment
        out = out[0] if len(out) == 1 else tuple(out)
        if is_last:
            out = with_layer_output(out, layer_output(out) + self.dual_stream_layer_norm(dual_stream[0]))
        return out


class ResiDualEncoder(DualStreamMixin, LoopEncoderMixin, LayerClassEncoder):
    layer_class = ResiDualEncoderLayer

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.init_dual_stream(cfg.encoder.embed_dim)


class ResiDualDecoder(DualStreamMixin, LoopDecoderMixin, LayerClassDecoder):
    layer_class = ResiDualDecoderLayer

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        self.init_dual_stream(cfg.decoder.embed_dim)


@register_model("residual_transformer")
class ResiDualTransformerModel(LayerClassTransformerModel):
    encoder_class = ResiDualEncoder
    decoder_class = ResiDualDecoder

    @classmethod
    def check_args(cls, args):
        require_post_ln(args, "ResiDual")
        refuse_layer_dropping(args, "ResiDual")


register_size_variants("residual_transformer", postln_defaults)
