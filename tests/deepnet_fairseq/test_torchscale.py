"""The plugin's DeepNorm against Microsoft's own implementation, torchscale 0.3.0 (docs/torchscale.md).

torchscale's ``EncoderDecoder`` with ``deepnorm=True`` is built as its fairseq translation example
(examples/fairseq/models/machine_translation.py) builds it: fairseq's token embeddings and sinusoidal
positions, sqrt(d) embedding scale, relu, and the padding masks of source and target passed to its
encoder and decoder.

1. Forward: the plugin's weights copied into torchscale's model (renaming only ``fc1``/``fc2`` to
   ``ffn.fc1``/``ffn.fc2``) give the same logits on padded batches.
2. Init: ``--deepnorm-init torchscale`` gives every parameter group the mean and std of a fresh
   torchscale model of the same shape; the default (the paper's) differs from it.

torchscale imports ``fairscale.nn`` (activation checkpointing, FSDP) and ``timm`` (``drop_path``, whose
package needs torchvision) at module level; these tests use none of the three features, so during the
import small stand-ins take their place, which fail if torchscale ever calls them.
"""

import re
import shlex
import sys
import types
from importlib.metadata import version
from unittest import mock

import pytest
import torch

from deepnet_fairseq.models import deepnorm_constants
from fairseq.models.transformer import Embedding
from fairseq.modules import PositionalEmbedding
from conftest import ROOT
from test_models import ToyTask, build


def refuse(name):
    def called(*args, **kwargs):
        raise AssertionError(f"torchscale called {name}, which these tests' stand-in does not provide")
    return called


def stand_in(name, **functions):
    module = types.ModuleType(name)
    module.__dict__.update(functions)
    return module


STAND_INS = {
    "fairscale": stand_in("fairscale"),
    "fairscale.nn": stand_in("fairscale.nn", checkpoint_wrapper=refuse("checkpoint_wrapper"), wrap=refuse("wrap")),
    "timm": stand_in("timm"),
    "timm.models": stand_in("timm.models"),
    "timm.models.layers": stand_in("timm.models.layers", drop_path=refuse("drop_path")),
}

with mock.patch.dict(sys.modules, STAND_INS):  # sys.modules is restored afterwards, stand-ins removed
    from torchscale.architecture.config import EncoderDecoderConfig
    from torchscale.architecture.encoder_decoder import EncoderDecoder

TOLERANCE = 1e-5  # on logits
VOCAB = 50  # words; fairseq's dictionary adds its 4 special symbols
PAD = ToyTask(VOCAB).source_dictionary.pad()
VOCAB_SIZE = len(ToyTask(VOCAB).source_dictionary)


def shape_options(n, m, dim, ffn, heads):
    return ["--encoder-layers", n, "--decoder-layers", m, "--encoder-embed-dim", dim, "--decoder-embed-dim", dim,
            "--encoder-ffn-embed-dim", ffn, "--decoder-ffn-embed-dim", ffn,
            "--encoder-attention-heads", heads, "--decoder-attention-heads", heads]


def torchscale_model(n, m, dim, ffn, heads, share_all_embeddings=False):
    """torchscale's DeepNorm encoder-decoder, assembled as its fairseq translation example does."""
    config = EncoderDecoderConfig(
        encoder_layers=n, decoder_layers=m, encoder_embed_dim=dim, decoder_embed_dim=dim,
        encoder_ffn_embed_dim=ffn, decoder_ffn_embed_dim=ffn,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        deepnorm=True, activation_fn="relu", no_scale_embedding=False, dropout=0.1,
        share_all_embeddings=share_all_embeddings, max_source_positions=1024, max_target_positions=1024)
    encoder_embed = Embedding(VOCAB_SIZE, dim, PAD)
    decoder_embed = encoder_embed if share_all_embeddings else Embedding(VOCAB_SIZE, dim, PAD)
    output_projection = torch.nn.Linear(dim, VOCAB_SIZE, bias=False)
    if share_all_embeddings:
        output_projection.weight = decoder_embed.weight
    else:
        torch.nn.init.normal_(output_projection.weight, mean=0, std=dim**-0.5)
    return EncoderDecoder(
        config, encoder_embed_tokens=encoder_embed, decoder_embed_tokens=decoder_embed,
        encoder_embed_positions=PositionalEmbedding(1024, dim, PAD, learned=False),
        decoder_embed_positions=PositionalEmbedding(1024, dim, PAD, learned=False),
        output_projection=output_projection).eval()


PLUGIN_ONLY_BUFFERS = re.compile(r"(deepnorm_alpha|\.version|_float_tensor)$")


def torchscale_state_dict(plugin):
    """The plugin's state dict under torchscale's names: ``fc1``/``fc2`` live in ``ffn`` there."""
    return {re.sub(r"\.(fc[12])\.", r".ffn.\1.", name): tensor for name, tensor in plugin.state_dict().items()
            if not PLUGIN_ONLY_BUFFERS.search(name)}


