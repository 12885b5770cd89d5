"""CrossConST (``--crossconst-alpha`` of ``diagnostic_label_smoothed_cross_entropy``; criterions/crossconst.py).

In process, on conftest's 400-pair Multi30k slice (joined dictionary) with a 2L-2L d64 model: the target-as-source
input for each padding and each language-tag strategy of the multilingual task, the term's direction and value,
zero for a batch whose source is its target, the loss and the number of forwards unchanged with alpha 0, the option
through the setups' config and launcher. Through fairseq-train (translation_exact_resume, dropout on): a run
stopped at update 3 and resumed to 6 logs the uninterrupted run's losses and crossconst and ends with its
parameters; that model exports to plain fairseq and fairseq-generate decodes it as the original.
"""

import json
import math
import re
from types import SimpleNamespace

import pytest
import torch

from conftest import BIN, ROOT, TINY_MODEL, USER_DIR, run
from test_deploy import export_to, fairseq_generate_valid

from deepnet_fairseq.criterions.crossconst import CrossConSTError, TargetAsSource, first_token, target_as_source
from deepnet_setups import config as cfgmod
from deepnet_setups import launch, lang_tags
from deepnet_setups.runner import fairseq_options

CRITERION = "diagnostic_label_smoothed_cross_entropy"
PAD = 1


def build(data, *extra, dropout="0.0"):
    """fairseq's build path (as fairseq-train): task, a 2L-2L d64 Transformer, the plugin's criterion, batches."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    torch.set_num_threads(1)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", USER_DIR, "--arch", "transformer", "--encoder-layers", "2", "--decoder-layers", "2",
        *TINY_MODEL, "--share-all-embeddings", "--dropout", dropout, "--cpu", "--seed", "1",
        "--criterion", CRITERION, "--label-smoothing", "0.1", *extra])
    cfg = convert_namespace_to_omegaconf(args)
    utils.set_torch_seed(1)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=600, seed=1).next_epoch_itr(shuffle=False)
    return task, model, criterion, [next(batches) for _ in range(2)], cfg


@pytest.fixture(scope="module")
def bilingual(multi30k_small_bin):
    return build(multi30k_small_bin, "--task", "translation_exact_resume")


def counted(model):
    """The model with a counter of its forwards (``model.forwards``)."""
    model.forwards = 0
    model.register_forward_hook(lambda *_: setattr(model, "forwards", model.forwards + 1))
    return model


def criterion_with(task, cfg, **options):
    """The plugin's criterion as ``cfg`` sets it, with ``options`` changed."""
    from omegaconf import OmegaConf

    return task.build_criterion(OmegaConf.create({**OmegaConf.to_container(cfg.criterion, resolve=True), **options}))


# -- the target-as-source input ---------------------------------------------------------------------------

def test_target_as_source_keeps_each_target_in_order_padded_as_the_task_pads_sources():
    right = torch.tensor([[5, 6, 7, 2], [8, 2, PAD, PAD], [9, 10, 2, PAD]])  # fairseq's targets: right-padded
    left = torch.tensor([[5, 6, 7, 2], [PAD, PAD, 8, 2], [PAD, 9, 10, 2]])
    for target in (right, left):
        assert torch.equal(target_as_source(target, PAD, left_pad=True), left)
        assert torch.equal(target_as_source(target, PAD, left_pad=False), right)
    tags = torch.tensor([50, 51, 52])
    assert target_as_source(right, PAD, True, tags).tolist() == [[50, 5, 6, 7, 2], [PAD, PAD, 51, 8, 2],
                                                                 [PAD, 52, 9, 10, 2]]
    assert target_as_source(right, PAD, False, tags, drop_first=True).tolist() == [[50, 6, 7, 2], [51, 2, PAD, PAD],
                                                                                   [52, 10, 2, PAD]]
    assert first_token(left, PAD).tolist() == first_token(right, PAD).tolist() == [5, 8, 9]


