"""``b2t_transformer``: Post-LN with the B2T (bottom-to-top) connection (Takase, Kiyono, Kobayashi
and Suzuki 2023, "B2T Connection: Serving Stability and Performance in Deep Transformers",
Findings of ACL).

Post-LN's LayerNorms on the residual path make gradients vanish in deep stacks. B2T adds one
extra residual per layer, from the layer's input straight to its last LayerNorm:

    encoder:  y = LN(x + Attn(x));             x' = LN(y + FFN(y) + x)
    decoder:  y = LN(x + SelfAttn(x));  z = LN(y + CrossAttn(y));  x' = LN(z + FFN(z) + x)

Only ``residual_connection`` changes: the layer remembers its input and adds it in the last
residual sum (the FFN's). Applied in every layer, as in the authors' code, which also rescales
every weight matrix of a layer (not LayerNorms, not biases) by ``L^(-1/2)`` at init for deep
stacks (L = that stack's depth); so does this plugin.
"""

from fairseq.models import register_model
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from .layer_class_model import LayerClassTransformerModel, require_post_ln
from .layers import LayerClassDecoder, LayerClassEncoder
from .postln_transformer import postln_defaults
from .sizes import register_size_variants


def b2t_rescale_init_(layer, depth):
    """The authors' init for deep B2T stacks: weights (not LayerNorms) times depth^(-1/2)."""
    for name, param in layer.named_parameters():
        if name.endswith("weight") and "layer_norm" not in name:
            param.data.mul_(depth ** -0.5)


class B2TLayerMixin:
    def residual_sums(self, *args, **kwargs):
        return 2

    def forward(self, x, *args, **kwargs):
        sums = self.residual_sums(*args, **kwargs)
        self._adds_layer_input = iter([False] * (sums - 1) + [True])
        self._layer_input = x
        try:
            return super().forward(x, *args, **kwargs)
        finally:
            self._layer_input = None

    def residual_connection(self, x, residual):
        out = residual + x
        if next(self._adds_layer_input):
            out = out + self._layer_input
        return out


class B2TEncoderLayer(B2TLayerMixin, TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        b2t_rescale_init_(self, cfg.encoder.layers)


class B2TDecoderLayer(B2TLayerMixin, TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        b2t_rescale_init_(self, cfg.decoder.layers)

    def residual_sums(self, encoder_out=None, *args, **kwargs):
        return 3 if self.encoder_attn is not None and encoder_out is not None else 2


class B2TEncoder(LayerClassEncoder):
    layer_class = B2TEncoderLayer


class B2TDecoder(LayerClassDecoder):
    layer_class = B2TDecoderLayer


@register_model("b2t_transformer")
class B2TTransformerModel(LayerClassTransformerModel):
    encoder_class = B2TEncoder
    decoder_class = B2TDecoder

    @classmethod
    def check_args(cls, args):
        require_post_ln(args, "B2T")


register_size_variants("b2t_transformer", postln_defaults)
