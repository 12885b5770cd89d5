"""``admin_transformer``: Adaptive Model Initialization (Liu, Liu, Gao, Chen and Han 2020,
"Understanding the Difficulty of Training Transformers", EMNLP).

Post-LN with a learnable per-dimension residual weight in every sublayer ``i``:

    x_i = LN(x_{i-1} * omega_i + F_i(x_{i-1}))

``omega_i`` is set once, before training, from a profiling forward pass so that no sublayer's
output dominates what the earlier ones accumulated; with a running ratio ``r`` (1 at the start of
each stack), sublayer by sublayer in forward order:

    omega_i = r;   r <- sqrt(Var[x_{i-1} * omega_i] + Var[F_i(x_{i-1})])

(as the authors' reference code computes it; ``omega_i^2 ~ 1 + sum_{j<i} Var[F_j]``). The
official code profiles a real batch and passes the values through a file; here the profiling pass
runs inside ``build_model`` on a probe batch of random dictionary tokens (seeded by ``--seed``,
training mode, global RNG untouched), so no file and no extra run are needed. Loading a
checkpoint re-profiles, then the saved ``omega`` values replace the profiled ones.

Weights start as in the reference code (LiyuanLucasLiu/Transformer-Clinic,
``fairseq/fairseq/modules/transformer_layer.py`` and ``multihead_attention.py``), see
``fused_qkv_fairseq_init_``.
"""

import math
from dataclasses import dataclass, field

import torch
from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from .layer_class_model import LayerClassTransformerModel, require_post_ln
from .layers import LayerClassDecoder, LayerClassEncoder
from .postln_transformer import postln_defaults
from .sizes import register_size_variants


@dataclass
class AdminConfig(TransformerConfig):
    admin_probe_sentences: int = field(default=16, metadata={"help": "Admin profiling: sentences in the probe batch"})
    admin_probe_length: int = field(default=32, metadata={"help": "Admin profiling: tokens per probe sentence"})


def fused_qkv_fairseq_init_(layer):
    """The layer init of the fairseq versions with a fused q/k/v projection (before 0.9.1), which
    Transformer-Clinic (Admin) and wangqiangneu/dlcl (DLCL) run, where fairseq 0.12 differs: FFN
    matrices Xavier-uniform with zero biases (their ``Linear``; 0.12 uses torch's ``nn.Linear``
    default) and zero q/k/v biases (their ``in_proj_bias``). The q/k/v weights need nothing: 0.12's
    Xavier with gain ``1/sqrt(2)`` on each ``[d, d]`` has the distribution of Xavier on the fused
    ``[3d, d]``; ``out_proj`` is Xavier with a zero bias in both."""
    for linear in (layer.fc1, layer.fc2):
        nn.init.xavier_uniform_(linear.weight)
        nn.init.zeros_(linear.bias)
    for attn in (layer.self_attn, getattr(layer, "encoder_attn", None)):
        if attn is not None:
            for linear in (attn.q_proj, attn.k_proj, attn.v_proj):
                nn.init.zeros_(linear.bias)


class AdminProfile:
    """The running ratio of one stack during the profiling pass."""

    def __init__(self):
        self.ratio = 1.0


class AdminLayerMixin:
    """``residual * omega + x``, with one ``omega`` per sublayer, taken in forward order."""

    def init_admin(self, sublayers):
        fused_qkv_fairseq_init_(self)
        self.admin_sublayers = tuple(sublayers)  # forward order (a ParameterDict would sort them)
        for name in sublayers:
            self.register_parameter(f"admin_omega_{name}", nn.Parameter(torch.ones(self.embed_dim)))
        self.admin_profile = None  # an AdminProfile while profiling

    def admin_omegas(self):
        """The residual weights, in forward order."""
        return [getattr(self, f"admin_omega_{name}") for name in self.admin_sublayers]

    def forward(self, x, *args, **kwargs):
        self._next_omega = iter(self.admin_omegas())
        return super().forward(x, *args, **kwargs)

    def residual_connection(self, x, residual):
        omega = next(self._next_omega)
        if self.admin_profile is not None:
            with torch.no_grad():
                omega.fill_(self.admin_profile.ratio)
                self.admin_profile.ratio = math.sqrt((residual * omega).var().item() + x.var().item())
        return residual * omega + x


class AdminEncoderLayer(AdminLayerMixin, TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.init_admin(["self_attn", "ffn"])


class AdminDecoderLayer(AdminLayerMixin, TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        self.init_admin(["self_attn"] + ([] if no_encoder_attn else ["encoder_attn"]) + ["ffn"])


class AdminEncoder(LayerClassEncoder):
    layer_class = AdminEncoderLayer


class AdminDecoder(LayerClassDecoder):
    layer_class = AdminDecoderLayer


def probe_batch(dictionary, sentences, length, seed):
    """Random in-vocabulary tokens ending in </s>, shaped like a fairseq batch."""
    generator = torch.Generator().manual_seed(seed)
    low = dictionary.nspecial if len(dictionary) > dictionary.nspecial else 0
    tokens = torch.randint(low, len(dictionary), (sentences, length), generator=generator)
    tokens[:, -1] = dictionary.eos()
    return tokens


@register_model("admin_transformer")
class AdminTransformerModel(LayerClassTransformerModel):
    config_class = AdminConfig
    encoder_class = AdminEncoder
    decoder_class = AdminDecoder

    @classmethod
    def check_args(cls, args):
        require_post_ln(args, "Admin")

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        sentences = getattr(args, "admin_probe_sentences", 16)
        length = getattr(args, "admin_probe_length", 32)
        seed = getattr(args, "seed", 1)
        src = probe_batch(task.source_dictionary, sentences, length, seed)
        tgt = probe_batch(task.target_dictionary, sentences, length, seed + 1)
        prev_output_tokens = torch.roll(tgt, 1, dims=1)  # </s> first, as fairseq's teacher forcing
        model.profile_admin_(src, prev_output_tokens)
        return model

    @torch.no_grad()
    def profile_admin_(self, src_tokens, prev_output_tokens):
        """Set every ``omega`` from one forward pass (training mode, as the reference code)."""
        stacks = [self.encoder.layers, self.decoder.layers]
        for layers in stacks:
            profile = AdminProfile()
            for layer in layers:
                layer.admin_profile = profile
        was_training = self.training
        self.train()
        try:
            with torch.random.fork_rng(devices=[]):
                src_lengths = torch.full((src_tokens.size(0),), src_tokens.size(1), dtype=torch.long)
                self(src_tokens, src_lengths, prev_output_tokens)
        finally:
            self.train(was_training)
            for layers in stacks:
                for layer in layers:
                    layer.admin_profile = None


register_size_variants("admin_transformer", postln_defaults)
