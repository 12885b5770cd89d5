"""DeepNorm and Pre-LN are exactly the papers' architectures (FACTS.md)."""

import math

import pytest
import torch

import deepnet_fairseq  # noqa: F401  (registers the architectures)
from deepnet_fairseq.models import deepnorm_constants
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY


class ToyTask:
    """Just enough of a translation task for build_model: one joined dictionary."""

    def __init__(self, vocab=50):
        d = Dictionary()
        for i in range(vocab):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d


def build(arch, *extra, vocab=50):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["/dev/null", "--user-dir", "deepnet_fairseq", "--arch", arch, "--task", "translation", *map(str, extra)]
    )
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, ToyTask(vocab))
    return model.eval()


def paper(n, m):
    """The paper's Figure 2, written out independently of the plugin."""
    if n and m:
        return (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16), (3 * m) ** 0.25, (12 * m) ** -0.25)
    if n:
        return ((2 * n) ** 0.25, (8 * n) ** -0.25, None, None)
    return (None, None, (2 * m) ** 0.25, (8 * m) ** -0.25)


@pytest.mark.parametrize("n,m", [(1, 1), (6, 6), (18, 18), (100, 100), (12, 1), (1, 12), (500, 500), (6, 0), (0, 6), (250, 0), (0, 1000)])
def test_constants_match_the_paper(n, m):
    c = deepnorm_constants(n, m)
    for got, want in zip((c.encoder_alpha, c.encoder_beta, c.decoder_alpha, c.decoder_beta), paper(n, m)):
        assert (got is None and want is None) or got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("n, m", [(6, 6), (18, 18), (100, 100), (4, 3)])
def test_source_init_constants_are_the_papers_with_a_quarter_of_the_encoder_beta(n, m):
    paper_constants, source = deepnorm_constants(n, m), deepnorm_constants(n, m, init="source")
    assert source.encoder_beta == pytest.approx(paper(n, m)[1] / 4)
    assert (source.encoder_alpha, source.decoder_alpha, source.decoder_beta) == (
        paper_constants.encoder_alpha, paper_constants.decoder_alpha, paper_constants.decoder_beta)


def test_known_values():
    # 18L-18L from the paper's setting: alpha_enc = 0.81*(18^5)^(1/16)
    c = deepnorm_constants(18, 18)
    assert c.encoder_alpha == pytest.approx(0.81 * 18 ** (5 / 16))
    assert c.decoder_beta == pytest.approx(216 ** -0.25)


@pytest.mark.parametrize(
    "kwargs,option",
    [
        (dict(encoder_layers=0, decoder_layers=0), "--encoder-layers and --decoder-layers"),
        (dict(encoder_layers=-3, decoder_layers=6), "--encoder-layers"),
        (dict(encoder_layers=6, decoder_layers=2.5), "--decoder-layers"),
        (dict(encoder_layers=6, decoder_layers=6, encoder_alpha=0.0), "--deepnorm-encoder-alpha"),
        (dict(encoder_layers=6, decoder_layers=6, decoder_beta=-1.0), "--deepnorm-decoder-beta"),
        (dict(encoder_layers=6, decoder_layers=6, encoder_beta=float("nan")), "--deepnorm-encoder-beta"),
        (dict(encoder_layers=0, decoder_layers=6, encoder_alpha=2.0), "--deepnorm-encoder-alpha"),
    ],
)
def test_bad_values_name_their_option(kwargs, option):
    with pytest.raises(ValueError, match=option):
        deepnorm_constants(**kwargs)


def test_overrides_replace_only_their_value():
    c = deepnorm_constants(6, 6, encoder_alpha=2.0, decoder_beta=0.5)
    ref = deepnorm_constants(6, 6)
    assert (c.encoder_alpha, c.decoder_beta) == (2.0, 0.5)
    assert (c.encoder_beta, c.decoder_alpha) == (ref.encoder_beta, ref.decoder_alpha)


