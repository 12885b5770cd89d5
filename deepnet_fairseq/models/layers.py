"""Shared plumbing for encoder/decoder variants that differ only in their layer class."""

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from .compile_layers import compile_layer


def wrap_layer(layer, cfg):
    """``--compile-layers`` (innermost), then activation checkpointing and FSDP wrapping, exactly as
    fairseq's ``build_*_layer`` apply them."""
    if getattr(cfg, "compile_layers", False):
        layer = compile_layer(layer, mode=getattr(cfg, "compile_layers_mode", None) or "default",
                              checkpointed=bool(cfg.checkpoint_activations))
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # when checkpointing, FSDP always wraps the checkpointed layer, whatever its size
    return fsdp_wrap(layer, min_num_params=0 if cfg.checkpoint_activations else cfg.min_params_to_wrap)


class LayerClassEncoder(TransformerEncoderBase):
    """fairseq's encoder, built from ``layer_class`` instead of ``TransformerEncoderLayerBase``."""

    layer_class = TransformerEncoderLayerBase

    def build_encoder_layer(self, cfg):
        return wrap_layer(self.layer_class(cfg, return_fc=self.return_fc), cfg)


class LayerClassDecoder(TransformerDecoderBase):
    """fairseq's decoder, built from ``layer_class`` instead of ``TransformerDecoderLayerBase``."""

    layer_class = TransformerDecoderLayerBase

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(self.layer_class(cfg, no_encoder_attn), cfg)
