"""``deepnet_transformer``: fairseq's Transformer with DeepNorm (Wang et al. 2022).

Every sublayer computes ``x <- LN(alpha * x + G(x))`` (Post-LN placement, no final LayerNorm):
only ``residual_connection`` changes. At build, FFN ``fc1``/``fc2`` and the attention ``v_proj``/
``out_proj`` (self- and cross-attention) get ``xavier_normal_(w, gain=beta)`` and ``q_proj``/
``k_proj`` get ``xavier_normal_(w, gain=1)``, as in the paper's pseudo-code. Biases and embeddings
keep fairseq's initialisation: the paper says nothing about them. The decoder's cross-attention uses
the decoder's beta.

``--deepnorm-init`` names another init of ``deepnorm.DEEPNORM_INITS``, e.g. ``torchscale``, Microsoft's
torchscale 0.3.0 (``torchscale_init_``; docs/torchscale.md), and ``--deepnorm-gains GROUP[i]=GAIN,...``
sets any sublayer group's (or one layer's) gain, for ablations (docs/diagnostics.md).

Each layer keeps its alpha as a (persistent) buffer: checkpoints record the constants they were
trained with, and a DeepNet checkpoint cannot load silently into a Post-LN model of the same shape.
"""

import logging
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
import torch
from torch import nn

from .deepnorm import DEEPNORM_INITS, DeepNormConstants, DeepNormInit, deepnorm_constants, parse_gains, sublayer_gain
from .layer_class_model import LayerClassTransformerModel, require_post_ln
from .layers import LayerClassDecoder, LayerClassEncoder
from .sizes import register_size_variants

logger = logging.getLogger(__name__)


@dataclass
class DeepNetConfig(TransformerConfig):
    deepnorm_encoder_alpha: Optional[float] = field(
        default=None, metadata={"help": "override the encoder's DeepNorm alpha (default: the paper's formula)"}
    )
    deepnorm_encoder_beta: Optional[float] = field(
        default=None, metadata={"help": "override the encoder's DeepNorm init gain beta (default: the paper's formula)"}
    )
    deepnorm_decoder_alpha: Optional[float] = field(
        default=None, metadata={"help": "override the decoder's DeepNorm alpha (default: the paper's formula)"}
    )
    deepnorm_decoder_beta: Optional[float] = field(
        default=None, metadata={"help": "override the decoder's DeepNorm init gain beta (default: the paper's formula)"}
    )
    deepnorm_init: ChoiceEnum(list(DEEPNORM_INITS)) = field(
        default="paper", metadata={"help": "DeepNorm's initialisation: " + ", ".join(
            f"'{init.name}' ({init.description})" for init in DEEPNORM_INITS.values())},
    )
    deepnorm_gains: Optional[str] = field(
        default=None,
        metadata={"help": "ablation: Xavier gains instead of beta for the value/output or FFN weights of sublayer "
                          "groups, comma-separated GROUP=GAIN (every layer) or GROUP[i]=GAIN (layer i, -1 = last), "
                          "GROUP one of encoder_self_attn, encoder_ffn, decoder_self_attn, decoder_cross_attn, "
                          "decoder_ffn (default beta) or an attention's query/key, encoder_self_attn_qk, "
                          "decoder_self_attn_qk, decoder_cross_attn_qk (default 1); e.g. decoder_cross_attn[-1]=1"},
    )

    def deepnorm(self) -> DeepNormConstants:
        """The effective constants: the paper's formulas for this depth, with any overrides."""
        return deepnorm_constants(self.encoder.layers, self.decoder.layers, init=str(self.deepnorm_init),
                                  encoder_alpha=self.deepnorm_encoder_alpha, encoder_beta=self.deepnorm_encoder_beta,
                                  decoder_alpha=self.deepnorm_decoder_alpha, decoder_beta=self.deepnorm_decoder_beta)

    @property
    def named_init(self) -> DeepNormInit:
        return DEEPNORM_INITS[str(self.deepnorm_init)]

    @cached_property
    def sublayer_gains(self) -> dict:
        """The init's gains with ``--deepnorm-gains`` over them, parsed once per config (at model build)."""
        return {**self.named_init.gains, **parse_gains(self.deepnorm_gains)}

    def init_gain(self, group: str, layer: int) -> float:
        """The Xavier gain of ``group``'s scaled weights in layer ``layer`` (0-based): the stack's beta, unless
        the init or ``--deepnorm-gains`` sets another."""
        stack = group.split("_")[0]
        default = 1.0 if group.endswith("_qk") else getattr(self.deepnorm(), f"{stack}_beta")  # query/key: gain 1
        return sublayer_gain(self.sublayer_gains, group, layer, getattr(self, stack).layers, default)


