"""Table 1 baselines: each method's defining property, checked numerically on a built model."""

import math
from argparse import Namespace

import pytest
import torch
from fairseq import options, tasks, utils
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

from conftest import USER_DIR

utils.import_user_module(Namespace(user_dir=USER_DIR))  # registers the architectures

METHODS = ["postln", "dsinit", "admin", "rezero", "tfixup", "normformer", "subln", "b2t", "dlcl", "residual"]
SIZE_VARIANTS = ["", "_iwslt_de_en", "_wmt_en_de", "_wmt_en_de_big", "_opus100", "_m2m_102"]
D, FFN = 64, 256  # wide enough for init-std checks (>= 16k samples per matrix)
SHAPE = ["--encoder-embed-dim", D, "--decoder-embed-dim", D, "--encoder-ffn-embed-dim", FFN,
         "--decoder-ffn-embed-dim", FFN, "--encoder-attention-heads", 4, "--decoder-attention-heads", 4]


@pytest.fixture(scope="module")
def dict_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("dicts")
    vocab = Dictionary()
    for i in range(96):
        vocab.add_symbol(f"w{i}")
    for lang in ("de", "en"):
        vocab.save(str(path / f"dict.{lang}.txt"))
    return path


def build(dict_dir, arch, layers=4, *extra, seed=1, decoder_layers=None):
    """A translation model built exactly as fairseq-train builds it (eval mode, no dropout);
    ``layers`` encoder layers and ``decoder_layers`` (default: as many) decoder layers."""
    torch.manual_seed(seed)
    argv = [dict_dir, "--user-dir", USER_DIR, "--task", "translation", "-s", "de", "-t", "en", "--arch", arch,
            "--encoder-layers", layers, "--decoder-layers", decoder_layers or layers, "--cpu", "--seed", seed,
            *SHAPE, *extra]
    args = options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in argv])
    model = tasks.setup_task(args).build_model(args)
    return model.eval()


def xavier_std(weight, gain=1.0):
    fan_out, fan_in = weight.shape
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def assert_std(weight, expected, rel=0.06):
    assert weight.std().item() == pytest.approx(expected, rel=rel)