def test_cli_overrides_reach_the_layers():
    model = build("deepnet_transformer", "--encoder-layers", 2, "--decoder-layers", 3,
                  "--deepnorm-encoder-alpha", 1.5, "--deepnorm-decoder-alpha", 2.5)
    assert [layer.deepnorm_alpha.item() for layer in model.encoder.layers] == [1.5, 1.5]
    assert [layer.deepnorm_alpha.item() for layer in model.decoder.layers] == [2.5] * 3


@pytest.mark.parametrize("extra,option", [
    (("--encoder-layers", 0), "--encoder-layers"),
    (("--decoder-layers", -2), "--decoder-layers"),
    (("--deepnorm-decoder-beta", -0.1), "--deepnorm-decoder-beta"),
    (("--encoder-normalize-before",), "--encoder-normalize-before"),
])
def test_bad_model_options_are_rejected(extra, option):
    with pytest.raises(ValueError, match=option):
        build("deepnet_transformer", *extra)


def xavier_std(w, gain):
    fan_out, fan_in = w.shape
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def test_initialisation_std_matches_beta():
    n, m = 4, 3
    model = build("deepnet_transformer", "--encoder-layers", n, "--decoder-layers", m,
                  "--encoder-embed-dim", 256, "--decoder-embed-dim", 256,
                  "--encoder-ffn-embed-dim", 1024, "--decoder-ffn-embed-dim", 1024)
    c = deepnorm_constants(n, m)
    checked = 0
    for stack, beta, attn_names in ((model.encoder, c.encoder_beta, ["self_attn"]),
                                    (model.decoder, c.decoder_beta, ["self_attn", "encoder_attn"])):
        for layer in stack.layers:
            expected = {"fc1": beta, "fc2": beta}
            for a in attn_names:
                expected.update({f"{a}.q_proj": 1.0, f"{a}.k_proj": 1.0, f"{a}.v_proj": beta, f"{a}.out_proj": beta})
            for name, gain in expected.items():
                w = layer.get_submodule(name).weight.detach()
                assert w.mean().abs() < 0.05 * xavier_std(w, gain), name
                assert w.std().item() == pytest.approx(xavier_std(w, gain), rel=0.03), (name, gain)
                checked += 1
    assert checked == n * 6 + m * 10


@pytest.mark.parametrize("extra, changed", [
    (("--deepnorm-init", "source", "--deepnorm-encoder-beta", 0.87 * (2**4 * 3) ** (-1 / 16)),
     {"decoder.layers.2.encoder_attn.v_proj", "decoder.layers.2.encoder_attn.out_proj"}),
    (("--deepnorm-gains", "decoder_ffn[-1]=1,encoder_self_attn[1]=1"),
     {"decoder.layers.2.fc1", "decoder.layers.2.fc2", "encoder.layers.1.self_attn.v_proj",
      "encoder.layers.1.self_attn.out_proj"}),
])
def test_gains_change_only_the_named_sublayers(extra, changed):
    """The source init (and the ablation option) differ from the paper's init in the named weights only:
    Xavier gain 1 there, the very same tensors everywhere else."""
    shape = ("--encoder-layers", 2, "--decoder-layers", 3, "--encoder-embed-dim", 256, "--decoder-embed-dim", 256,
             "--encoder-ffn-embed-dim", 512, "--decoder-ffn-embed-dim", 512)
    torch.manual_seed(3)
    paper_init = build("deepnet_transformer", *shape).state_dict()
    torch.manual_seed(3)
    variant = build("deepnet_transformer", *shape, *extra).state_dict()
    differ = {name.rsplit(".", 1)[0] for name in paper_init if not torch.equal(paper_init[name], variant[name])}
    assert differ == changed
    for name in changed:
        w = variant[f"{name}.weight"]
        assert w.std().item() == pytest.approx(xavier_std(w, 1.0), rel=0.03), name


