"""The 2024-2025 normalisation schemes (Peri-LN, Mix-LN, LayerNorm Scaling, DyT): each layer's output against
the scheme's formula written out by hand from the layer's own weights (attention, LayerNorm and DyT computed
here from the parameters, not by calling the modules), and a few real fairseq-train updates per scheme."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from fairseq.models import ARCH_MODEL_REGISTRY
from torch import nn

from conftest import BIN, TINY_MODEL, USER_DIR, run
from test_baselines import D, SIZE_VARIANTS, build, dict_dir, tokens  # noqa: F401
from test_baselines_dlcl_residual import assert_incremental_decoding_matches

SCHEMES = ["periln", "mixln", "lns", "dyt"]
LENGTH, BATCH, MEMORY = 5, 3, 6


def linear(module, x):
    return F.linear(x, module.weight, module.bias)


def attention(attn, query, memory, causal=False):
    """Multi-head scaled dot-product attention from the module's q/k/v/out projections (no hook, no fused kernel)."""
    heads, head_dim = attn.num_heads, attn.head_dim

    def split(t):  # T x B x C -> (B * heads) x T x head_dim, fairseq's layout
        return t.reshape(t.size(0), t.size(1) * heads, head_dim).transpose(0, 1)

    q, k, v = (split(linear(p, t)) for p, t in ((attn.q_proj, query), (attn.k_proj, memory), (attn.v_proj, memory)))
    scores = q @ k.transpose(1, 2) / math.sqrt(head_dim)
    if causal:
        scores = scores + torch.triu(torch.full(scores.shape[1:], float("-inf")), 1)
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(query.shape)
    return linear(attn.out_proj, out)


def layer_norm(norm, x):
    return F.layer_norm(x, (x.size(-1),), norm.weight, norm.bias, norm.eps)


def dyt(norm, x):
    return norm.weight * torch.tanh(norm.alpha * x) + norm.bias


def branches(layer, memory=None):
    """The layer's sublayers in order: (name of its LayerNorm, its function F); self-attention is causal in a
    decoder layer. F ends with the output projection (Peri-LN's output LayerNorm is not part of it)."""
    def ffn(y):
        return linear(layer.fc2, layer.activation_fn(linear(layer.fc1, y)))

    subs = [("self_attn_layer_norm", lambda y: attention(layer.self_attn, y, y, causal=memory is not None))]
    if memory is not None:
        subs.append(("encoder_attn_layer_norm", lambda y: attention(layer.encoder_attn, y, memory)))
    return subs + [("final_layer_norm", ffn)]


def pre_ln(layer, x, memory=None, norm=layer_norm):
    for name, f in branches(layer, memory):
        x = x + f(norm(getattr(layer, name), x))
    return x


def post_ln(layer, x, memory=None):
    for name, f in branches(layer, memory):
        x = layer_norm(getattr(layer, name), x + f(x))
    return x


def layer_output(layer, x, memory=None):
    """What fairseq's forward pass computes for this layer (eval mode)."""
    if memory is None:
        return layer(x, None)
    mask = torch.triu(torch.full((x.size(0), x.size(0)), float("-inf")), 1)
    return layer(x, encoder_out=memory, encoder_padding_mask=None, self_attn_mask=mask)[0]