def padded_batch(seed, sentences=4, max_len=9):
    """fairseq's layout: sources padded on the left and ending in </s>, targets padded on the right."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.full((sentences, max_len), PAD)
    prev = torch.full((sentences, max_len + 1), PAD)
    lengths = [max_len, max_len - 3, 4, 2][:sentences]
    for row, length in enumerate(lengths):
        src[row, max_len - length:] = torch.randint(4, VOCAB_SIZE, (length,), generator=gen)
        src[row, -1] = 2  # </s>
        tgt_len = 1 + (length + row) % max_len
        prev[row, 0] = 2  # </s> starts the decoder input
        prev[row, 1:tgt_len] = torch.randint(4, VOCAB_SIZE, (tgt_len - 1,), generator=gen)
    return src, torch.tensor(lengths), prev


@pytest.mark.parametrize("n,m,share_all_embeddings", [(6, 4, False), (18, 18, True)])
def test_forward_equals_torchscale_with_copied_weights(n, m, share_all_embeddings):
    dim, ffn, heads = 32, 64, 4
    torch.manual_seed(0)
    plugin = build("deepnet_transformer", *shape_options(n, m, dim, ffn, heads), "--dropout", 0.1,
                   *(["--share-all-embeddings"] if share_all_embeddings else []), vocab=VOCAB)
    with torch.no_grad():  # non-trivial LayerNorms and biases, so a misplaced norm or bias cannot pass
        for p in plugin.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    reference = torchscale_model(n, m, dim, ffn, heads, share_all_embeddings)
    reference.load_state_dict(torchscale_state_dict(plugin), strict=True)  # every tensor has its counterpart
    assert [layer.alpha for layer in reference.encoder.layers] == pytest.approx(
        [layer.deepnorm_alpha.item() for layer in plugin.encoder.layers], rel=1e-6)
    assert [layer.alpha for layer in reference.decoder.layers] == pytest.approx(
        [layer.deepnorm_alpha.item() for layer in plugin.decoder.layers], rel=1e-6)

    src, lengths, prev = padded_batch(seed=n)

    def reference_logits():
        encoder_out = reference.encoder(src, encoder_padding_mask=src.eq(PAD))
        return reference.decoder(prev, self_attn_padding_mask=prev.eq(PAD), encoder_out=encoder_out)[0]

    with torch.no_grad():
        ours, _ = plugin(src, lengths, prev)
        difference = (ours - reference_logits()).abs().max().item()
        print(f"{n}L-{m}L: max |logit difference| {difference:.2e} (logit std {ours.std():.3f}, "
              f"{int(src.eq(PAD).sum())} padded source and {int(prev.eq(PAD).sum())} padded target positions)")
        assert ours.std() > 0.3  # logits of a real computation, not of a constant
        assert difference < TOLERANCE

        for layer in reference.encoder.layers:  # the tolerance catches an encoder alpha 1% off
            layer.alpha *= 1.01
        assert (ours - reference_logits()).abs().max() > 10 * TOLERANCE


def test_the_reference_is_torchscale_0_3_0():
    assert version("torchscale") == "0.3.0"


def parameter_groups(state_dict):
    """Tensors pooled over layers ("encoder.layers.*.ffn.fc1.bias"), without the plugin's own buffers."""
    groups = {}
    for name, tensor in state_dict.items():
        if not PLUGIN_ONLY_BUFFERS.search(name):
            groups.setdefault(re.sub(r"\.layers\.\d+\.", ".layers.*.", name), []).append(tensor.flatten())
    return {name: torch.cat(tensors) for name, tensors in groups.items()}


INIT_SHAPE = dict(n=12, m=8, dim=256, ffn=1024, heads=4)  # pools of >= 2,048 biases: std estimates within ~1%


def init_statistics():
    """{model: {parameter group: (mean, std)}}: a fresh torchscale model, and the plugin with each init."""
    n, m, dim, ffn, heads = INIT_SHAPE.values()
    torch.manual_seed(0)
    reference = parameter_groups(torchscale_model(n, m, dim, ffn, heads).state_dict())
    stats = {"torchscale 0.3.0": {name: (t.mean().item(), t.std().item()) for name, t in reference.items()}}
    for init in ("torchscale", "paper"):
        torch.manual_seed(1)
        plugin = build("deepnet_transformer", *shape_options(n, m, dim, ffn, heads), "--deepnorm-init", init,
                       vocab=VOCAB)
        groups = parameter_groups(torchscale_state_dict(plugin))
        assert {name: t.shape for name, t in groups.items()} == {name: t.shape for name, t in reference.items()}
        stats[f"--deepnorm-init {init}"] = {name: (t.mean().item(), t.std().item()) for name, t in groups.items()}
    return stats


PROJECTION = re.compile(r"\.layers\.\*\..*(proj|fc[12])\.(weight|bias)$")
QUERY_KEY_BIAS = re.compile(r"[qk]_proj\.bias$")  # PyTorch's default in both inits


