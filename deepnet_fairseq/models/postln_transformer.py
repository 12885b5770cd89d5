"""``postln_transformer``: the original Post-LN Transformer (Vaswani et al. 2017), Table 1's baseline.

Every sublayer computes ``x <- LN(x + G(x))``; no final LayerNorm. This is fairseq's own
``transformer`` with ``--encoder-normalize-before``/``--decoder-normalize-before`` off and refused,
so that the name always means Post-LN; layers, init and checkpoints are fairseq's.
"""

from fairseq.models import register_model

from .layer_class_model import LayerClassTransformerModel, require_post_ln
from .sizes import register_size_variants


@register_model("postln_transformer")
class PostLNTransformerModel(LayerClassTransformerModel):
    @classmethod
    def check_args(cls, args):
        require_post_ln(args, "Post-LN")


def postln_defaults(args):
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", False)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", False)


register_size_variants("postln_transformer", postln_defaults)
