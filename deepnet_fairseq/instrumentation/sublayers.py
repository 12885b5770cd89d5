"""Names for every residual sublayer of a fairseq Transformer, in execution order.

A sublayer is one residual branch: self-attention (``attn``), the decoder's cross-attention
(``cross``) or the feed-forward network (``ffn``), each with the LayerNorm that belongs to it
(after the residual add in Post-LN/DeepNorm, at the branch input in Pre-LN). Any encoder/decoder
whose ``layers`` are fairseq's ``TransformerEncoderLayerBase``/``TransformerDecoderLayerBase`` (or
subclasses, as in this plugin) is covered. Names look like ``enc3_ffn`` or ``dec0_cross``.
"""

from dataclasses import dataclass
from typing import List

from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn


@dataclass
class Sublayer:
    name: str  # e.g. "enc3_ffn"
    branch: List[nn.Module]  # the modules holding the branch's weights
    layer_norm: nn.Module  # the LayerNorm of this sublayer (None if the layer has none)

    def parameters(self):
        for module in self.branch + ([self.layer_norm] if self.layer_norm is not None else []):
            yield from module.parameters()


def unwrap(model):
    """The fairseq model inside DDP / legacy-DDP wrappers."""
    while hasattr(model, "module") and not hasattr(model, "encoder") and not hasattr(model, "decoder"):
        model = model.module
    return model


def _layer_sublayers(prefix, layer):
    if isinstance(layer, TransformerEncoderLayerBase):
        yield Sublayer(f"{prefix}_attn", [layer.self_attn], layer.self_attn_layer_norm)
    elif isinstance(layer, TransformerDecoderLayerBase):
        yield Sublayer(f"{prefix}_attn", [layer.self_attn], layer.self_attn_layer_norm)
        if getattr(layer, "encoder_attn", None) is not None:
            yield Sublayer(f"{prefix}_cross", [layer.encoder_attn], layer.encoder_attn_layer_norm)
    else:
        return
    yield Sublayer(f"{prefix}_ffn", [layer.fc1, layer.fc2], layer.final_layer_norm)


def transformer_sublayers(model) -> List[Sublayer]:
    """Every sublayer of the model's encoder then decoder, bottom to top."""
    model = unwrap(model)
    found = []
    for short, stack in (("enc", getattr(model, "encoder", None)), ("dec", getattr(model, "decoder", None))):
        for index, layer in enumerate(getattr(stack, "layers", None) or []):
            layer = getattr(layer, "_checkpoint_wrapped_module", layer)
            found.extend(_layer_sublayers(f"{short}{index}", layer))
    return found