def test_torchscale_init_has_the_statistics_of_a_fresh_torchscale_model():
    stats = init_statistics()
    reference, ours, paper = (stats[key] for key in ("torchscale 0.3.0", "--deepnorm-init torchscale",
                                                     "--deepnorm-init paper"))
    shape = "{n}L-{m}L, d{dim}, FFN {ffn}".format(**INIT_SHAPE)
    print(f"\n{'std of parameter group (' + shape + ')':46s} {'torchscale':>10s} {'ours':>8s} {'paper':>8s}")
    for name, (mean, std) in reference.items():
        print(f"{name:46s} {std:10.4f} {ours[name][1]:8.4f} {paper[name][1]:8.4f}")
        assert ours[name][1] == pytest.approx(std, rel=0.05, abs=1e-12), name
        assert ours[name][0] == pytest.approx(mean, abs=0.1 * std + 1e-12), name
    projections = [name for name in reference if PROJECTION.search(name)]
    assert len(projections) == 2 * (4 + 2 + 8 + 2)  # weights and biases of q,k,v,out,fc1,fc2 (decoder: 2 attentions)
    for name in projections:  # the paper's init is another one: every projection but the q/k biases differs
        same = paper[name][1] == pytest.approx(reference[name][1], rel=0.05)
        assert same == bool(QUERY_KEY_BIAS.search(name)), (name, paper[name][1], reference[name][1])


def test_torchscale_betas():
    n, m = 18, 12
    ours, paper = deepnorm_constants(n, m, init="torchscale"), deepnorm_constants(n, m)
    assert ours.encoder_beta == pytest.approx((n**4 * m) ** (-1 / 16) * 1.15)  # torchscale divides by (N^4 M)^(1/16)/1.15
    assert ours.encoder_beta / paper.encoder_beta == pytest.approx(1.15 / 0.87)
    assert (ours.encoder_alpha, ours.decoder_alpha, ours.decoder_beta) == \
        (paper.encoder_alpha, paper.decoder_alpha, paper.decoder_beta)
    for stacks in ((n, 0), (0, m)):  # encoder-only and decoder-only: torchscale uses the paper's (8L)^(-1/4)
        assert deepnorm_constants(*stacks, init="torchscale") == deepnorm_constants(*stacks)
    with pytest.raises(ValueError, match="--deepnorm-init"):
        deepnorm_constants(n, m, init="xavier")


def test_setup_extra_args_reach_the_model(capsys):
    """The setups' ``train.extra_args`` puts the flag on the fairseq-train command; fairseq's parser takes it
    to the model."""
    from deepnet_setups import launch
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    assert launch.main([str(ROOT / "configs" / "iwslt14_de_en.yaml"), "train.extra_args=[--deepnorm-init, torchscale]",
                        "--arch", "deepnet", "--layers", "3,2", "--cpu", "--dry-run"]) == 0
    argv = shlex.split(capsys.readouterr().out.splitlines()[-1])[1:]  # the fairseq-train command's options
    assert argv[-2:] == ["--deepnorm-init", "torchscale"]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    model = ARCH_MODEL_REGISTRY[args.arch].build_model(args, ToyTask(VOCAB))
    attention = model.encoder.layers[0].self_attn
    dim = attention.q_proj.weight.shape[1]
    # PyTorch's default Linear init (torchscale's), not the paper's xavier_normal_ (std 1/sqrt(dim) here)
    assert attention.q_proj.weight.std().item() == pytest.approx((3 * dim) ** -0.5, rel=0.03)
    assert attention.out_proj.bias.abs().max() > 0  # fairseq and the paper's init leave it at 0



def branch_to_residual_ratios(model, src, prev):
    """Mean over each stack's sublayers of ||G(x)|| / ||alpha x||: DeepNorm's branch against its residual."""
    ratios = {"encoder": [], "decoder": []}
    for stack, found in ratios.items():
        for layer in getattr(model, stack).layers:
            def recording(x, residual, layer=layer, residual_connection=layer.residual_connection, found=found):
                found.append((x.norm() / (layer.deepnorm_alpha * residual).norm()).item())
                return residual_connection(x, residual)
            layer.residual_connection = recording
    with torch.no_grad():
        model(src, torch.full((src.size(0),), src.size(1)), prev)
    return {stack: sum(found) / len(found) for stack, found in ratios.items()}


@pytest.mark.parametrize("depth", [6, 18, 50])
def test_torchscale_init_starts_with_smaller_branches(depth):
    """At the stability map's 64-128-2 shape: the numbers of docs/torchscale.md, and their direction."""
    gen = torch.Generator().manual_seed(0)
    src, prev = (torch.randint(4, VOCAB_SIZE, (16, 12), generator=gen) for _ in range(2))
    ratios = {}
    for init in ("paper", "torchscale"):
        torch.manual_seed(0)
        model = build("deepnet_transformer", *shape_options(depth, depth, 64, 128, 2), "--deepnorm-init", init,
                      vocab=VOCAB)
        ratios[init] = branch_to_residual_ratios(model, src, prev)
    print(f"{depth}L-{depth}L ||G(x)||/||alpha x||: " + ", ".join(
        f"{stack} paper {ratios['paper'][stack]:.3f} torchscale {ratios['torchscale'][stack]:.3f}"
        for stack in ("encoder", "decoder")))
    for stack in ("encoder", "decoder"):
        assert ratios["torchscale"][stack] < 0.8 * ratios["paper"][stack]
