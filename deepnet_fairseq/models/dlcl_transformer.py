"""``dlcl_transformer``: Dynamic Linear Combination of Layers (Wang, Li, Xiao, Zhu, Li, Wong and Chao
2019, "Learning Deep Transformer Models for Machine Translation", ACL).

A Pre-LN Transformer (DeepNet's Table 1 lists DLCL with the Pre-LN methods; the authors' deep
models are Pre-LN) in which layer ``l`` does not read the previous layer's output but a learned
linear combination of the embedding and *all* earlier layers' outputs, normalised:

    h_0 = embedding output,   h_k = LN_k(y_k)   (y_k: output of layer k, k = 1..L)
    input of layer l+1 = sum_{k=0..l} W[l, k] h_k
    stack output       = LN_final(sum_{k=0..L} W[L, k] h_k)

``W`` is a learned lower-triangular ``(L+1) x (L+1)`` matrix of scalars whose row ``l`` starts at
``1/(l+1)`` (an average); each stack (encoder, decoder) has its own ``W`` and ``LN_k``. This is the
authors' default (wangqiangneu/dlcl, ``fairseq/modules/dlcl.py::DynamicLinearCombination`` with
``weight_type=scalar``, ``init_value=avg``, learnable, no LayerNorm on the embedding, no history
dropout, the whole history; ``fairseq/modules/layer_history.py::LearnableDenseLayerHistory``).

The combination sits in fairseq's layer loop (see ``layer_loop.py``); the layers are fairseq's
Pre-LN layers, initialised as the authors' fairseq version initialised them (its ``Linear`` in
``fairseq/models/transformer.py``: Xavier FFN with zero biases; fused q/k/v with zero biases, see
``admin_transformer.fused_qkv_fairseq_init_``).
"""

import functools

import torch
from fairseq.models import register_model
from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from .admin_transformer import fused_qkv_fairseq_init_
from .layer_class_model import LayerClassTransformerModel, require_pre_ln
from .layer_loop import (LayerLoop, LoopDecoderMixin, LoopEncoderMixin, layer_output, refuse_layer_dropping,
                         with_layer_output)
from .layers import LayerClassDecoder, LayerClassEncoder
from .preln_transformer import preln_defaults
from .sizes import register_size_variants


class LayerCombination(nn.Module):
    """DLCL's weights ``W`` and LayerNorms ``LN_1..LN_L`` for one stack of ``num_layers`` layers."""

    def __init__(self, num_layers, embed_dim):
        super().__init__()
        average = torch.ones(num_layers + 1, num_layers + 1).tril()
        self.weight = nn.Parameter(average / average.sum(dim=1, keepdim=True))
        self.layer_norms = nn.ModuleList(LayerNorm(embed_dim) for _ in range(num_layers))

    def combine(self, history):
        """``sum_k W[l, k] h_k`` over the history ``h_0..h_l``."""
        weights = self.weight[len(history) - 1, : len(history)]
        return sum(w * h for w, h in zip(weights, history))

    def record(self, history, y):
        """Append ``h_0 = y`` (the embedding output) or ``h_k = LN_k(y_k)``."""
        history.append(self.layer_norms[len(history) - 1](y) if history else y)

    def layer_loop(self, layers):
        history = []  # h_0, h_1, ... of this forward pass
        for index, layer in enumerate(layers):
            yield functools.partial(self.run_layer, layer, index == len(layers) - 1, history)

    def run_layer(self, layer, is_last, history, x, *args, **kwargs):
        """Record ``x`` (the embedding, or the previous layer's output) and feed ``layer`` the combination;
        the last layer's step returns the combination of all ``L+1`` outputs in place of its own."""
        self.record(history, x)
        out = layer(self.combine(history), *args, **kwargs)
        if is_last:
            self.record(history, layer_output(out))
            out = with_layer_output(out, self.combine(history))
        return out


class DLCLEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        fused_qkv_fairseq_init_(self)


class DLCLDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        fused_qkv_fairseq_init_(self)


class DLCLEncoder(LoopEncoderMixin, LayerClassEncoder):
    layer_class = DLCLEncoderLayer

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.layers = LayerLoop(self.layers)
        self.layer_combination = LayerCombination(len(self.layers), cfg.encoder.embed_dim)

    def layer_loop(self, layers):
        return self.layer_combination.layer_loop(layers)


class DLCLDecoder(LoopDecoderMixin, LayerClassDecoder):
    layer_class = DLCLDecoderLayer

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        self.layers = LayerLoop(self.layers)
        self.layer_combination = LayerCombination(len(self.layers), cfg.decoder.embed_dim)

    def layer_loop(self, layers):
        return self.layer_combination.layer_loop(layers)


@register_model("dlcl_transformer")
class DLCLTransformerModel(LayerClassTransformerModel):
    encoder_class = DLCLEncoder
    decoder_class = DLCLDecoder

    @classmethod
    def check_args(cls, args):
        require_pre_ln(args, "DLCL")
        refuse_layer_dropping(args, "DLCL")


register_size_variants("dlcl_transformer", preln_defaults)
