"""Shared pieces of the plugin's architectures: a translation model built from layer classes, the
option checks they share, and two small modules several baselines need (a LayerNorm-then-Linear,
and LayerNorm removal).

DeepNet, Pre-LN and every baseline is ``LayerClassTransformerModel`` with its own ``encoder_class``/``decoder_class``
(``LayerClassEncoder``/``LayerClassDecoder`` subclasses whose ``layer_class`` overrides fairseq's
``residual_connection`` / ``build_*`` hooks or re-initialises weights in ``__init__``).
"""

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.modules import LayerNorm
from torch import nn

from .compile_layers import add_compile_args, check_compile_args
from .layers import LayerClassDecoder, LayerClassEncoder, add_residual_drop_args, check_residual_drop_args


def check_depth(args):
    """Depth 0 or negative is a configuration error, named by its option."""
    for option in ("encoder_layers", "decoder_layers"):
        value = getattr(args, option, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"--{option.replace('_', '-')} must be a positive integer, got {value!r}")


def as_config(config_class, cfg):
    """``cfg`` as a ``config_class`` (a TransformerConfig subclass) with the same values.

    fairseq's legacy model hands its builders an already structured TransformerConfig, which
    ``from_namespace`` cannot convert; an argparse Namespace goes through ``from_namespace``.
    """
    if isinstance(cfg, config_class):
        return cfg
    if isinstance(cfg, TransformerConfig):
        config = config_class()
        vars(config).update(vars(cfg))
        return config
    return config_class.from_namespace(cfg)


class LayerClassTransformerModel(TransformerModel):
    """fairseq's legacy ``transformer`` with the encoder/decoder classes named by the subclass.

    ``config_class``'s fields are the command-line options (a subclass adds its own fields there).
    """

    config_class = TransformerConfig
    encoder_class = LayerClassEncoder
    decoder_class = LayerClassDecoder

    @classmethod
    def add_args(cls, parser):
        gen_parser_from_dataclass(parser, cls.config_class(), delete_default=True, with_prefix="")
        add_compile_args(parser)  # --compile-layers for every architecture built on this class
        add_residual_drop_args(parser)

    @classmethod
    def build_model(cls, args, task):
        check_depth(args)
        check_compile_args(args)
        check_residual_drop_args(args)
        cls.check_args(args)
        return super().build_model(args, task)

    @classmethod
    def check_args(cls, args):
        """Reject options that contradict the method (each subclass names its own)."""

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return cls.encoder_class(as_config(cls.config_class, cfg), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        cfg = as_config(cls.config_class, cfg)
        return cls.decoder_class(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


def require_post_ln(args, method):
    """Methods defined on the Post-LN placement refuse ``--*-normalize-before``."""
    for option in ("encoder_normalize_before", "decoder_normalize_before"):
        if getattr(args, option, False):
            raise ValueError(f"--{option.replace('_', '-')}: {method} is a Post-LN method")


def require_pre_ln(args, method):
    """Methods defined on the Pre-LN placement keep ``--*-normalize-before`` and the final decoder LayerNorm."""
    if not (getattr(args, "encoder_normalize_before", False) and getattr(args, "decoder_normalize_before", False)):
        raise ValueError(f"--encoder/--decoder-normalize-before: {method} is a Pre-LN method, they must stay on")
    if getattr(args, "no_decoder_final_norm", False):
        raise ValueError(f"--no-decoder-final-norm: {method} needs the final decoder LayerNorm")


def require_no_layer_norm(args, method):
    """Methods without any LayerNorm refuse the options that would add one."""
    for option in ("encoder_normalize_before", "decoder_normalize_before", "layernorm_embedding"):
        if getattr(args, option, False):
            raise ValueError(f"--{option.replace('_', '-')}: {method} has no LayerNorm")


class NormedLinear(nn.Linear):
    """``Linear(LN(x))``: a LayerNorm over the input features, then the projection.

    Keeps ``weight``/``bias`` where fairseq's init and pruning code expect them.
    """

    def __init__(self, in_features, out_features, bias=True):
        super().__init__(in_features, out_features, bias=bias)
        self.input_layer_norm = LayerNorm(in_features)

    def forward(self, x):
        return super().forward(self.input_layer_norm(x))


LAYER_NORM_NAMES = ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")


def remove_layer_norms(layer):
    """Replace a fairseq layer's LayerNorms by identities (methods without normalisation)."""
    for name in LAYER_NORM_NAMES:
        if getattr(layer, name, None) is not None:
            setattr(layer, name, nn.Identity())