def torch_linear_std(weight):
    """torch's ``nn.Linear`` default (kaiming-uniform, a = sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return 1 / math.sqrt(3 * weight.shape[1])


def assert_uniform(weight, bound):
    """Drawn from U(-bound, bound): the std, and the largest value close to (not above) the bound."""
    assert_std(weight, bound / math.sqrt(3))
    assert 0.97 * bound < weight.abs().max().item() <= bound + 1e-7


def assert_zero(*tensors):
    for tensor in tensors:
        assert torch.equal(tensor, torch.zeros_like(tensor))


def self_attention(layer, x):
    return layer.self_attn(query=x, key=x, value=x, key_padding_mask=None, need_weights=False)[0]


def cross_attention(layer, x, memory):
    return layer.encoder_attn(query=x, key=memory, value=memory, key_padding_mask=None, static_kv=True,
                              need_weights=False)[0]


def ffn(layer, x):
    return layer.fc2(layer.activation_fn(layer.fc1(x)))


def sample(length=5, batch=3, seed=0):
    return torch.randn(length, batch, D, generator=torch.Generator().manual_seed(seed))


def tokens(batch=3, length=7, seed=0):
    return torch.randint(4, 100, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("method", METHODS)
def test_every_method_has_every_size_variant_and_trains(dict_dir, method):
    for variant in SIZE_VARIANTS:
        assert f"{method}_transformer{variant}" in ARCH_MODEL_REGISTRY
    model = build(dict_dir, f"{method}_transformer_iwslt_de_en", 3).train()
    out, _ = model(tokens(), torch.full((3,), 7), tokens(length=5, seed=1))
    assert out.shape == (3, 5, 100) and torch.isfinite(out).all()
    out.logsumexp(-1).mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("arch", ["postln_transformer", "dsinit_transformer", "admin_transformer", "b2t_transformer",
                                  "residual_transformer"])
def test_post_ln_methods_refuse_pre_ln(dict_dir, arch):
    with pytest.raises(ValueError, match="Post-LN"):
        build(dict_dir, arch, 2, "--encoder-normalize-before")


@pytest.mark.parametrize("arch", ["rezero_transformer", "tfixup_transformer"])
def test_normless_methods_refuse_layer_norm_options(dict_dir, arch):
    with pytest.raises(ValueError, match="has no LayerNorm"):
        build(dict_dir, arch, 2, "--layernorm-embedding")


def test_postln_is_ln_of_residual_sum(dict_dir):
    model = build(dict_dir, "postln_transformer", 2)
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None
    layer, x = model.encoder.layers[0], sample()
    h = layer.self_attn_layer_norm(x + self_attention(layer, x))
    expected = layer.final_layer_norm(h + ffn(layer, h))
    torch.testing.assert_close(layer(x, None), expected)


def test_dsinit_follows_the_authors_code_at_n_ne_m(dict_dir):
    """bzhangGo/zero: tf.variance_scaling_initializer(scale=l^-1/2, fan_avg, uniform) per layer l, i.e.
    U(-b, b), b = sqrt(3 scale / ((fan_in + fan_out) / 2)); self-attention q/k/v is one [d, 3d] matrix;
    biases 0."""
    n, m = 3, 2
    model = build(dict_dir, "dsinit_transformer", n, decoder_layers=m)

    def bound(depth, fan_in, fan_out):
        return math.sqrt(3 * depth ** -0.5 / ((fan_in + fan_out) / 2))

    for stack, depth in ((model.encoder, n), (model.decoder, m)):
        assert len(stack.layers) == depth
        for l, layer in enumerate(stack.layers, start=1):
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                assert_uniform(proj.weight, bound(l, D, 3 * D))  # fused qkv_map
            assert_uniform(layer.self_attn.out_proj.weight, bound(l, D, D))
            assert_uniform(layer.fc1.weight, bound(l, D, FFN))
            assert_uniform(layer.fc2.weight, bound(l, FFN, D))
            if stack is model.decoder:  # cross-attention: separate q_map, k_map, v_map
                for proj in (layer.encoder_attn.q_proj, layer.encoder_attn.v_proj, layer.encoder_attn.out_proj):
                    assert_uniform(proj.weight, bound(l, D, D))
            assert_zero(*[p for name, p in layer.named_parameters()
                          if name.endswith("bias") and "layer_norm" not in name])


def test_dsinit_paper_formula_scales_layer_l_by_one_over_sqrt_l(dict_dir):
    model = build(dict_dir, "dsinit_transformer", 3, "--dsinit-formula", "paper", decoder_layers=2)
    for stack in (model.encoder, model.decoder):
        for depth, layer in enumerate(stack.layers, start=1):
            for weight in (layer.fc1.weight, layer.fc2.weight, layer.self_attn.v_proj.weight,
                           layer.self_attn.out_proj.weight):
                assert_uniform(weight, math.sqrt(6 / sum(weight.shape)) / math.sqrt(depth))
    assert layer.fc1.bias.abs().max().item() > 0  # biases keep fairseq's (non-zero) init


def test_admin_starts_from_the_reference_init(dict_dir):
    """Transformer-Clinic (fairseq 0.9): FFN Xavier with zero biases; fused [3d, d] q/k/v Xavier, zero biases."""
    model = build(dict_dir, "admin_transformer", 3, decoder_layers=2)
    for layer in list(model.encoder.layers) + list(model.decoder.layers):
        attentions = [layer.self_attn] + ([layer.encoder_attn] if hasattr(layer, "encoder_attn") else [])
        assert_uniform(layer.fc1.weight, math.sqrt(6 / (D + FFN)))
        assert_uniform(layer.fc2.weight, math.sqrt(6 / (FFN + D)))
        for attn in attentions:
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                assert_uniform(proj.weight, math.sqrt(6 / (D + 3 * D)))
            assert_uniform(attn.out_proj.weight, math.sqrt(6 / (2 * D)))
            assert_zero(attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias, attn.out_proj.bias)
        assert_zero(layer.fc1.bias, layer.fc2.bias)


def test_admin_omegas_follow_the_profiled_variances(dict_dir):
    model = build(dict_dir, "admin_transformer", 3)
    calls = []  # (stack, F output, residual) of every residual sum, in forward order

    for stack_name, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        for layer in stack.layers:
            original = layer.residual_connection

            def record(x, residual, original=original, stack_name=stack_name):
                calls.append((stack_name, x.detach().clone(), residual.detach().clone()))
                return original(x, residual)

            layer.residual_connection = record
    omegas = {"encoder": [], "decoder": []}
    for stack_name, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        for layer in stack.layers:
            omegas[stack_name] += [w.detach().clone() for w in layer.admin_omegas()]
    # profile again on the same probe (same seed, forked RNG): the same omegas must come out
    from deepnet_fairseq.models.admin_transformer import probe_batch

    task_dict = model.encoder.dictionary
    src = probe_batch(task_dict, 16, 32, 1)
    prev = torch.roll(probe_batch(model.decoder.dictionary, 16, 32, 2), 1, dims=1)
    model.profile_admin_(src, prev)
    for stack_name in ("encoder", "decoder"):
        sums = [(x, r) for s, x, r in calls if s == stack_name]
        assert len(sums) == len(omegas[stack_name]) == (2 if stack_name == "encoder" else 3) * 3
        ratio = 1.0
        for (x, residual), omega in zip(sums, omegas[stack_name]):
            torch.testing.assert_close(omega, torch.full_like(omega, ratio))
            ratio = math.sqrt((residual * omega).var().item() + x.var().item())
    scalars = [w[0].item() for w in omegas["encoder"]]
    assert scalars[0] == 1.0 and all(b > a for a, b in zip(scalars, scalars[1:]))  # grows as outputs accumulate
    for stack in (model.encoder, model.decoder):
        for layer in stack.layers:
            assert all(w.requires_grad for w in layer.admin_omegas())
            assert layer.admin_profile is None


def test_admin_layer_is_ln_of_omega_weighted_residual(dict_dir):
    model = build(dict_dir, "admin_transformer", 2)
    layer, x = model.encoder.layers[1], sample()
    w_attn, w_ffn = layer.admin_omega_self_attn, layer.admin_omega_ffn
    assert w_attn[0].item() > 1.0
    h = layer.self_attn_layer_norm(x * w_attn + self_attention(layer, x))
    torch.testing.assert_close(layer(x, None), layer.final_layer_norm(h * w_ffn + ffn(layer, h)))


def test_rezero_layers_are_identities_at_init_without_layer_norm(dict_dir):
    model = build(dict_dir, "rezero_transformer", 2)
    assert not [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    x = sample()
    enc = model.encoder.layers[0]
    torch.testing.assert_close(enc(x, None), x, rtol=0, atol=0)
    dec = model.decoder.layers[0]
    torch.testing.assert_close(dec(x, encoder_out=sample(seed=1))[0], x, rtol=0, atol=0)
    with torch.no_grad():
        enc.rezero_alpha.fill_(0.5)
    h = x + 0.5 * self_attention(enc, x)
    torch.testing.assert_close(enc(x, None), h + 0.5 * ffn(enc, h))


def test_tfixup_follows_the_authors_code_at_n_ne_m(dict_dir):
    """layer6ai-labs/T-Fixup: Xavier v/out/FFN (zero FFN biases); encoder x 0.67 N^-1/4, decoder x (9M)^-1/4;
    encoder embedding x (9N)^-1/4, decoder embedding x (9M)^-1/4."""
    n, m = 6, 2
    model = build(dict_dir, "tfixup_transformer", n, decoder_layers=m)
    assert not [mod for mod in model.modules() if isinstance(mod, torch.nn.LayerNorm)]
    for stack, scale in ((model.encoder, 0.67 * n ** -0.25), (model.decoder, (9 * m) ** -0.25)):
        for layer in stack.layers:
            attentions = [layer.self_attn] + ([layer.encoder_attn] if stack is model.decoder else [])
            for weight in [layer.fc1.weight, layer.fc2.weight] + [w for a in attentions for w in
                                                                  (a.v_proj.weight, a.out_proj.weight)]:
                assert_uniform(weight, scale * math.sqrt(6 / sum(weight.shape)))  # Xavier x scale, v included
            assert_uniform(layer.self_attn.q_proj.weight, math.sqrt(6 / (2 * D)) / math.sqrt(2))  # fairseq's q/k
            assert_zero(layer.fc1.bias, layer.fc2.bias)
    # fairseq's embedding N(0, d^-1/2) (padding row zero), then each stack's own depth
    assert_std(model.encoder.embed_tokens.weight[4:], D ** -0.5 * (9 * n) ** -0.25, rel=0.05)
    assert_std(model.decoder.embed_tokens.weight[4:], D ** -0.5 * (9 * m) ** -0.25, rel=0.05)
    shared = build(dict_dir, "tfixup_transformer", n, "--share-all-embeddings", decoder_layers=m)
    assert shared.encoder.embed_tokens is shared.decoder.embed_tokens  # scaled once, by the encoder's factor
    assert_std(shared.encoder.embed_tokens.weight[4:], D ** -0.5 * (9 * n) ** -0.25, rel=0.05)


def scale_(*linears, by=10.0):
    with torch.no_grad():
        for linear in linears:
            linear.weight.mul_(by)
            linear.bias.mul_(by)


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_normformer_normalises_attention_output_and_ffn_activation(dict_dir, stack):
    model = build(dict_dir, "normformer_transformer", 2)
    layer = getattr(model, stack).layers[0]
    x, memory = sample(), sample(seed=1)

    def run():
        return layer(x, None) if stack == "encoder" else layer(x, encoder_out=memory)[0]

    before = run()
    scale_(layer.self_attn.out_proj)  # LN after the attention output: invariant to its scale
    scale_(layer.fc1)  # LN after the (ReLU) activation: invariant to fc1's scale
    torch.testing.assert_close(run(), before, rtol=1e-3, atol=1e-3)
    head_scale = layer.self_attn.head_scale if stack == "encoder" else layer.c_attn
    assert head_scale.shape == (4,) and torch.equal(head_scale, torch.ones(4))
    assert model.encoder.layer_norm is not None and model.decoder.layer_norm is not None  # Pre-LN final norm
    with torch.no_grad():  # the extra LN really sits on the sublayer outputs: zero them -> identity
        head_scale.zero_()
        layer.fc2.weight.zero_()
        layer.fc2.bias.zero_()
    if stack == "encoder":
        torch.testing.assert_close(run(), x)


def test_subln_follows_torchscale_at_n_ne_m(dict_dir):
    """microsoft/torchscale: nn.Linear defaults everywhere; weights and biases of the FFN and of the
    self-attention's v/out times gamma; the cross-attention neither scaled nor sub-normalised."""
    from deepnet_fairseq.models.subln_transformer import magneto_gains

    n, m = 6, 2
    gain_enc = math.sqrt(math.log(3 * m) * math.log(2 * n) / 3)
    gain_dec = math.sqrt(math.log(3 * m))
    assert magneto_gains(n, m) == (pytest.approx(gain_enc), pytest.approx(gain_dec))
    assert magneto_gains(12, 0) == (pytest.approx(math.sqrt(math.log(24))), None)
    model = build(dict_dir, "subln_transformer", n, decoder_layers=m)
    for stack, gain in ((model.encoder, gain_enc), (model.decoder, gain_dec)):
        for layer in stack.layers:
            attn = layer.self_attn
            for linear in (layer.fc1, layer.fc2, attn.v_proj, attn.out_proj):
                assert_uniform(linear.weight, gain / math.sqrt(linear.weight.shape[1]))
                assert linear.bias.abs().max().item() <= gain / math.sqrt(linear.weight.shape[1]) + 1e-7
            assert layer.fc1.bias.abs().max().item() > 1 / math.sqrt(D)  # the bias is scaled too (gain > 1)
            for linear in (attn.q_proj, attn.k_proj):
                assert_uniform(linear.weight, 1 / math.sqrt(D))
    for layer in model.decoder.layers:
        for linear in (layer.encoder_attn.v_proj, layer.encoder_attn.out_proj):
            assert_uniform(linear.weight, 1 / math.sqrt(D))  # not scaled
        assert layer.encoder_attn.out_proj.bias.abs().max().item() > 0.5 / math.sqrt(D)  # torch's bias, not 0
    layer, x, memory = model.decoder.layers[0], sample(), sample(seed=1)
    before = layer(x, encoder_out=memory)[0]
    # LN before the self-attention's and the FFN's output projections: invariant to v's and fc1's scale
    scale_(layer.self_attn.v_proj, layer.fc1)
    torch.testing.assert_close(layer(x, encoder_out=memory)[0], before, rtol=1e-3, atol=1e-3)
    scale_(layer.encoder_attn.v_proj)  # no LN inside the cross-attention: its output changes
    assert not torch.allclose(layer(x, encoder_out=memory)[0], before, rtol=1e-2, atol=1e-2)


