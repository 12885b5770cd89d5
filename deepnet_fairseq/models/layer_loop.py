"""Methods that change fairseq's layer loop itself (DLCL, ResiDual), without copying its forward pass.

fairseq's encoder and decoder run ``for layer in self.layers: x = layer(x, ...)`` inside their whole
forward passes (``TransformerEncoderBase.forward_scriptable``, ``TransformerDecoderBase.
extract_features_scriptable``), which no layer, residual or build hook reaches. ``LayerLoop`` is the
stack's ``layers`` list; while the stack runs its forward pass (``LoopEncoderMixin`` /
``LoopDecoderMixin`` override just those two methods, to enter ``layers.looped_by``), iterating it
yields what the stack's ``layer_loop(layers)`` yields instead of the layers: one callable per layer,
called exactly as fairseq calls the layer, with the state of one pass kept in that generator. Anywhere
else (state dicts, diagnostics, ``named_modules``) it is an ordinary ``ModuleList`` of the layers.
"""

from contextlib import contextmanager

from torch import nn


class LayerLoop(nn.ModuleList):
    """fairseq's ``layers``, whose iteration the stack takes over during its forward pass."""

    def __init__(self, layers):
        super().__init__(layers)
        self.loop = None  # the stack's ``layer_loop`` while the stack runs, else None

    @contextmanager
    def looped_by(self, loop):
        self.loop = loop
        try:
            yield
        finally:
            self.loop = None

    def __iter__(self):
        layers = super().__iter__()
        return layers if self.loop is None else iter(self.loop(list(layers)))


def layer_output(out):
    """The hidden states in what a fairseq layer returns (a tensor, or a tuple starting with it)."""
    return out[0] if isinstance(out, tuple) else out


def with_layer_output(out, x):
    """``out`` with its hidden states replaced by ``x``."""
    return (x,) + tuple(out[1:]) if isinstance(out, tuple) else x


class LoopEncoderMixin:
    """For a ``TransformerEncoderBase`` whose ``layers`` is a ``LayerLoop`` and which defines ``layer_loop``."""

    def forward_scriptable(self, *args, **kwargs):
        with self.layers.looped_by(self.layer_loop):
            return super().forward_scriptable(*args, **kwargs)


class LoopDecoderMixin:
    """For a ``TransformerDecoderBase`` whose ``layers`` is a ``LayerLoop`` and which defines ``layer_loop``."""

    def extract_features_scriptable(self, *args, **kwargs):
        with self.layers.looped_by(self.layer_loop):
            return super().extract_features_scriptable(*args, **kwargs)


def refuse_layer_dropping(args, method):
    """LayerDrop and layer pruning replace fairseq's layer list; these methods need theirs."""
    for option in ("encoder_layerdrop", "decoder_layerdrop"):
        if getattr(args, option, 0):
            raise ValueError(f"--{option.replace('_', '-')}: {method} combines every layer's output, "
                             "LayerDrop is not supported")
    for option in ("encoder_layers_to_keep", "decoder_layers_to_keep"):
        if getattr(args, option, None):
            raise ValueError(f"--{option.replace('_', '-')}: not supported by {method}")