def multilingual_task(data, tag_options, *extra):
    """fairseq's multilingual task on the slice, de-en and en-de, and a batch that mixes the two directions."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", USER_DIR, "--arch", "transformer", *TINY_MODEL, "--encoder-layers", "2",
        "--decoder-layers", "2", "--task", "translation_multi_simple_epoch", "--lang-pairs", "de-en,en-de",
        "--langs", "de,en", *tag_options, "--cpu", "--criterion", CRITERION, "--crossconst-alpha", "0.5", *extra]))
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train", epoch=1)
    batch = next(task.get_batch_iterator(task.dataset("train"), max_tokens=400, seed=1).next_epoch_itr(shuffle=True))
    return task, cfg, batch


@pytest.mark.parametrize("strategy", list(lang_tags.STRATEGIES))
def test_each_tag_strategy_gives_the_target_language_tag_before_the_target_sentence(multi30k_small_bin, strategy):
    """De-en and en-de in one batch, under each strategy of lang_tags.py: each row's target-as-source is
    ``__<target language>__ <its target sentence> </s>``, left-padded as the task's sources: the tag the strategy
    puts on the encoder for a sentence in the target language translated into that language."""
    task, cfg, batch = multilingual_task(multi30k_small_bin, fairseq_options(lang_tags.task_options(strategy)))
    dictionary = task.source_dictionary
    de, en = dictionary.index("__de__"), dictionary.index("__en__")
    source_tags = first_token(batch["net_input"]["src_tokens"], PAD).tolist()  # the task's own encoder tags
    assert set(source_tags) == {de, en}, "one direction only in the batch"
    # the target language of each row: the source's tag under T-ENC, the other language under S-ENC
    target_tags = [{de: en, en: de}[tag] if strategy == "s-enc-t-dec" else tag for tag in source_tags]
    net_input = TargetAsSource(task)(batch)
    mirror = net_input["src_tokens"]
    assert mirror[:, -1].eq(dictionary.eos()).all() and mirror[:, 0].eq(PAD).any()  # left-padded, as the sources
    assert torch.equal(net_input["src_lengths"], mirror.ne(PAD).sum(1))
    decoder_tag = lang_tags.STRATEGIES[strategy]["decoder_langtok"]
    for row, target, tag in zip(mirror, batch["target"], target_tags):
        sentence = target[target.ne(PAD)].tolist()
        if decoder_tag:
            assert sentence[0] == tag
            sentence = sentence[1:]
        assert row[row.ne(PAD)].tolist() == [tag] + sentence
    assert torch.equal(net_input["prev_output_tokens"], batch["net_input"]["prev_output_tokens"])

    # and the criterion trains with it on the task's model (its dictionary holds the tags)
    model, criterion = counted(task.build_model(cfg.model)), task.build_criterion(cfg.criterion)
    model.train()
    loss, _, logging_output = criterion(model, batch)
    loss.backward()
    assert model.forwards == 2 and logging_output["crossconst"] > 0


def test_layouts_it_cannot_build_are_refused_in_one_line(multi30k_small_bin):
    from fairseq.data import Dictionary

    # the source's tag in the encoder and none in the decoder: the target language is nowhere in a mixed batch
    task, cfg, _ = multilingual_task(multi30k_small_bin, ["--encoder-langtok", "src"])
    with pytest.raises(CrossConSTError, match="--encoder-langtok src needs --decoder-langtok"):
        task.build_criterion(cfg.criterion)
    other = Dictionary()
    other.add_symbol("extra")
    with pytest.raises(CrossConSTError, match="one dictionary"):
        TargetAsSource(SimpleNamespace(cfg=SimpleNamespace(left_pad_source=True), source_dictionary=Dictionary(),
                                       target_dictionary=other))
    with pytest.raises(CrossConSTError, match="lang-tok-replacing-bos-eos"):
        TargetAsSource(SimpleNamespace(cfg=None, args=SimpleNamespace(
            encoder_langtok="tgt", decoder_langtok=False, lang_tok_replacing_bos_eos=True),
            source_dictionary=Dictionary(), target_dictionary=Dictionary()))


# -- the term ---------------------------------------------------------------------------------------------

def test_the_term_is_kl_of_the_source_given_distribution_from_the_target_given_one(bilingual):
    """crossconst = sum over target tokens of KL(f(x) || f(y)) (torch's kl_div with f(y) as input, the authors'
    call), per token in bits; the loss is the cross-entropy plus alpha times it; gradients reach the model."""
    task, model, _, samples, cfg = bilingual
    sample = samples[0]
    model.train()
    plain, with_term = criterion_with(task, cfg), criterion_with(task, cfg, crossconst_alpha=0.25)
    ce, sample_size, ce_log = plain(model, sample)
    loss, _, log = with_term(model, sample)
    with torch.no_grad():  # dropout 0: the same two distributions again
        lprobs_x = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
        net_input = dict(sample["net_input"], src_tokens=target_as_source(sample["target"], PAD, True))
        net_input["src_lengths"] = net_input["src_tokens"].ne(PAD).sum(1)
        lprobs_y = model.get_normalized_probs(model(**net_input), log_probs=True)
    tokens = sample["target"].ne(PAD)
    kl = torch.nn.functional.kl_div(lprobs_y, lprobs_x.exp(), reduction="none").sum(-1)[tokens].sum()
    reverse = torch.nn.functional.kl_div(lprobs_x, lprobs_y.exp(), reduction="none").sum(-1)[tokens].sum()
    assert float(log["crossconst"]) == pytest.approx(float(kl), rel=1e-4)
    assert abs(float(kl) - float(reverse)) > 1e-3 * float(kl)  # the direction matters, and is the authors'
    assert loss.item() == pytest.approx(ce.item() + 0.25 * float(kl), rel=1e-6)
    assert float(log["nll_loss"]) == float(ce_log["nll_loss"])
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()

    from fairseq import metrics

    with metrics.aggregate(new_root=True) as agg:  # two micro-batches, as fairseq sums them
        type(with_term).reduce_metrics([log, log])
        values = agg.get_smoothed_values()
    assert values["crossconst"] == pytest.approx(float(kl) / sample_size / math.log(2), abs=1e-3)
    assert values["loss"] == pytest.approx(ce.item() / sample_size / math.log(2) + 0.25 * values["crossconst"],
                                           abs=2e-3)


def test_the_term_is_zero_when_the_source_is_the_target(bilingual):
    """A batch whose sources are its targets (left-padded, as the task pads sources): the two forwards are one
    computation, KL 0, and the loss is the cross-entropy bitwise."""
    task, model, _, samples, cfg = bilingual
    sample = samples[1]
    source = target_as_source(sample["target"], PAD, True)
    sample = {**sample, "net_input": dict(sample["net_input"], src_tokens=source, src_lengths=source.ne(PAD).sum(1))}
    model.train()
    ce, _, _ = criterion_with(task, cfg)(model, sample)
    loss, _, log = criterion_with(task, cfg, crossconst_alpha=0.25)(model, sample)
    assert float(log["crossconst"]) == 0.0
    assert torch.equal(loss, ce)


def test_with_alpha_0_the_loss_is_fairseqs_bitwise_and_there_is_no_second_forward(multi30k_small_bin):
    """Dropout on (the same seed before each call): fairseq's own criterion, this one without the option and with
    alpha 0 give the same loss, nll_loss and gradients bitwise, in one forward; with alpha, two forwards in training
    and one in evaluation (no term there). With --diag-ln-inputs, the logged LayerNorm inputs are the first
    forward's."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    task, model, _, samples, cfg = build(multi30k_small_bin, "--task", "translation_exact_resume", dropout="0.1")
    model = counted(model)
    fairseqs = LabelSmoothedCrossEntropyCriterion(task, False, 0.1)
    results = []
    for criterion in (fairseqs, criterion_with(task, cfg), criterion_with(task, cfg, crossconst_alpha=0.0)):
        model.train()
        model.zero_grad()
        model.forwards = 0
        torch.manual_seed(7)
        loss, _, log = criterion(model, samples[0])
        loss.backward()
        assert model.forwards == 1 and "crossconst" not in log
        results.append((loss.detach(), log["nll_loss"], [p.grad.clone() for p in model.parameters()]))
    for loss, nll, grads in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(nll, results[0][1])
        assert all(torch.equal(a, b) for a, b in zip(grads, results[0][2]))

    with_term = criterion_with(task, cfg, crossconst_alpha=0.25)
    model.forwards = 0
    model.eval()
    with torch.no_grad():
        _, _, log = with_term(model, samples[0])
    assert model.forwards == 1 and "crossconst" not in log  # validation: the cross-entropy alone
    model.train()
    _, _, log = with_term(model, samples[0])
    assert model.forwards == 3 and log["crossconst"] > 0

    lnin = []
    for alpha in (0.0, 0.25):
        criterion = criterion_with(task, cfg, crossconst_alpha=alpha, diag_ln_inputs=True)
        torch.manual_seed(7)
        lnin.append({k: v for k, v in criterion(model, samples[0])[2].items() if k.startswith("lnin_enc")})
    assert lnin[0] and lnin[0] == lnin[1]