@pytest.mark.parametrize("spec", ["decoder_cross=1", "decoder_ffn[x]=1", "decoder_ffn=0", "decoder_ffn", "encoder_ffn[0=1"])
def test_bad_gains_name_the_option(spec):
    with pytest.raises(ValueError, match=f"--deepnorm-gains: '{spec.replace('[', '.')}'"):
        build("deepnet_transformer", "--deepnorm-gains", spec)


def test_a_layers_own_gain_wins_over_its_groups():
    from deepnet_fairseq.models.deepnorm import parse_gains, sublayer_gain

    gains = parse_gains("decoder_cross_attn=0.5,decoder_cross_attn[-1]=1")
    assert [sublayer_gain(gains, "decoder_cross_attn", i, 3, 0.2) for i in range(3)] == [0.5, 0.5, 1.0]
    assert sublayer_gain(gains, "decoder_ffn", 0, 3, 0.2) == 0.2


def test_the_init_table_is_the_options_one_list():
    """``--deepnorm-init``'s choices and help come from ``DEEPNORM_INITS``; ``--deepnorm-gains`` merges over
    the init's gains, parsed once per config."""
    from deepnet_fairseq.models.deepnet_transformer import DeepNetConfig
    from deepnet_fairseq.models.deepnorm import DEEPNORM_INITS

    parser = options.get_training_parser()
    ARCH_MODEL_REGISTRY["deepnet_transformer"].add_args(parser)
    action = next(a for a in parser._actions if "--deepnorm-init" in a.option_strings)
    assert sorted(map(str, action.choices)) == sorted(DEEPNORM_INITS)
    assert all(init.description in action.help for init in DEEPNORM_INITS.values())
    cfg = DeepNetConfig(deepnorm_init="source", deepnorm_gains="decoder_cross_attn[-1]=0.5,decoder_ffn=2")
    assert cfg.sublayer_gains == {("decoder_cross_attn", -1): 0.5, ("decoder_ffn", None): 2.0}
    assert cfg.sublayer_gains is cfg.sublayer_gains
    assert DeepNetConfig(deepnorm_init="source").sublayer_gains == DEEPNORM_INITS["source"].gains


def test_preln_and_postln_keep_fairseq_init():
    """The DeepNorm init is the only difference: fairseq's own init elsewhere (xavier_uniform q/k/v, gain 1/sqrt 2)."""
    model = build("preln_transformer", "--encoder-layers", 2, "--decoder-layers", 2)
    w = model.encoder.layers[0].self_attn.v_proj.weight
    bound = (1 / math.sqrt(2)) * math.sqrt(6 / (w.shape[0] + w.shape[1]))
    assert w.abs().max() <= bound + 1e-6 and w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.03)


def test_encoder_sublayers_compute_deepnorm():
    torch.manual_seed(0)
    model = build("deepnet_transformer", "--encoder-layers", 5, "--decoder-layers", 5,
                  "--encoder-embed-dim", 32, "--decoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
                  "--encoder-attention-heads", 4, "--decoder-attention-heads", 4)
    layer = model.encoder.layers[1]
    # make the LayerNorms non-trivial so a wrong placement cannot pass
    for ln in (layer.self_attn_layer_norm, layer.final_layer_norm):
        torch.nn.init.normal_(ln.weight, 1.0, 0.3)
        torch.nn.init.normal_(ln.bias, 0.0, 0.3)
    alpha = deepnorm_constants(5, 5).encoder_alpha
    x = torch.randn(7, 3, 32)  # T x B x C
    with torch.no_grad():
        attn, _ = layer.self_attn(query=x, key=x, value=x, key_padding_mask=None, need_weights=False)
        h = layer.self_attn_layer_norm(alpha * x + attn)
        ffn = layer.fc2(torch.relu(layer.fc1(h)))
        expected = layer.final_layer_norm(alpha * h + ffn)
        got = layer(x, encoder_padding_mask=None)
        plain_postln = layer.final_layer_norm(h + layer.fc2(torch.relu(layer.fc1(h))))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert (got - plain_postln).abs().max() > 0.05  # alpha = 1.34 here: the check can tell the two apart


