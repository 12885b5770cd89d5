"""DLCL and ResiDual, which change fairseq's layer loop: each stack's output against the method's
formula written out by hand over a 3-layer stack, incremental decoding, and a real CLI run."""

import math

import pytest
import torch
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from conftest import BIN, TINY_MODEL, USER_DIR, run
from test_baselines import (D, FFN, assert_uniform, assert_zero, build, cross_attention, dict_dir,  # noqa: F401
                            ffn, self_attention, tokens)

LAYERS = 3


def embedded(model, src, prev):
    """The encoder's and decoder's embedding outputs, T x B x C (eval mode: no dropout; no padding)."""
    x_enc = model.encoder.forward_embedding(src)[0].transpose(0, 1)
    dec = model.decoder
    x_dec = (dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev)).transpose(0, 1)
    return x_enc, x_dec


def stack_outputs(model, src, prev):
    """What fairseq's forward pass returns for each stack, T x B x C."""
    encoder_out = model.encoder(src, src_lengths=torch.full((src.size(0),), src.size(1)))
    decoder_features = model.decoder.extract_features(prev, encoder_out=encoder_out)[0]
    return encoder_out["encoder_out"][0], decoder_features.transpose(0, 1)


def causal_self_attention(layer, x):
    mask = torch.triu(torch.full((x.size(0), x.size(0)), float("-inf")), 1)
    return layer.self_attn(query=x, key=x, value=x, key_padding_mask=None, attn_mask=mask, need_weights=False)[0]


def assert_incremental_decoding_matches(model, src, prev):
    encoder_out = model.encoder(src, src_lengths=torch.full((src.size(0),), src.size(1)))
    full = model.decoder(prev, encoder_out=encoder_out)[0]
    state = {}
    steps = [model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0][:, -1]
             for t in range(prev.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-4, atol=1e-4)


def test_dlcl_stacks_are_learned_combinations_of_all_earlier_layers(dict_dir):  # noqa: F811
    model = build(dict_dir, "dlcl_transformer", LAYERS, decoder_layers=LAYERS)
    for stack in (model.encoder, model.decoder):
        weight = stack.layer_combination.weight
        assert weight.shape == (LAYERS + 1, LAYERS + 1) and weight.requires_grad
        for l in range(LAYERS + 1):  # the authors' 'avg' init: row l is 1/(l+1) on k <= l
            assert torch.equal(weight[l, : l + 1], torch.full((l + 1,), 1 / (l + 1)))
            assert torch.all(weight[l, l + 1:] == 0)
        with torch.no_grad():  # a general (learned-looking) combination and LayerNorms
            weight.copy_(torch.rand(LAYERS + 1, LAYERS + 1).tril() + 0.1)
            for norm in stack.layer_combination.layer_norms:
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)
    assert all(isinstance(layer, TransformerEncoderLayerBase) for layer in model.encoder.layers)  # outside forward
    assert all(isinstance(layer, TransformerDecoderLayerBase) for layer in model.decoder.layers)
    for layer in list(model.encoder.layers) + list(model.decoder.layers):  # the authors' fairseq: Xavier, zero biases
        assert_uniform(layer.fc1.weight, math.sqrt(6 / (D + FFN)))
        assert_uniform(layer.self_attn.v_proj.weight, math.sqrt(6 / (D + 3 * D)))  # fused [3d, d] in_proj
        assert_zero(layer.fc1.bias, layer.fc2.bias, layer.self_attn.q_proj.bias, layer.self_attn.v_proj.bias)

    src, prev = tokens(), tokens(length=5, seed=1)
    x_enc, x_dec = embedded(model, src, prev)

    def dlcl(stack, x0, run_layer):
        w, norms = stack.layer_combination.weight, stack.layer_combination.layer_norms
        h = [x0]  # h_0 = embedding output, h_k = LN_k(y_k)
        for l, layer in enumerate(stack.layers):
            y = run_layer(layer, sum(w[l, k] * h[k] for k in range(l + 1)))
            h.append(norms[l](y))
        return stack.layer_norm(sum(w[LAYERS, k] * h[k] for k in range(LAYERS + 1)))

    def preln_encoder_layer(layer, x):
        x = x + self_attention(layer, layer.self_attn_layer_norm(x))
        return x + ffn(layer, layer.final_layer_norm(x))

    expected_enc = dlcl(model.encoder, x_enc, preln_encoder_layer)

    def preln_decoder_layer(layer, x):
        x = x + causal_self_attention(layer, layer.self_attn_layer_norm(x))
        x = x + cross_attention(layer, layer.encoder_attn_layer_norm(x), expected_enc)
        return x + ffn(layer, layer.final_layer_norm(x))

    expected_dec = dlcl(model.decoder, x_dec, preln_decoder_layer)
    enc_out, dec_out = stack_outputs(model, src, prev)
    torch.testing.assert_close(enc_out, expected_enc, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dec_out, expected_dec, rtol=1e-4, atol=1e-5)
    assert_incremental_decoding_matches(model, src, prev)