def test_a_bad_alpha_is_refused(bilingual):
    task, _, _, _, cfg = bilingual
    for alpha in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="--crossconst-alpha must be >= 0"):
            criterion_with(task, cfg, crossconst_alpha=alpha)


# -- the setups -------------------------------------------------------------------------------------------

CONFIG = ROOT / "configs/iwslt14_de_en.yaml"


def fairseq_train_args(overrides):
    cfg = cfgmod.load(CONFIG, overrides)
    return launch.train_args(cfg, "deepnet", (6, 6), 1, False, "save", "tb")


def test_train_crossconst_alpha_reaches_fairseq_train_through_the_launcher(capsys):
    args = fairseq_train_args([f"train.criterion={CRITERION}", "train.crossconst_alpha=0.25"])
    given = dict(zip(args, args[1:]))
    assert given["--crossconst-alpha"] == "0.25" and given["--criterion"] == CRITERION
    assert "--crossconst-alpha" not in fairseq_train_args([])  # null: not passed
    tuned = fairseq_train_args(["train.finetune_from_model=/runs/base/checkpoints/checkpoint_2_1500.pt"])
    assert dict(zip(tuned, tuned[1:]))["--finetune-from-model"] == "/runs/base/checkpoints/checkpoint_2_1500.pt"
    assert launch.main([str(CONFIG), "--arch", "deepnet", "--dry-run", f"train.criterion={CRITERION}",
                        "train.crossconst_alpha=0.5"]) == 0
    assert "--crossconst-alpha 0.5" in capsys.readouterr().out
    for overrides, message in (
            (["train.crossconst_alpha=0.25"], f"needs train.criterion {CRITERION}"),
            (["train.crossconst_alpha=0"], f"needs train.criterion {CRITERION}"),  # fairseq's criterion refuses it
            ([f"train.criterion={CRITERION}", "train.crossconst_alpha=-1"], "must be a number >= 0"),
            ([f"train.criterion={CRITERION}", "train.crossconst_alpha=.nan"], "must be a number >= 0"),
            ([f"train.criterion={CRITERION}", "train.crossconst_alpha=high"], "must be float or null")):
        with pytest.raises(cfgmod.ConfigError, match=re.escape(message)) as err:
            cfgmod.load(CONFIG, overrides)
        assert "\n" not in str(err.value) and "train.crossconst_alpha" in str(err.value)