def deepnorm_init_(attentions, ffn_linears, beta, qk_gain=1.0):
    """The paper's init: xavier_normal_ with gain beta for FFN and value/output, gain 1 for query/key."""
    for attn in attentions:
        if attn is None:
            continue
        nn.init.xavier_normal_(attn.q_proj.weight, gain=qk_gain)
        nn.init.xavier_normal_(attn.k_proj.weight, gain=qk_gain)
        nn.init.xavier_normal_(attn.v_proj.weight, gain=beta)
        nn.init.xavier_normal_(attn.out_proj.weight, gain=beta)
    for linear in ffn_linears:
        nn.init.xavier_normal_(linear.weight, gain=beta)


@torch.no_grad()
def torchscale_init_(attentions, ffn_linears, beta, qk_gain=1.0):
    """torchscale 0.3.0's init: PyTorch's default Linear init (weights and biases U(+-1/sqrt(fan_in))) for
    every projection, then value/output and FFN weights and biases times beta; query/key stay unscaled."""
    scaled = list(ffn_linears)
    for attn in attentions:
        if attn is None:
            continue
        attn.q_proj.reset_parameters()
        attn.k_proj.reset_parameters()
        attn.q_proj.weight.mul_(qk_gain)
        attn.k_proj.weight.mul_(qk_gain)
        scaled += [attn.v_proj, attn.out_proj]
    for linear in scaled:
        linear.reset_parameters()
        linear.weight.mul_(beta)
        linear.bias.mul_(beta)


class DeepNormEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False, layer_index=0):
        super().__init__(cfg, return_fc=return_fc)
        self.register_buffer("deepnorm_alpha", torch.tensor(cfg.deepnorm().encoder_alpha))
        init_ = torchscale_init_ if cfg.named_init.pytorch_default_linear else deepnorm_init_
        init_([self.self_attn], [], cfg.init_gain("encoder_self_attn", layer_index),
              cfg.init_gain("encoder_self_attn_qk", layer_index))
        init_([], [self.fc1, self.fc2], cfg.init_gain("encoder_ffn", layer_index))

    def residual_connection(self, x, residual):
        return residual * self.deepnorm_alpha + x


class DeepNormDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False, layer_index=0):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        self.register_buffer("deepnorm_alpha", torch.tensor(cfg.deepnorm().decoder_alpha))
        init_ = torchscale_init_ if cfg.named_init.pytorch_default_linear else deepnorm_init_
        init_([self.self_attn], [], cfg.init_gain("decoder_self_attn", layer_index),
              cfg.init_gain("decoder_self_attn_qk", layer_index))
        init_([self.encoder_attn], [], cfg.init_gain("decoder_cross_attn", layer_index),
              cfg.init_gain("decoder_cross_attn_qk", layer_index))
        init_([], [self.fc1, self.fc2], cfg.init_gain("decoder_ffn", layer_index))

    def residual_connection(self, x, residual):
        return residual * self.deepnorm_alpha + x


class DeepNetEncoder(LayerClassEncoder):
    layer_class = DeepNormEncoderLayer

    def new_layer(self, layer_class, cfg, index):  # the init needs each layer's index
        return layer_class(cfg, return_fc=self.return_fc, layer_index=index)


class DeepNetDecoder(LayerClassDecoder):
    layer_class = DeepNormDecoderLayer

    def new_layer(self, cfg, no_encoder_attn, index):
        return self.layer_class(cfg, no_encoder_attn, layer_index=index)


@register_model("deepnet_transformer")
class DeepNetTransformerModel(LayerClassTransformerModel):
    """fairseq's ``transformer`` with DeepNorm residuals and init; same options plus ``--deepnorm-*``
    (``--deepnorm-init``, a name in ``deepnorm.DEEPNORM_INITS``, chooses the initialisation)."""

    config_class = DeepNetConfig
    encoder_class = DeepNetEncoder
    decoder_class = DeepNetDecoder

    @classmethod
    def check_args(cls, args):
        require_post_ln(args, "DeepNorm")
        cfg = cls.config_class.from_namespace(args)
        constants = cfg.deepnorm()  # validates the overrides
        parse_gains(cfg.deepnorm_gains)  # and the ablation's gains
        logger.info(f"{constants.describe()} ({cfg.deepnorm_init} init"
                    + (f"; gains {cfg.deepnorm_gains}" if cfg.deepnorm_gains else "") + ")")


def deepnet_defaults(args):
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", False)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", False)


register_size_variants("deepnet_transformer", deepnet_defaults)
