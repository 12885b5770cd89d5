"""``preln_transformer``: Pre-LN Transformer (Xiong et al. 2020).

LayerNorm at the start of each residual branch, ``x <- x + G(LN(x))``, and a final LayerNorm on the
encoder and decoder outputs: fairseq's ``normalize_before`` semantics, on by default here. Pre-LN's
gradients are well-behaved at initialisation, so it trains without learning-rate warm-up.
"""

from fairseq.models import register_model

from .layer_class_model import LayerClassTransformerModel, require_pre_ln
from .sizes import register_size_variants


@register_model("preln_transformer")
class PreLNTransformerModel(LayerClassTransformerModel):
    """fairseq's own layers; only the defaults differ."""

    @classmethod
    def check_args(cls, args):
        require_pre_ln(args, "Pre-LN")


def preln_defaults(args):
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)


register_size_variants("preln_transformer", preln_defaults)