# -- through fairseq-train: exact resume, export, decoding --------------------------------------------------

def train_cmd(data, save_dir, max_update):
    return [BIN / "fairseq-train", data, "--user-dir", USER_DIR, "--task", "translation_exact_resume",
            "--arch", "deepnet_transformer", "--encoder-layers", "2", "--decoder-layers", "2", *TINY_MODEL,
            "--share-all-embeddings", "--deepnorm-encoder-beta", "1", "--deepnorm-decoder-beta", "1",
            "--seed", "3", "--max-tokens", "500", "--dropout", "0.1", "--optimizer", "adam", "--lr", "1e-3",
            "--criterion", CRITERION, "--label-smoothing", "0.1", "--crossconst-alpha", "0.5", "--cpu",
            "--max-update", str(max_update), "--save-interval-updates", "3", "--no-epoch-checkpoints",
            "--disable-validation", "--num-workers", "0", "--log-format", "json", "--log-interval", "1",
            "--save-dir", save_dir]


def logged(text):
    """{update: (loss, crossconst)} from fairseq's per-update json log lines."""
    found = {}
    for line in text.splitlines():
        if "| train_inner |" in line:
            row = json.loads(line.split("| train_inner |", 1)[1])
            found[int(row["num_updates"])] = (row["loss"], row["crossconst"])
    return found