def test_b2t_adds_the_layer_input_before_the_last_layer_norm(dict_dir):
    model = build(dict_dir, "b2t_transformer", 4)
    for layer in list(model.encoder.layers) + list(model.decoder.layers):  # weights x L^-1/2, LN untouched
        out_proj = layer.self_attn.out_proj.weight  # fairseq: xavier_uniform
        assert_std(out_proj, xavier_std(out_proj, 4 ** -0.5))
        assert_std(layer.fc1.weight, 4 ** -0.5 / math.sqrt(3 * layer.fc1.weight.shape[1]))
        assert torch.equal(layer.final_layer_norm.weight, torch.ones(D))
    x, memory = sample(), sample(seed=1)
    enc = model.encoder.layers[0]
    h = enc.self_attn_layer_norm(x + self_attention(enc, x))
    torch.testing.assert_close(enc(x, None), enc.final_layer_norm(h + ffn(enc, h) + x))
    dec = model.decoder.layers[0]
    y = dec.self_attn_layer_norm(x + self_attention(dec, x))
    z = dec.encoder_attn_layer_norm(y + cross_attention(dec, y, memory))
    torch.testing.assert_close(dec(x, encoder_out=memory)[0], dec.final_layer_norm(z + ffn(dec, z) + x))


def test_table1_layout_from_runs_csv(tmp_path):
    from conftest import ROOT, run

    header = "arch,depth,seed,updates,final_train_loss,valid_loss,bleu,diverged,reason,wall_s\n"
    rows = ["postln_transformer_iwslt_de_en,2,1,60,7.1,7.0,3.5,no,,10",
            "postln_transformer_iwslt_de_en,2,2,60,7.2,7.1,4.5,no,,10",
            "postln_transformer_iwslt_de_en,12,1,9,inf,,,yes,training diverged: loss,10",
            "postln_transformer_iwslt_de_en,12,2,60,7.0,6.9,5.0,no,,10",
            "deepnet_transformer_iwslt_de_en,2,1,60,7.0,6.9,2.25,no,,10",
            "deepnet_transformer_iwslt_de_en,2,2,60,7.0,6.9,2.75,no,,10",
            "deepnet_transformer_iwslt_de_en,12,1,60,6.5,6.4,6.0,no,,10",
            "deepnet_transformer_iwslt_de_en,12,2,60,6.5,6.4,7.0,no,,10"]
    (tmp_path / "runs.csv").write_text(header + "\n".join(rows) + "\n")
    script = ROOT / "scripts" / "table1.sh"
    run([script, "--out", tmp_path, "--methods", "postln_transformer,deepnet_transformer", "--depths", "2,12",
         "--format-only"])
    assert (tmp_path / "table1.csv").read_text().splitlines() == [
        "method,2L-2L,12L-12L",
        "postln_transformer_iwslt_de_en,4.00,diverged",  # mean over seeds; any diverged seed -> diverged
        "deepnet_transformer_iwslt_de_en,2.50,6.50"]
    assert (tmp_path / "table1_valid_loss.csv").read_text().splitlines()[1:] == [
        "postln_transformer_iwslt_de_en,7.050,diverged", "deepnet_transformer_iwslt_de_en,6.900,6.400"]
    assert "| deepnet_transformer_iwslt_de_en | 2.50 | 6.50 |" in (tmp_path / "table1.md").read_text()
    missing = run([script, "--out", tmp_path, "--methods", "b2t_transformer", "--depths", "2", "--format-only"],
                  check=False)
    assert missing.returncode != 0 and "runs.csv lacks a run" in missing.stderr
    no_out = run([script, "--depths", "2"], check=False)
    assert no_out.returncode == 2 and "--out DIR is required" in no_out.stderr