def test_residual_stacks_add_post_ln_and_normalised_dual_streams(dict_dir):  # noqa: F811
    model = build(dict_dir, "residual_transformer", LAYERS, decoder_layers=LAYERS)
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None  # Post-LN layers
    for stack in (model.encoder, model.decoder):
        assert stack.dual_stream_layer_norm.eps == 1e-7
        with torch.no_grad():
            stack.dual_stream_layer_norm.weight.uniform_(0.5, 1.5)
            stack.dual_stream_layer_norm.bias.uniform_(-0.5, 0.5)
    src, prev = tokens(), tokens(length=5, seed=1)
    x_enc, x_dec = embedded(model, src, prev)

    def residual(stack, x0, sublayers):
        x, r = x0, x0  # Post-LN stream x, dual stream r
        for layer in stack.layers:
            for sublayer, norm in sublayers(layer):
                f = sublayer(x)
                r = r + f
                x = norm(x + f)
        return x + stack.dual_stream_layer_norm(r)

    expected_enc = residual(model.encoder, x_enc, lambda layer: [
        (lambda x: self_attention(layer, x), layer.self_attn_layer_norm),
        (lambda x: ffn(layer, x), layer.final_layer_norm)])
    expected_dec = residual(model.decoder, x_dec, lambda layer: [
        (lambda x: causal_self_attention(layer, x), layer.self_attn_layer_norm),
        (lambda x: cross_attention(layer, x, expected_enc), layer.encoder_attn_layer_norm),
        (lambda x: ffn(layer, x), layer.final_layer_norm)])
    enc_out, dec_out = stack_outputs(model, src, prev)
    torch.testing.assert_close(enc_out, expected_enc, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dec_out, expected_dec, rtol=1e-4, atol=1e-5)
    assert_incremental_decoding_matches(model, src, prev)


@pytest.mark.parametrize("arch", ["dlcl_transformer", "residual_transformer"])
def test_activation_checkpointing_gives_the_same_gradients(dict_dir, arch):  # noqa: F811
    src, prev = tokens(), tokens(length=5, seed=1)
    grads = []
    for extra in ([], ["--checkpoint-activations"]):
        model = build(dict_dir, arch, 3, "--dropout", "0", decoder_layers=2).train()
        model(src, torch.full((3,), 7), prev)[0].logsumexp(-1).mean().backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("arch", ["dlcl_transformer", "residual_transformer"])
def test_layer_loop_methods_refuse_layerdrop(dict_dir, arch):  # noqa: F811
    with pytest.raises(ValueError, match="LayerDrop"):
        build(dict_dir, arch, 2, "--encoder-layerdrop", "0.1")


# a fairseq-train and a fairseq-generate process each (~20 s): make test-slow (CI); the layer loops are tested above
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["dlcl_transformer", "residual_transformer"])
def test_train_and_generate_through_the_cli(multi30k_bin, tmp_path, arch):
    run([BIN / "fairseq-train", multi30k_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "1",
         "--arch", f"{arch}_iwslt_de_en", "--encoder-layers", "3", "--decoder-layers", "2", *TINY_MODEL,
         "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "2",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "1000",
         "--max-update", "4", "--save-dir", tmp_path, "--no-epoch-checkpoints", "--disable-validation",
         "--num-workers", "0"])
    gen = run([BIN / "fairseq-generate", multi30k_bin, "--user-dir", USER_DIR, "--cpu",
               "--path", tmp_path / "checkpoint_last.pt", "--gen-subset", "test", "--beam", "2",
               "--batch-size", "32", "--required-batch-size-multiple", "1", "--max-len-b", "10",
               "--num-workers", "0"])
    hypotheses = [line for line in gen.stdout.splitlines() if line.startswith("H-")]
    assert len(hypotheses) == 100 and "BLEU" in gen.stdout
