"""``preln_transformer``: Pre-LN Transformer (Xiong et al. 2020).

LayerNorm at the start of each residual branch, ``x <- x + G(LN(x))``, and a final LayerNorm on the
encoder and decoder outputs: fairseq's ``normalize_before`` semantics, on by default here. Pre-LN's
gradients are well-behaved at initialisation, so it trains without learning-rate warm-up.
"""

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel

from .layer_class_model import check_depth
from .sizes import register_size_variants


@register_model("preln_transformer")
class PreLNTransformerModel(TransformerModel):
    @classmethod
    def build_model(cls, args, task):
        check_depth(args)
        if getattr(args, "no_decoder_final_norm", False):
            raise ValueError("--no-decoder-final-norm: Pre-LN needs the final decoder LayerNorm")
        return super().build_model(args, task)


def preln_defaults(args):
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)


register_size_variants("preln_transformer", preln_defaults)
