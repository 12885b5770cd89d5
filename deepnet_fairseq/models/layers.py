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


def add_residual_drop_args(parser):
    parser.add_argument("--encoder-drop-residual-layer", type=int, default=None, metavar="K",
                        help="no residual connection around the self-attention of encoder layer K (0-based; Liu et "
                             "al. 2021, for zero-shot translation; docs/setups.md); default: none")


def check_residual_drop_args(args):
    layer = getattr(args, "encoder_drop_residual_layer", None)
    if layer is not None and not 0 <= layer < args.encoder_layers:
        raise ValueError(f"--encoder-drop-residual-layer {layer}: the encoder has layers 0 to {args.encoder_layers - 1}")


class SelfAttentionResidualDropped:
    """A layer whose self-attention sublayer has no residual connection (Liu et al. 2021, "Improving
    Zero-Shot Translation by Disentangling Positional Information": in one middle encoder layer, so that the
    encoder's output is less tied to source positions and so to the source language). fairseq's layer calls
    ``residual_connection`` twice a forward, self-attention first; without the residual, DeepNorm's
    ``LN(alpha x + G(x))`` becomes ``LN(G(x))``, Post-LN's ``LN(x + G(x))`` too, Pre-LN's ``x + G(LN(x))`` is
    ``G(LN(x))``. No parameter changes, so checkpoints and exact resume are unaffected."""

    def forward(self, *args, **kwargs):
        self.residual_calls = 0
        return super().forward(*args, **kwargs)

    def residual_connection(self, x, residual):
        self.residual_calls += 1
        return x if self.residual_calls == 1 else super().residual_connection(x, residual)


class LayerClassEncoder(TransformerEncoderBase):
    """fairseq's encoder, built from ``layer_class`` instead of ``TransformerEncoderLayerBase``."""

    layer_class = TransformerEncoderLayerBase

    def build_encoder_layer(self, cfg):  # fairseq builds the layers in order; count them for their index
        index = self.layers_built = getattr(self, "layers_built", -1) + 1
        layer_class = self.layer_class
        if index == getattr(cfg, "encoder_drop_residual_layer", None):
            layer_class = type(f"{layer_class.__name__}WithoutSelfAttnResidual",
                               (SelfAttentionResidualDropped, layer_class), {})
        return wrap_layer(self.new_layer(layer_class, cfg, index), cfg)

    def new_layer(self, layer_class, cfg, index):
        return layer_class(cfg, return_fc=self.return_fc)


class LayerClassDecoder(TransformerDecoderBase):
    """fairseq's decoder, built from ``layer_class`` instead of ``TransformerDecoderLayerBase``."""

    layer_class = TransformerDecoderLayerBase

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        index = self.layers_built = getattr(self, "layers_built", -1) + 1
        return wrap_layer(self.new_layer(cfg, no_encoder_attn, index), cfg)

    def new_layer(self, cfg, no_encoder_attn, index):
        return self.layer_class(cfg, no_encoder_attn)
