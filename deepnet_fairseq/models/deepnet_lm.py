"""DeepNorm for decoder-only and encoder-only models (Wang et al. 2022, "DeepNet", Fig. 2).

- ``deepnet_transformer_lm``: fairseq's ``transformer_lm`` (``--task language_modeling``) with
  ``DeepNormDecoderLayer``: ``x <- LN(alpha * x + G(x))``, alpha = (2M)^(1/4), init gain
  beta = (8M)^(-1/4) for the FFN and attention value/output projections.
- ``deepnet_roberta``: fairseq's ``roberta`` (``--task masked_lm``) with ``DeepNormEncoderLayer``:
  alpha = (2N)^(1/4), beta = (8N)^(-1/4). RoBERTa first re-initialises every Linear with BERT's
  N(0, 0.02); DeepNorm's init is then applied again on top, so the layers keep DeepNorm's scale.

The constants come from ``deepnorm_constants(0, M)`` / ``deepnorm_constants(N, 0)``: the config
subclasses below only say which stack exists; layers and init are the translation model's.
Both keep the ``--deepnorm-{decoder,encoder}-{alpha,beta}`` overrides.
"""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import RobertaEncoder, RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig, base_lm_architecture
from fairseq.utils import safe_getattr, safe_hasattr

from .compile_layers import MODES as COMPILE_MODES
from .compile_layers import add_compile_args
from .deepnet_transformer import DeepNetConfig, DeepNetDecoder, DeepNetEncoder, deepnorm_init_
from .deepnorm import DeepNormConstants, deepnorm_constants


class DecoderOnlyDeepNetConfig(DeepNetConfig):
    def deepnorm(self) -> DeepNormConstants:
        return deepnorm_constants(0, self.decoder.layers, decoder_alpha=self.deepnorm_decoder_alpha,
                                  decoder_beta=self.deepnorm_decoder_beta)


class EncoderOnlyDeepNetConfig(DeepNetConfig):
    def deepnorm(self) -> DeepNormConstants:
        return deepnorm_constants(self.encoder.layers, 0, encoder_alpha=self.deepnorm_encoder_alpha,
                                  encoder_beta=self.deepnorm_encoder_beta)


def refuse_pre_ln(args, option):
    if safe_getattr(args, option, False):
        raise ValueError(f"--{option.replace('_', '-')}: DeepNorm is a Post-LN placement")


@dataclass
class DeepNetLanguageModelConfig(TransformerLanguageModelConfig):
    deepnorm_decoder_alpha: Optional[float] = field(
        default=None, metadata={"help": "override DeepNorm's alpha (default: (2M)^(1/4))"})
    deepnorm_decoder_beta: Optional[float] = field(
        default=None, metadata={"help": "override DeepNorm's init gain beta (default: (8M)^(-1/4))"})
    compile_layers: bool = field(
        default=False, metadata={"help": "compile each decoder layer's training forward+backward with torch.compile"})
    compile_layers_mode: ChoiceEnum(COMPILE_MODES) = field(
        default="default", metadata={"help": "torch.compile mode for --compile-layers"})


@register_model("deepnet_transformer_lm", dataclass=DeepNetLanguageModelConfig)
class DeepNetLanguageModel(TransformerLanguageModel):
    """Decoder-only DeepNet; the plain token-embedding path of ``transformer_lm``."""

    @classmethod
    def build_model(cls, args, task):
        refuse_pre_ln(args, "decoder_normalize_before")
        for option in ("character_embeddings", "adaptive_input", "decoder_layers_to_keep"):
            if safe_getattr(args, option, None):
                raise ValueError(f"--{option.replace('_', '-')} is not supported by deepnet_transformer_lm")
        if safe_getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = safe_getattr(args, "tokens_per_sample", 1024)
        cfg = DecoderOnlyDeepNetConfig.from_namespace(args)
        # fairseq-train hands a DictConfig here, whose fields outside DeepNetConfig from_namespace drops
        cfg.compile_layers = bool(safe_getattr(args, "compile_layers", False))
        cfg.compile_layers_mode = str(safe_getattr(args, "compile_layers_mode", None) or "default")
        embed_tokens = cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)
        return cls(DeepNetDecoder(cfg, task.target_dictionary, embed_tokens, no_encoder_attn=True))


class DeepNetRobertaEncoder(RobertaEncoder):
    def build_encoder(self, args, dictionary, embed_tokens):
        return DeepNetEncoder(EncoderOnlyDeepNetConfig.from_namespace(args), dictionary, embed_tokens)


@register_model("deepnet_roberta")
class DeepNetRobertaModel(RobertaModel):
    """Encoder-only DeepNet (masked LM): RoBERTa with DeepNorm encoder layers."""

    def __init__(self, args, encoder):
        super().__init__(args, encoder)  # applies BERT's init to every Linear
        beta = EncoderOnlyDeepNetConfig.from_namespace(args).deepnorm().encoder_beta
        for layer in encoder.sentence_encoder.layers:
            deepnorm_init_([layer.self_attn], [layer.fc1, layer.fc2], beta)

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        parser.add_argument("--deepnorm-encoder-alpha", type=float, help="override DeepNorm's alpha ((2N)^(1/4))")
        parser.add_argument("--deepnorm-encoder-beta", type=float, help="override DeepNorm's beta ((8N)^(-1/4))")
        add_compile_args(parser)

    @classmethod
    def build_model(cls, args, task):
        roberta_base_architecture(args)
        refuse_pre_ln(args, "encoder_normalize_before")
        if not safe_hasattr(args, "max_positions"):
            args.max_positions = safe_getattr(args, "tokens_per_sample", None) or task.max_positions()
        return cls(args, DeepNetRobertaEncoder(args, task.source_dictionary))


@register_model_architecture("deepnet_transformer_lm", "deepnet_transformer_lm_gpt")
def deepnet_transformer_lm_gpt(args):
    """GPT-1 shape (768 d, 12 heads, 3072 FFN, GELU), Post-LN with DeepNorm."""
    args.decoder_embed_dim = safe_getattr(args, "decoder_embed_dim", 768)
    args.decoder_ffn_embed_dim = safe_getattr(args, "decoder_ffn_embed_dim", 3072)
    args.decoder_attention_heads = safe_getattr(args, "decoder_attention_heads", 12)
    args.activation_fn = safe_getattr(args, "activation_fn", "gelu")
    base_lm_architecture(args)


@register_model_architecture("deepnet_roberta", "deepnet_roberta")
def deepnet_roberta_architecture(args):
    roberta_base_architecture(args)
