"""DeepNorm for decoder-only (deepnet_transformer_lm) and encoder-only (deepnet_roberta) models."""

import json
import math
from argparse import Namespace

import pytest
import torch
from fairseq import options, tasks, utils
from fairseq.data import Dictionary

from conftest import BIN, USER_DIR, run

utils.import_user_module(Namespace(user_dir=USER_DIR))  # registers the architectures

D, FFN = 64, 256
LM_SHAPE = ["--decoder-embed-dim", D, "--decoder-ffn-embed-dim", FFN, "--decoder-attention-heads", 4]
MLM_SHAPE = ["--encoder-embed-dim", D, "--encoder-ffn-embed-dim", FFN, "--encoder-attention-heads", 4]


@pytest.fixture(scope="module")
def dict_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("lm_dict")
    vocab = Dictionary()
    for i in range(96):
        vocab.add_symbol(f"w{i}")
    vocab.save(str(path / "dict.txt"))
    return path


def build(dict_dir, task, arch, *extra):
    torch.manual_seed(1)
    argv = [dict_dir, "--user-dir", USER_DIR, "--task", task, "--arch", arch, "--cpu", "--tokens-per-sample", 64,
            *extra]
    args = options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in argv])
    task = tasks.setup_task(args)
    return task.build_model(args).eval(), task


def xavier_std(weight, gain):
    fan_out, fan_in = weight.shape
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def check_deepnorm_layer(layer, alpha, beta, x, attn_mask=None):
    """Init gains (beta for FFN/value/output, 1 for query/key) and x <- LN(alpha x + G(x))."""
    assert layer.deepnorm_alpha == pytest.approx(alpha)
    for weight, gain in ((layer.fc1.weight, beta), (layer.fc2.weight, beta), (layer.self_attn.v_proj.weight, beta),
                         (layer.self_attn.out_proj.weight, beta), (layer.self_attn.q_proj.weight, 1.0),
                         (layer.self_attn.k_proj.weight, 1.0)):
        assert weight.std().item() == pytest.approx(xavier_std(weight, gain), rel=0.06)
    attn = layer.self_attn(query=x, key=x, value=x, key_padding_mask=None, need_weights=False, attn_mask=attn_mask)[0]
    h = layer.self_attn_layer_norm(alpha * x + attn)
    return layer.final_layer_norm(alpha * h + layer.fc2(layer.activation_fn(layer.fc1(h))))


def test_decoder_only_constants_init_and_residual(dict_dir):
    m = 6
    model, _ = build(dict_dir, "language_modeling", "deepnet_transformer_lm", "--decoder-layers", m, *LM_SHAPE)
    alpha, beta = (2 * m) ** 0.25, (8 * m) ** -0.25
    assert model.decoder.layer_norm is None  # Post-LN placement, no final norm
    x = torch.randn(5, 2, D, generator=torch.Generator().manual_seed(0))
    for layer in model.decoder.layers:
        assert layer.encoder_attn is None
        expected = check_deepnorm_layer(layer, alpha, beta, x)
        torch.testing.assert_close(layer(x)[0], expected)
    model_override, _ = build(dict_dir, "language_modeling", "deepnet_transformer_lm", "--decoder-layers", m,
                              "--deepnorm-decoder-alpha", 3.5, *LM_SHAPE)
    assert model_override.decoder.layers[0].deepnorm_alpha == 3.5
    with pytest.raises(ValueError, match="Post-LN"):
        build(dict_dir, "language_modeling", "deepnet_transformer_lm", "--decoder-normalize-before", *LM_SHAPE)


def test_encoder_only_constants_init_and_residual(dict_dir):
    n = 6
    model, task = build(dict_dir, "masked_lm", "deepnet_roberta", "--encoder-layers", n, *MLM_SHAPE)
    alpha, beta = (2 * n) ** 0.25, (8 * n) ** -0.25
    encoder = model.encoder.sentence_encoder
    x = torch.randn(5, 2, D, generator=torch.Generator().manual_seed(0))
    for layer in encoder.layers:  # DeepNorm's init survives RoBERTa's N(0, 0.02) re-init
        torch.testing.assert_close(layer(x, None), check_deepnorm_layer(layer, alpha, beta, x))
    # one masked-LM training step: finite loss and gradients
    model.train()
    tokens = torch.randint(4, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    logits, _ = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), tokens.view(-1))
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.slow  # ~22 s of fairseq-train; make test keeps the constants and residual tests
def test_deepnet_lm_trains_with_fairseq_language_modeling(tmp_path, multi30k):
    text = (multi30k / "train.en").read_text(encoding="utf-8").splitlines()
    for split, lines in (("train", text[:600]), ("valid", text[600:650])):
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run([BIN / "fairseq-preprocess", "--only-source", "--trainpref", tmp_path / "train.txt", "--validpref",
         tmp_path / "valid.txt", "--destdir", tmp_path / "bin", "--workers", "1"])
    log = run([BIN / "fairseq-train", tmp_path / "bin", "--user-dir", USER_DIR, "--task", "language_modeling",
               "--arch", "deepnet_transformer_lm", "--decoder-layers", 6, *LM_SHAPE, "--tokens-per-sample", 64,
               "--share-decoder-input-output-embed", "--optimizer", "adam", "--lr", 1e-3, "--lr-scheduler",
               "inverse_sqrt", "--warmup-updates", 5, "--max-tokens", 1024, "--max-update", 20, "--cpu",
               "--no-save", "--save-dir", tmp_path / "checkpoints", "--log-format", "json", "--log-interval", 1, "--seed", 1, "--num-workers", 0]).stdout
    records = [json.loads(line.split("|", 3)[-1]) for line in log.splitlines() if "| train_inner |" in line]
    losses = [float(r["loss"]) for r in records]
    assert len(losses) == 20 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 1.0  # learns: at least 1 bit/token lower
    assert "| valid |" in log