@pytest.fixture(scope="module")
def runs(multi30k_small_bin, tmp_path_factory):
    """A 2L-2L DeepNet trained 6 updates with --crossconst-alpha 0.5, uninterrupted and stopped at 3 then resumed."""
    tmp = tmp_path_factory.mktemp("crossconst")
    output = {}
    for name, max_update in (("reference", 6), ("stopped", 3), ("resumed", 6)):
        folder = tmp / ("reference" if name == "reference" else "interrupted")
        proc = run(train_cmd(multi30k_small_bin, folder, max_update))
        output[name] = logged(proc.stdout + proc.stderr)
    return tmp, output


def test_resume_is_exact_with_crossconst(runs):
    tmp, output = runs
    assert sorted(output["reference"]) == list(range(1, 7)) and sorted(output["resumed"]) == [4, 5, 6]
    assert {**output["stopped"], **output["resumed"]} == output["reference"]
    assert all(float(crossconst) > 0 for _, crossconst in output["reference"].values())
    got = torch.load(tmp / "interrupted/checkpoint_last.pt", map_location="cpu")["model"]
    want = torch.load(tmp / "reference/checkpoint_last.pt", map_location="cpu")["model"]
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_model_trained_with_crossconst_exports_and_decodes_as_before(runs, multi30k_small_bin, tmp_path):
    """Exported to fairseq's transformer (the criterion and its option dropped), fairseq-generate gives the
    hypotheses the plugin's checkpoint gives."""
    checkpoint = runs[0] / "reference/checkpoint_last.pt"
    assert torch.load(checkpoint, map_location="cpu", weights_only=False)["cfg"]["criterion"]["crossconst_alpha"] == 0.5
    exported = export_to(checkpoint, "transformer", tmp_path / "model.pt")
    state = torch.load(exported, weights_only=True)
    assert state["cfg"]["model"]["_name"] == "transformer" and state["cfg"]["criterion"] is None
    original = fairseq_generate_valid(multi30k_small_bin, checkpoint, tmp_path / "original")
    plain = fairseq_generate_valid(multi30k_small_bin, exported, tmp_path / "exported")
    assert len(original) == 24 and plain == original


def test_a_finetuning_stage_starts_from_the_trained_weights_and_resumes_its_own(runs, multi30k_small_bin):
    """train.finetune_from_model (fairseq's --finetune-from-model): the weights of the model trained 6 updates, a
    new optimizer and update count; stopped and rerun, the fine-tune goes on from its own checkpoint_last.pt."""
    base = runs[0] / "reference/checkpoint_last.pt"
    folder = runs[0] / "finetune"
    cmd = [*train_cmd(multi30k_small_bin, folder, 2), "--finetune-from-model", base]
    first = run(cmd)
    assert f"loading pretrained model from {base}" in first.stderr + first.stdout
    assert sorted(logged(first.stdout + first.stderr)) == [1, 2]  # counted anew
    again = run([*cmd[:cmd.index("--max-update") + 1], "4", *cmd[cmd.index("--max-update") + 2:]])
    assert "loading pretrained model" not in again.stderr + again.stdout
    assert sorted(logged(again.stdout + again.stderr)) == [3, 4]