def test_decoder_sublayers_compute_deepnorm():
    torch.manual_seed(0)
    model = build("deepnet_transformer", "--encoder-layers", 2, "--decoder-layers", 7,
                  "--encoder-embed-dim", 32, "--decoder-embed-dim", 32, "--decoder-ffn-embed-dim", 64,
                  "--encoder-attention-heads", 4, "--decoder-attention-heads", 4)
    layer = model.decoder.layers[3]
    alpha = (3 * 7) ** 0.25
    x, enc = torch.randn(5, 2, 32), torch.randn(6, 2, 32)
    with torch.no_grad():
        a, _ = layer.self_attn(query=x, key=x, value=x, need_weights=False)
        h1 = layer.self_attn_layer_norm(alpha * x + a)
        c, _ = layer.encoder_attn(query=h1, key=enc, value=enc, static_kv=True, need_weights=False)
        h2 = layer.encoder_attn_layer_norm(alpha * h1 + c)
        expected = layer.final_layer_norm(alpha * h2 + layer.fc2(torch.relu(layer.fc1(h2))))
        got, _, _ = layer(x, encoder_out=enc, encoder_padding_mask=None)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_layer_norm_placement():
    deep = build("deepnet_transformer", "--encoder-layers", 2, "--decoder-layers", 2)
    pre = build("preln_transformer", "--encoder-layers", 2, "--decoder-layers", 2)
    assert deep.encoder.layer_norm is None and deep.decoder.layer_norm is None
    assert not deep.encoder.layers[0].normalize_before and not deep.decoder.layers[0].normalize_before
    assert pre.encoder.layer_norm is not None and pre.decoder.layer_norm is not None
    assert pre.encoder.layers[0].normalize_before and pre.decoder.layers[0].normalize_before


@pytest.mark.parametrize("family", ["deepnet_transformer", "preln_transformer"])
@pytest.mark.parametrize("variant,shape", [
    ("iwslt_de_en", (512, 1024, 4)), ("wmt_en_de", (512, 2048, 8)), ("wmt_en_de_big", (1024, 4096, 16)),
    ("opus100", (512, 2048, 8)), ("m2m_102", (1024, 4096, 16)),
])
def test_size_variants(family, variant, shape):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["/dev/null", "--user-dir", "deepnet_fairseq", "--arch",
                                                f"{family}_{variant}", "--encoder-layers", "9"])
    ARCH_MODEL_REGISTRY[args.arch]  # registered
    from fairseq.models import ARCH_CONFIG_REGISTRY
    ARCH_CONFIG_REGISTRY[args.arch](args)
    got = (args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_attention_heads)
    assert got == shape and args.decoder_embed_dim == shape[0] and args.encoder_layers == 9
    assert args.encoder_normalize_before == (family == "preln_transformer")


def sublayer_grad_norms(arch, layers, seed=0):
    """Gradient norm of each decoder layer's FFN fc2 weight at initialisation (Xiong et al. Fig. 3)."""
    torch.manual_seed(seed)
    model = build(arch, "--encoder-layers", layers, "--decoder-layers", layers, "--dropout", 0,
                  "--encoder-embed-dim", 64, "--decoder-embed-dim", 64, "--encoder-ffn-embed-dim", 128,
                  "--decoder-ffn-embed-dim", 128, "--encoder-attention-heads", 4, "--decoder-attention-heads", 4,
                  vocab=60)
    model.train()
    gen = torch.Generator().manual_seed(123)
    src = torch.randint(4, 60, (16, 12), generator=gen)
    tgt = torch.randint(4, 60, (16, 12), generator=gen)
    prev = torch.cat([torch.full((16, 1), 2), tgt[:, :-1]], dim=1)
    out, _ = model(src, torch.full((16,), 12), prev)
    torch.nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), tgt.reshape(-1)).backward()
    return [layer.fc2.weight.grad.norm().item() for layer in model.decoder.layers]