def randomise_norms(model):
    """Non-trivial gains, biases (and DyT alphas), so that the formulas' norms are checked, not their init."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5 if not name.endswith("bias")
                            else torch.rand(param.shape, generator=generator) - 0.5)


def inputs(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(LENGTH, BATCH, D, generator=generator) * 2,
            torch.randn(MEMORY, BATCH, D, generator=generator))


def assert_layers(stack, expected, memory=None):
    x = inputs()[0]
    for index, layer in enumerate(stack.layers):
        torch.testing.assert_close(layer_output(layer, x, memory), expected(index, layer, x, memory))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_has_every_size_variant(scheme):
    for variant in SIZE_VARIANTS:
        assert f"{scheme}_transformer{variant}" in ARCH_MODEL_REGISTRY


def test_periln_normalises_every_sublayer_input_and_output(dict_dir):  # noqa: F811
    model = build(dict_dir, "periln_transformer", 2)
    randomise_norms(model)

    def expected(index, layer, x, memory):  # x + LN_out(F(LN_in(x))) for each sublayer
        out_norms = [layer.self_attn.output_layer_norm, layer.fc2.output_layer_norm]
        if memory is not None:
            out_norms.insert(1, layer.encoder_attn.output_layer_norm)
        for (name, f), out_norm in zip(branches(layer, memory), out_norms):
            x = x + layer_norm(out_norm, f(layer_norm(getattr(layer, name), x)))
        return x

    assert_layers(model.encoder, expected)
    assert_layers(model.decoder, expected, inputs()[1])
    for stack in (model.encoder, model.decoder):  # the embedding LayerNorm and Pre-LN's final one
        assert isinstance(stack.layernorm_embedding, nn.LayerNorm) and isinstance(stack.layer_norm, nn.LayerNorm)
    no_embedding_norm = build(dict_dir, "periln_transformer", 2, "--periln-no-embedding-norm")
    assert all(stack.layernorm_embedding is None for stack in (no_embedding_norm.encoder, no_embedding_norm.decoder))
    with pytest.raises(ValueError, match="final decoder LayerNorm"):
        build(dict_dir, "periln_transformer", 2, "--no-decoder-final-norm")


@pytest.mark.parametrize("fraction, encoder_post, decoder_post", [(None, 1, 2), ("0.5", 2, 4), ("0", 0, 0)])
def test_mixln_is_post_ln_in_the_first_quarter_and_pre_ln_above(dict_dir, fraction, encoder_post,  # noqa: F811
                                                                decoder_post):
    extra = ["--mixln-post-fraction", fraction] if fraction else []
    model = build(dict_dir, "mixln_transformer", 4, *extra, decoder_layers=8)  # floor(a*4), floor(a*8) Post-LN
    randomise_norms(model)
    for stack, post_layers in ((model.encoder, encoder_post), (model.decoder, decoder_post)):
        placements = [layer.normalize_before for layer in stack.layers]
        assert placements == [i >= post_layers for i in range(len(stack.layers))]
        assert isinstance(stack.layer_norm, nn.LayerNorm)  # the final LayerNorm stays, as in the authors' LLaMA

    def expected(post_layers):
        return lambda index, layer, x, memory: (post_ln if index < post_layers else pre_ln)(layer, x, memory)

    assert_layers(model.encoder, expected(encoder_post))
    assert_layers(model.decoder, expected(decoder_post), inputs()[1])


def test_mixln_refuses_a_fraction_outside_0_1(dict_dir):  # noqa: F811
    with pytest.raises(ValueError, match="between 0 and 1"):
        build(dict_dir, "mixln_transformer", 2, "--mixln-post-fraction", "1.5")


def test_lns_scales_the_layer_norms_of_layer_l_by_one_over_sqrt_l(dict_dir):  # noqa: F811
    model = build(dict_dir, "lns_transformer", 3, decoder_layers=2)
    randomise_norms(model)

    def expected(index, layer, x, memory):  # Pre-LN with LN(x) / sqrt(l), l = index + 1
        return pre_ln(layer, x, memory, norm=lambda norm, y: layer_norm(norm, y) / math.sqrt(index + 1))

    assert_layers(model.encoder, expected)
    assert_layers(model.decoder, expected, inputs()[1])
    for stack in (model.encoder, model.decoder):
        for index, layer in enumerate(stack.layers):
            for norm in filter(None, [layer.self_attn_layer_norm, layer.final_layer_norm,
                                      getattr(layer, "encoder_attn_layer_norm", None)]):
                assert norm.lns_scale.item() == pytest.approx(1 / math.sqrt(index + 1))
                assert "lns_scale" in norm.state_dict()  # recorded in checkpoints
        assert not hasattr(stack.layer_norm, "lns_scale")  # the final LayerNorm is not scaled


@pytest.mark.parametrize("alpha", [None, "0.8"])
def test_dyt_replaces_every_layer_norm(dict_dir, alpha):  # noqa: F811
    extra = ["--dyt-alpha-init", alpha] if alpha else []
    model = build(dict_dir, "dyt_transformer", 2, "--layernorm-embedding", *extra)
    assert not [name for name, module in model.named_modules() if isinstance(module, nn.LayerNorm)]
    alphas = [p for name, p in model.named_parameters() if name.endswith(".alpha")]
    # per stack: 2 (encoder) or 3 (decoder) per layer, the final one, the embedding one
    assert len(alphas) == (2 * 2 + 2) + (3 * 2 + 2)
    assert all(a.shape == (1,) and a.item() == pytest.approx(float(alpha or 0.5)) for a in alphas)
    for stack in (model.encoder, model.decoder):
        assert torch.equal(stack.layer_norm.weight, torch.ones(D))
        assert torch.equal(stack.layer_norm.bias, torch.zeros(D))
    randomise_norms(model)

    def expected(index, layer, x, memory):  # Pre-LN with gamma * tanh(alpha x) + beta in place of LN
        return pre_ln(layer, x, memory, norm=dyt)

    assert_layers(model.encoder, expected)
    assert_layers(model.decoder, expected, inputs()[1])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_incremental_decoding_matches_the_full_pass(dict_dir, scheme):  # noqa: F811
    model = build(dict_dir, f"{scheme}_transformer", 3, "--mixln-post-fraction", "0.5") if scheme == "mixln" else \
        build(dict_dir, f"{scheme}_transformer", 3)
    randomise_norms(model)
    assert_incremental_decoding_matches(model, tokens(), tokens(length=5, seed=1))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_trains_through_fairseq_train(multi30k_small_bin, tmp_path, scheme):
    proc = run([BIN / "fairseq-train", multi30k_small_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "1",
                "--arch", f"{scheme}_transformer_iwslt_de_en", "--encoder-layers", "2", "--decoder-layers", "2",
                *TINY_MODEL, "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
                "--warmup-updates", "2", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                "--max-tokens", "500", "--max-update", "3", "--save-dir", tmp_path, "--no-save",
                "--disable-validation", "--num-workers", "0", "--log-format", "json", "--log-interval", "1"])
    logs = [json.loads(line[line.index("{"):]) for line in (proc.stdout + proc.stderr).splitlines()
            if "| train_inner |" in line]
    assert [int(log["num_updates"]) for log in logs] == [1, 2, 3]
    assert all(math.isfinite(float(log["loss"])) for log in logs)