def test_preln_gradients_are_flat_by_layer_and_postln_grow_toward_the_top():
    post = sublayer_grad_norms("transformer", 12)
    pre = sublayer_grad_norms("preln_transformer", 12)
    # Post-LN: the top layers get much larger gradients than the bottom ones at initialisation
    assert post[-1] / post[0] > 3.0, post
    # Pre-LN: of the same order in every layer
    assert max(pre) / min(pre) < 2.5, pre


def small(arch, *extra):
    return build(arch, "--encoder-layers", 6, "--decoder-layers", 6, "--encoder-embed-dim", 32,
                 "--decoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64, "--decoder-ffn-embed-dim", 64,
                 "--encoder-attention-heads", 4, "--decoder-attention-heads", 4, "--dropout", 0.1, *extra)


@pytest.mark.parametrize("arch", ["deepnet_transformer", "preln_transformer"])
def test_incremental_beam_search_equals_full_sequence_scoring(arch):
    """fairseq's own idiom: positional scores of beam search (incremental) == teacher-forced scoring."""
    from fairseq.sequence_generator import SequenceGenerator
    from fairseq.sequence_scorer import SequenceScorer

    torch.manual_seed(0)
    model = small(arch, "--share-all-embeddings")
    task = ToyTask()
    d = task.target_dictionary
    src = torch.randint(4, len(d), (4, 9))
    src[:, -1] = d.eos()
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.full((4,), 9)}}
    gen = SequenceGenerator([model], d, beam_size=3, max_len_b=12)
    hypos = gen.forward(sample)
    scorer = SequenceScorer(d)
    for i, beams in enumerate(hypos):
        tokens = beams[0]["tokens"]
        prev = torch.cat([tokens.new_tensor([d.eos()]), tokens[:-1]]).unsqueeze(0)
        scored = scorer.generate([model], {"net_input": {"src_tokens": src[i : i + 1], "src_lengths": torch.tensor([9]),
                                                         "prev_output_tokens": prev},
                                           "target": tokens.unsqueeze(0)})
        torch.testing.assert_close(scored[0][0]["positional_scores"], beams[0]["positional_scores"], rtol=1e-4, atol=1e-4)


def test_activation_checkpointing_and_shared_embeddings_change_nothing():
    def loss_and_grads(*extra):
        torch.manual_seed(0)
        model = small("deepnet_transformer", "--dropout", 0, *extra)
        model.train()
        gen = torch.Generator().manual_seed(1)
        src, tgt = torch.randint(4, 50, (3, 8), generator=gen), torch.randint(4, 50, (3, 8), generator=gen)
        out, _ = model(src, torch.full((3,), 8), tgt)
        loss = out.logsumexp(-1).mean() - out.gather(-1, tgt.unsqueeze(-1)).mean()
        loss.backward()
        return loss.item(), model.decoder.layers[0].fc1.weight.grad.clone() if not extra else None, model

    base_loss, base_grad, _ = loss_and_grads()
    ckpt_loss, _, ckpt_model = loss_and_grads("--checkpoint-activations")
    assert ckpt_loss == pytest.approx(base_loss, abs=1e-6)
    layer = ckpt_model.decoder.layers[0]
    torch.testing.assert_close(layer.fc1.weight.grad, base_grad)
    _, _, shared = loss_and_grads("--share-all-embeddings")
    assert shared.encoder.embed_tokens.weight is shared.decoder.embed_tokens.weight
    assert shared.decoder.output_projection.weight is shared.decoder.embed_tokens.weight


def test_bf16_forward_backward_on_cpu():
    """fairseq's --bf16/--fp16 trainers need a GPU; the model itself runs in bf16 (checked on GPU by benchmarks/gpu_check.sh)."""
    torch.manual_seed(0)
    model = small("deepnet_transformer").to(torch.bfloat16).train()
    src = torch.randint(4, 50, (2, 6))
    out, _ = model(src, torch.full((2,), 6), src)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    out.float().logsumexp(-1).mean().backward()
    assert all(torch.isfinite(p.grad.float()).all() for p in model.parameters() if p.grad is not None)
