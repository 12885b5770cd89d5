"""Deployment (docs/deploy.md): exact export to fairseq's ``transformer`` and to CTranslate2, translation.

A Multi30k slice (1,500 training pairs, 120 test sentences, 1,000 BPE merges) is prepared by the
shipped scripts. The checkpoints are written in fairseq-train's format at initialisation, in-process
(the export reads only a checkpoint's configuration and weights, and the fold is exact for any
weights): a 2L-3L DeepNet (N != M, so the two stacks' alphas differ) with init gain beta = 1 instead
of the paper's small beta, so that its beam-search output varies with the source (a DeepNet trained
for a few hundred updates here still gives one sentence for every source), a Pre-LN model, a DeepNet
LM and an unsupported architecture. A DeepNet trained by the whole pipeline is exported and checked
on all of Multi30k's test2016 by benchmarks/deploy.py. Decoding settings are fixed (beam 5, at most
40 tokens) so that batching cannot change a hypothesis.

Without a setup: conftest's fairseq-preprocess slice, a DeepNet trained a few updates by fairseq-train
and fairseq's own transformer, exported to CTranslate2 from the data folder alone. The translator
through bad input: invalid UTF-8, a 3,000-word line, empty lines, a sentence that fails to decode.
The multilingual export is tested on the OPUS-100 pipeline's model (test_setup_opus.py), and here on a small
multilingual model in a zero-shot direction, at a small length limit, with two language-tag strategies.
"""

import json
import logging
import os

import numpy as np
import pytest
import torch
from conftest import BIN, ROOT, USER_DIR, run

from deepnet_fairseq import export
from deepnet_text import textprep as tp
from deepnet_setups import lang_tags, launch
from deepnet_setups.config import load as config_load
from deepnet_setups.runner import fairseq_options

SCRIPTS = ROOT / "scripts"
TEST_SENTENCES = 120
BEAM, MAX_LEN = 5, 40
DATA = ["data.layout=plain", "data.train=[train]", "data.valid=[valid]", "data.test=[test2016]", "prep.bpe_merges=1000"]
EVAL = ["eval.average_last=1", "eval.beam=5", "eval.lenpen=1.0", "eval.max_len_a=0", f"eval.max_len_b={MAX_LEN}"]
SMALL = ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
         "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
         "--share-all-embeddings"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, multi30k):
    """The prepared slice, and a 2L-3L DeepNet checkpoint in a run folder as train_iwslt.sh lays it out."""
    tmp = tmp_path_factory.mktemp("deploy")
    raw = tmp / "raw"
    raw.mkdir()
    for stem, count in (("train", 1500), ("valid", 100), ("test2016", TEST_SENTENCES)):
        for lang in ("de", "en"):
            tp.write_lines(raw / f"{stem}.{lang}", tp.read_lines(multi30k / f"{stem}.{lang}")[:count])
    args = DATA + [f"paths.work={tmp / 'work'}", f"paths.runs={tmp / 'runs'}", f"paths.results={tmp / 'results.jsonl'}"]
    config = ROOT / "configs/iwslt14_de_en.yaml"
    run(["bash", SCRIPTS / "prepare_iwslt14.sh", "--raw-dir", raw, *args])
    run(["bash", SCRIPTS / "binarize.sh", "--config", config, "--workers", "1", *args])
    checkpoints = launch.run_dir(config_load(config, args), "deepnet", (2, 3)) / "checkpoints"
    checkpoints.mkdir(parents=True)
    in_process_checkpoint(checkpoints / "checkpoint_1_1.pt", tmp / "work/bin", [
        "--arch", "deepnet_transformer_iwslt_de_en", "--encoder-layers", "2", "--decoder-layers", "3", *SMALL,
        "--deepnorm-encoder-beta", "1", "--deepnorm-decoder-beta", "1",
        # the plugin's task and criterion, as the shipped pipeline and the diagnostics train with
        "--task", "translation_exact_resume", "--criterion", "diagnostic_label_smoothed_cross_entropy"])
    return {"tmp": tmp, "raw": raw, "work": tmp / "work", "bin": tmp / "work/bin", "config": config,
            "args": args + EVAL, "run": checkpoints.parent, "checkpoint": checkpoints / "checkpoint_1_1.pt"}


# -- helpers ------------------------------------------------------------------------------------

def load(checkpoint, data):
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides={"data": str(data)})
    task.load_dataset("test")
    return models[0].eval(), task


def whole_test_set(task):
    dataset = task.dataset("test")
    return dataset.collater([dataset[i] for i in range(len(dataset))])


def reference_log_probs(model, batch):
    """Per-sentence log-probabilities of the reference tokens (</s> included), teacher-forced."""
    with torch.no_grad():
        out = model(**batch["net_input"])
        lprobs = model.get_normalized_probs(out, log_probs=True).gather(2, batch["target"][:, :, None])[:, :, 0]
    pad = model.decoder.dictionary.pad()
    return {int(i): lp[t.ne(pad)].numpy() for i, lp, t in zip(batch["id"], lprobs, batch["target"])}


def beam_hypotheses(model, task, batch):
    """fairseq's beam search (SequenceGenerator): sentence id -> best hypothesis as tokens (no </s>)."""
    from fairseq.sequence_generator import SequenceGenerator

    generator = SequenceGenerator([model], task.target_dictionary, beam_size=BEAM, max_len_a=0, max_len_b=MAX_LEN)
    with torch.no_grad():
        hypos = generator.generate([model], batch)
    dictionary = task.target_dictionary
    return {int(i): [dictionary[t] for t in h[0]["tokens"][:-1]] for i, h in zip(batch["id"], hypos)}


def max_difference(a, b):
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def in_process_checkpoint(path, data, arch_args):
    """A checkpoint in fairseq-train's format for a model at its initialisation (no training)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data), "--user-dir", USER_DIR, *arch_args])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    torch.save({"args": None, "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
                "model": model.state_dict(), "last_optimizer_state": {"state": {}, "param_groups": []},
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                                       "lr_scheduler_state": {}, "num_updates": 0}],
                "extra_state": {"train_iterator": {"epoch": 1}}}, path)
    return path


def export_to(checkpoint, target, out, *extra):
    assert export.main([str(checkpoint), "--to", target, str(out), *extra]) == 0
    return out


def assert_fold_exact(original_checkpoint, exported_checkpoint, data):
    """Exported vs original: log-probs within 2e-4 (fp32), the same beam-5 hypotheses on every test sentence."""
    original, task = load(original_checkpoint, data)
    plain, plain_task = load(exported_checkpoint, data)
    assert type(plain).__module__.startswith("fairseq.models.transformer")
    batch = whole_test_set(task)
    assert len(batch["id"]) >= 100
    difference = max_difference(reference_log_probs(original, batch), reference_log_probs(plain, batch))
    hypotheses = beam_hypotheses(original, task, batch)
    assert beam_hypotheses(plain, plain_task, batch) == hypotheses
    assert difference <= 2e-4
    return difference, hypotheses


# -- export to fairseq's transformer ------------------------------------------------------------

def test_folded_deepnet_is_fairseq_transformer_with_same_scores_and_hypotheses(setup, tmp_path):
    checkpoint = setup["checkpoint"]
    exported = export_to(checkpoint, "transformer", tmp_path / "deepnet_as_transformer.pt")
    difference, hypotheses = assert_fold_exact(checkpoint, exported, setup["bin"])
    distinct = len({" ".join(h) for h in hypotheses.values()})
    print(f"\nfolded 2L-3L DeepNet: max |log-prob diff| {difference:.2e}, {len(hypotheses)} identical "
          f"hypotheses ({distinct} distinct)")
    assert distinct >= 20  # outputs that depend on the source

    # only plain containers, numbers, strings and tensors; nothing of the plugin
    state = torch.load(exported, weights_only=True)
    assert state["cfg"]["model"]["_name"] == "transformer" and state["args"] is None
    assert state["cfg"]["common"]["user_dir"] is None and state["cfg"]["task"]["_name"] == "translation"
    assert state["cfg"]["criterion"] is None
    assert not [k for k in state["model"] if "deepnorm" in k]
    assert not [k for k in state["cfg"]["model"] if "deepnorm" in k or "compile" in k]
    assert "last_optimizer_state" not in state


def test_exported_checkpoint_decodes_in_plain_fairseq_without_the_plugin(setup, tmp_path):
    """One Python without the plugin and with torch's default (weights-only) loading:
    ``TransformerModel.from_pretrained``, then fairseq-generate's entry point (no --user-dir)."""
    checkpoint = setup["checkpoint"]
    exported = export_to(checkpoint, "transformer", tmp_path / "model.pt")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}
    generate = ["fairseq-generate", str(setup["bin"]), "--path", str(exported), "--beam", str(BEAM), "--max-len-a", "0",
                "--max-len-b", str(MAX_LEN), "--cpu", "--max-tokens", "4000", "--required-batch-size-multiple", "1"]
    script = (f"import sys\nfrom fairseq.models.transformer import TransformerModel\n"
              f"hub = TransformerModel.from_pretrained({str(tmp_path)!r}, checkpoint_file='model.pt', "
              f"data_name_or_path={str(setup['bin'])!r})\n"
              f"print('hub:', hub.translate('ein mann .', beam={BEAM}))\n"
              f"sys.argv = {generate!r}\nfrom fairseq_cli.generate import cli_main\ncli_main()\n"
              f"print('plugin imported:', 'deepnet_fairseq' in sys.modules)\n")
    output = run([BIN / "python", "-c", script], env=env, cwd=tmp_path).stdout.splitlines()
    assert output[-1] == "plugin imported: False" and output[0].startswith("hub: ") and output[0][5:].strip()
    from_cli = {int(line.split("\t")[0][2:]): line.split("\t")[2].split() for line in output if line.startswith("H-")}
    original, task = load(checkpoint, setup["bin"])
    assert from_cli == beam_hypotheses(original, task, whole_test_set(task))


def test_renamed_preln_is_fairseq_transformer_with_same_scores_and_hypotheses(setup, tmp_path):
    checkpoint = in_process_checkpoint(tmp_path / "preln.pt", setup["bin"], [
        "--arch", "preln_transformer_iwslt_de_en", "--encoder-layers", "2", "--decoder-layers", "3", *SMALL])
    exported = export_to(checkpoint, "transformer", tmp_path / "preln_as_transformer.pt")
    model_cfg = torch.load(exported, weights_only=True)["cfg"]["model"]
    assert model_cfg["encoder_normalize_before"] and model_cfg["decoder_normalize_before"]
    difference, _ = assert_fold_exact(checkpoint, exported, setup["bin"])
    assert difference == 0.0  # a rename: the same modules, the same weights


def test_layernorm_scaling_folds_into_fairseq_preln_transformer(setup, tmp_path):
    """s * LN(x) is LN(x) with weight and bias times s: the exported Pre-LN transformer scores as LNS does."""
    checkpoint = in_process_checkpoint(tmp_path / "lns.pt", setup["bin"], [
        "--arch", "lns_transformer", "--encoder-layers", "2", "--decoder-layers", "3", *SMALL])
    state = torch.load(checkpoint, weights_only=False)
    generator = torch.Generator().manual_seed(0)
    for key in [k for k in state["model"] if "layer_norm." in k and not k.endswith("lns_scale")]:  # gains, biases off 1, 0
        state["model"][key] += 0.5 * torch.randn(state["model"][key].shape, generator=generator)
    torch.save(state, checkpoint)
    scales = {k: float(v) for k, v in state["model"].items() if k.endswith("lns_scale")}
    assert sorted(set(scales.values()))[:2] == pytest.approx([1 / 3 ** 0.5, 1 / 2 ** 0.5])
    exported = export_to(checkpoint, "transformer", tmp_path / "lns_as_transformer.pt")
    plain = torch.load(exported, weights_only=True)
    assert plain["cfg"]["model"]["encoder_normalize_before"] and not [k for k in plain["model"] if "lns" in k]
    key = "decoder.layers.2.final_layer_norm.bias"
    assert torch.allclose(plain["model"][key], state["model"][key] / 3 ** 0.5)
    assert_fold_exact(checkpoint, exported, setup["bin"])


@pytest.mark.parametrize("arch", ["periln_transformer", "mixln_transformer", "dyt_transformer"])
def test_schemes_without_a_plain_equivalent_are_refused_naming_why(setup, tmp_path, capsys, arch):
    import deepnet_methods

    checkpoint = in_process_checkpoint(tmp_path / f"{arch}.pt", setup["bin"], [
        "--arch", arch, "--encoder-layers", "4", "--decoder-layers", "4", *SMALL])
    capsys.readouterr()
    assert export.main([str(checkpoint), "--to", "transformer", str(tmp_path / "out.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and deepnet_methods.of_arch(arch).no_export in err, err
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("arch", ["postln_transformer", "transformer"])
def test_post_ln_passes_through_unchanged(setup, tmp_path, arch):
    checkpoint = in_process_checkpoint(tmp_path / f"{arch}.pt", setup["bin"], [
        "--arch", arch, "--encoder-layers", "2", "--decoder-layers", "3", *SMALL])
    exported = torch.load(export_to(checkpoint, "transformer", tmp_path / "plain.pt"), weights_only=True)
    original = torch.load(checkpoint, weights_only=False)["model"]
    assert exported["cfg"]["model"]["_name"] == "transformer" and not exported["cfg"]["model"]["encoder_normalize_before"]
    assert exported["model"].keys() == original.keys()
    assert all(torch.equal(exported["model"][k], original[k]) for k in original)


def test_folded_deepnet_lm_is_fairseq_transformer_lm(setup, tmp_path):
    from fairseq import checkpoint_utils

    data = tmp_path / "lm_data"
    data.mkdir()
    (data / "dict.txt").write_text((setup["bin"] / "dict.en.txt").read_text())
    checkpoint = in_process_checkpoint(tmp_path / "lm.pt", data, [
        "--task", "language_modeling", "--arch", "deepnet_transformer_lm", "--decoder-layers", "3",
        "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "2",
        "--tokens-per-sample", "64"])
    exported = export_to(checkpoint, "transformer", tmp_path / "lm_plain.pt")
    assert torch.load(exported, weights_only=True)["cfg"]["model"]["_name"] == "transformer_lm"
    (original,), _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    (plain,), _, _ = checkpoint_utils.load_model_ensemble_and_task([str(exported)])
    assert type(plain).__name__ == "TransformerLanguageModel"
    lines = tp.read_lines(setup["raw"] / "test2016.en")[:20]
    tokens = [task.dictionary.encode_line(line.lower(), add_if_not_exist=False).long() for line in lines]
    with torch.no_grad():
        for sentence in tokens:
            a, b = (m.get_normalized_probs(m(sentence[None]), log_probs=True) for m in (original.eval(), plain.eval()))
            assert (a - b).abs().max() <= 2e-4


# -- refusals -----------------------------------------------------------------------------------

def test_unsupported_architecture_and_bad_files_are_refused_in_one_line(setup, tmp_path, capsys):
    admin = in_process_checkpoint(tmp_path / "admin.pt", setup["bin"], [
        "--arch", "admin_transformer", "--encoder-layers", "2", "--decoder-layers", "2",
        "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"])
    truncated = tmp_path / "truncated.pt"
    data = (setup["checkpoint"]).read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    foreign = tmp_path / "weights.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    expected = {admin: "architecture 'admin_transformer' (admin_transformer) has no exact equivalent in plain fairseq",
                truncated: "truncated or not a torch checkpoint",
                foreign: "not a fairseq checkpoint (no 'model' entry"}
    for checkpoint, message in expected.items():
        capsys.readouterr()
        assert export.main([str(checkpoint), "--to", "transformer", str(tmp_path / "out.pt")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {checkpoint}: ") and message in err and "\n" not in err, err
    assert not (tmp_path / "out.pt").exists()
    proc = run(["bash", SCRIPTS / "export.sh", truncated, "--to", "ctranslate2", tmp_path / "ct2"], check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {truncated}: truncated or not a torch checkpoint ({len(data) // 2} bytes; File is not a zip file)"]


# -- CTranslate2 --------------------------------------------------------------------------------

def test_ctranslate2_model_is_exact_for_deepnet(setup, tmp_path):
    """One global LayerNorm eps (1e-5/alpha_dec^2) with the encoder's stream rescaled: scores within 1e-4
    of the original DeepNet, the same beam-5 hypotheses."""
    from deepnet_fairseq.translate import DeployedTranslator

    checkpoint = setup["checkpoint"]
    model_dir = export_to(checkpoint, "ctranslate2", tmp_path / "ct2")
    settings = json.loads((model_dir / "deploy.json").read_text())
    alphas = settings["exported_from"]["deepnorm_alpha"]
    assert alphas["encoder"] != alphas["decoder"]  # N != M: the rescaling matters
    assert settings["layer_norm_epsilon"] == pytest.approx(1e-5 / alphas["decoder"] ** 2)
    original, task = load(checkpoint, setup["bin"])
    batch = whole_test_set(task)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    pad = src_dict.pad()
    sources = {int(i): [src_dict[t] for t in s[s.ne(pad)][:-1]] for i, s in zip(batch["id"], batch["net_input"]["src_tokens"])}
    targets = {int(i): [tgt_dict[x] for x in t[t.ne(pad)][:-1]] for i, t in zip(batch["id"], batch["target"])}
    ids = sorted(sources)
    translator = DeployedTranslator(model_dir)
    scored = translator.translator.score_batch([sources[i] for i in ids], [targets[i] for i in ids])
    ct2_log_probs = {i: np.array(r.log_probs) for i, r in zip(ids, scored)}
    difference = max_difference(ct2_log_probs, reference_log_probs(original, batch))
    outputs = translator.translate_segmented([sources[i] for i in ids], beam=BEAM, lenpen=1.0, max_len_a=0,
                                             max_len_b=MAX_LEN)
    print(f"\nCTranslate2 vs original DeepNet: max |log-prob diff| {difference:.2e}")
    assert difference <= 1e-4
    assert dict(zip(ids, outputs)) == beam_hypotheses(original, task, batch)


@pytest.mark.slow  # evaluate.sh twice (~20 s); the engines' agreement stays in make test (the zero-shot test below)
def test_evaluate_with_ctranslate2_gives_fairseqs_hypotheses_and_bleu(setup):
    from deepnet_setups import evaluate

    common = [str(setup["config"]), *setup["args"], "--arch", "deepnet", "--layers", "2,3", "--cpu"]
    assert evaluate.main(common) == 0
    out = setup["run"] / "eval"
    fairseq_scores, fairseq_hyps = json.loads((out / "scores.json").read_text()), tp.read_lines(out / "hyp.en")
    assert evaluate.main(common + ["--engine", "ctranslate2"]) == 0
    ct2_scores, ct2_hyps = json.loads((out / "scores.json").read_text()), tp.read_lines(out / "hyp.en")
    assert ct2_scores["engine"] == "ctranslate2" and fairseq_scores["engine"] == "fairseq"
    assert ct2_hyps == fairseq_hyps
    assert ct2_scores["bleu"] == fairseq_scores["bleu"] and ct2_scores["signature"] == fairseq_scores["signature"]
    print(f"\nevaluate: BLEU {fairseq_scores['bleu']} with either engine ({fairseq_scores['signature']})")


def test_ctranslate2_directory_translates_raw_text_end_to_end(setup):
    """Raw German in, detokenised English out, through the averaged model's directory: the same sentences
    fairseq-generate produced for the prepared test set, detokenised."""
    model_dir = setup["run"] / "eval/ctranslate2"
    if not (model_dir / "deploy.json").exists():  # written by the evaluate test; make it when run alone
        test_evaluate_with_ctranslate2_gives_fairseqs_hypotheses_and_bleu(setup)
    raw = setup["raw"] / "test2016.de"
    proc = run([BIN / "python", "-m", "deepnet_fairseq.translate", model_dir, "--batch-size", "16"],
               input=raw.read_text(encoding="utf-8"))
    translations = proc.stdout.splitlines()
    expected = tp.moses_detokenize(tp.read_lines(setup["run"] / "eval/hyp.en"), "en")
    assert translations == expected and len(translations) == TEST_SENTENCES
    assert not any("@@" in line or "&apos;" in line for line in translations)
    assert f"{TEST_SENTENCES}/{TEST_SENTENCES} sentences" in proc.stderr



# -- any translation checkpoint, without a setup ---------------------------------------------------

def fairseq_generate_valid(data, checkpoint, results):
    """fairseq-generate's best hypotheses on the valid set (beam 5, at most MAX_LEN tokens), by sentence id: the
    command's own ``main`` (what the fairseq-generate script calls) in this process, which has already paid for
    the imports and the plugin (a process would cost a 4-5 s start); its output goes to ``results``."""
    from fairseq import options
    from fairseq_cli.generate import main

    argv = [str(data), "--user-dir", USER_DIR, "--path", str(checkpoint), "--gen-subset", "valid", "--beam", str(BEAM),
            "--max-len-b", str(MAX_LEN), "--cpu", "--max-tokens", "4000", "--required-batch-size-multiple", "1",
            "--num-workers", "0", "--results-path", str(results)]
    handlers = logging.getLogger().handlers[:]  # its logging.basicConfig may add one writing to its results file
    try:
        main(options.parse_args_and_arch(options.get_generation_parser(), input_args=argv))
    finally:
        logging.getLogger().handlers = handlers
    output = (results / "generate-valid.txt").read_text(encoding="utf-8")
    hypotheses = [line.split("\t") for line in output.splitlines() if line.startswith("H-")]
    return [fields[2] for fields in sorted(hypotheses, key=lambda fields: int(fields[0][2:]))]


@pytest.mark.slow  # a fairseq-train run and two decodes (~16 s)
def test_plain_fairseq_train_checkpoints_translate_with_ctranslate2_as_fairseq_generate(multi30k_small_bin, tmp_path,
                                                                                         capsys):
    """No setup: fairseq-preprocess output (conftest's 400-pair slice, whitespace tokens, joined dictionary), a
    2L-3L DeepNet trained 5 updates by fairseq-train --user-dir (init gain beta = 1 and a small lr, so that
    the output varies with the source), and fairseq's own Post-LN ``transformer`` (at initialisation). Each
    exported with no options: dictionaries from the training data folder, language pair inferred from its
    file names, tokens in and out. The translate CLI on the valid set's text gives fairseq-generate's
    beam-5 hypotheses."""
    from deepnet_fairseq import translate

    run([BIN / "fairseq-train", multi30k_small_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "1",
         "--arch", "deepnet_transformer", "--encoder-layers", "2", "--decoder-layers", "3", *SMALL,
         "--deepnorm-encoder-beta", "1", "--deepnorm-decoder-beta", "1", "--optimizer", "adam", "--lr", "1e-4",
         "--max-tokens", "500", "--max-update", "5", "--save-dir", tmp_path / "deepnet", "--no-epoch-checkpoints",
         "--disable-validation", "--num-workers", "0"])
    checkpoints = {"deepnet_transformer": tmp_path / "deepnet/checkpoint_last.pt",
                   "transformer": in_process_checkpoint(tmp_path / "transformer.pt", multi30k_small_bin, [
                       "--arch", "transformer", "--encoder-layers", "2", "--decoder-layers", "3", *SMALL])}
    source = multi30k_small_bin.parent / "valid.de"  # the text fairseq-preprocess binarised
    for arch, checkpoint in checkpoints.items():
        capsys.readouterr()
        export_to(checkpoint, "ctranslate2", tmp_path / f"{arch}_ct2")
        assert "reads and writes the dictionary's tokens" in capsys.readouterr().err
        settings = json.loads((tmp_path / f"{arch}_ct2/deploy.json").read_text())
        assert (settings["source_lang"], settings["target_lang"], settings["segmentation"]) == ("de", "en", "none")
        assert (tmp_path / f"{arch}_ct2/dict.de.txt").read_text() == (multi30k_small_bin / "dict.de.txt").read_text()
        out = tmp_path / f"{arch}.en"
        assert translate.main([str(tmp_path / f"{arch}_ct2"), "--max-len-b", str(MAX_LEN), "--input", str(source),
                               "--output", str(out)]) == 0
        expected = fairseq_generate_valid(multi30k_small_bin, checkpoint, tmp_path / f"{arch}_generate")
        distinct = len(set(expected))
        print(f"\n{arch}: {len(expected)} hypotheses, {distinct} distinct, the same from CTranslate2")
        assert tp.read_lines(out) == expected and len(expected) == 24 and distinct >= 5


# -- a multilingual model: CTranslate2 as fairseq-generate in a zero-shot direction ----------------------

LANG_PAIRS = "de-en,en-de,en-fr,fr-en"
# fairseq's options of two strategies, from their one home (deepnet_setups/lang_tags.py)
TAG_STRATEGIES = {name.upper(): fairseq_options(lang_tags.task_options(name)) for name in ("s-enc-t-dec", "t-enc")}
ZERO_SHOT_LEN_A, ZERO_SHOT_LEN_B = 0.3, 2  # at most 0.3 x (the batch's longest source, tag and </s> in) + 2 tokens


def fairseq_main(module, argv):
    """A fairseq command's ``main`` in this process (its logging.basicConfig may add a handler: undone)."""
    from fairseq import options

    parser = options.get_preprocessing_parser() if module == "preprocess" else options.get_generation_parser()
    main = getattr(__import__(f"fairseq_cli.{module}", fromlist=["main"]), "main")
    handlers = logging.getLogger().handlers[:]
    try:
        main(parser.parse_args(argv) if module == "preprocess" else options.parse_args_and_arch(parser, input_args=argv))
    finally:
        logging.getLogger().handlers = handlers


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory, multi30k):
    """A multilingual model with a zero-shot direction: Multi30k de-en (its first 400 captions) and en-fr (the
    next 400, so that no English sentence is in both), word tokens, one dictionary; the first 60 captions of
    test2016 de-fr (three-way parallel) as the zero-shot test. A 3L-3L DeepNet with init gain beta = 1 trained
    60 updates by fairseq-train on fairseq's multilingual task with S-ENC-T-DEC tags (the source's tag before
    the source, the target's forced as the first output token): its outputs repeat and vary little with the
    source, many run to a small length limit; in de-fr the target tag is unlikely (log-probability about -5.8)
    and </s> is the 2nd to 4th likeliest token after it.
    The same weights under T-ENC (``--encoder-langtok tgt``, no decoder tag) are its checkpoint with the task's
    tag options changed: the engines must agree for any weights, so no second training."""
    tmp = tmp_path_factory.mktemp("multilingual")
    raw, data = tmp / "raw", tmp / "bin"
    raw.mkdir()
    fr = multi30k.parent / "multi30k_en_fr"

    def lines(folder, stem, lang, start, count):
        return tp.read_lines(folder / f"{stem}.{lang}")[start:start + count]

    texts = {("train", "de-en"): {lang: lines(multi30k, "train", lang, 0, 400) for lang in ("de", "en")},
             ("train", "en-fr"): {lang: lines(fr, "train", lang, 400, 400) for lang in ("en", "fr")},
             ("test", "de-fr"): {"de": lines(multi30k, "test2016", "de", 0, 60), "fr": lines(fr, "test2016", "fr", 0, 60)}}
    for (split, pair), sides in texts.items():
        for lang, text in sides.items():
            tp.write_lines(raw / f"{split}.{pair}.{lang}", text)
    tp.write_lines(raw / "all.txt", [line for (split, _), sides in texts.items() if split == "train"
                                     for text in sides.values() for line in text])
    fairseq_main("preprocess", ["--only-source", "--trainpref", str(raw / "all.txt"), "--destdir", str(tmp / "dict"),
                                "--workers", "1"])
    for (split, pair), _ in texts.items():
        source, target = pair.split("-")
        fairseq_main("preprocess", ["-s", source, "-t", target, f"--{split}pref", str(raw / f"{split}.{pair}"),
                                    "--destdir", str(data), "--srcdict", str(tmp / "dict/dict.txt"),
                                    "--tgtdict", str(tmp / "dict/dict.txt"), "--workers", "1"])
    for lang in ("de", "en", "fr"):  # the multilingual task reads one dict.<lang>.txt per language
        (data / f"dict.{lang}.txt").write_bytes((tmp / "dict/dict.txt").read_bytes())
    task = ["--task", "translation_multi_simple_epoch", "--lang-pairs", LANG_PAIRS, "--langs", "de,en,fr"]
    run([BIN / "fairseq-train", data, "--user-dir", USER_DIR, "--cpu", "--seed", "1", *task,
         *TAG_STRATEGIES["S-ENC-T-DEC"], "--arch", "deepnet_transformer", "--encoder-layers", "2", "--decoder-layers", "2",
         *SMALL, "--deepnorm-encoder-beta", "1", "--deepnorm-decoder-beta", "1", "--optimizer", "adam",
         "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "2048",
         "--max-update", "40", "--save-dir", tmp / "S-ENC-T-DEC", "--no-epoch-checkpoints", "--disable-validation",
         "--num-workers", "0"])
    state = torch.load(tmp / "S-ENC-T-DEC/checkpoint_last.pt", map_location="cpu", weights_only=False)
    vars(state["cfg"]["task"]).update(encoder_langtok="tgt", decoder_langtok=False)  # the task's config: a Namespace
    (tmp / "T-ENC").mkdir()
    torch.save(state, tmp / "T-ENC/checkpoint_last.pt")
    return {"tmp": tmp, "data": data, "raw": raw, "task": task}


@pytest.mark.parametrize("strategy, beam", [("S-ENC-T-DEC", BEAM), ("S-ENC-T-DEC", 2), ("T-ENC", BEAM)])
def test_multilingual_zero_shot_ctranslate2_gives_fairseq_generates_hypotheses_at_the_length_limit(multilingual,
                                                                                                      strategy, beam):
    """De-fr (zero-shot): fairseq-generate (the multilingual task, a small length limit, --max-tokens 300: 4
    batches, so 4 limits) and the CTranslate2 export decoding fairseq-generate's batches
    (``fairseq_generate_batches``, as evaluate.sh --engine ctranslate2 does) give the same hypotheses for
    every sentence, 10 or more of them at the limit. CTranslate2's own best differs on some: it leaves
    the forced tag's log-probability out of its ranking, never ends a hypothesis right after the tag from
    another beam than the first (here </s> is the 2nd-4th likeliest token there: at beam 5 in every
    sentence, at beam 2 in some), and stops at the limit without the </s> that fairseq forces one step later;
    the translator ranks as fairseq does (``DeployedTranslator.fairseq_best``, docs/deploy.md)."""
    from deepnet_fairseq.translate import DeployedTranslator
    from deepnet_setups.evaluate import fairseq_generate_batches

    tmp, data = multilingual["tmp"], multilingual["data"]
    checkpoint = tmp / strategy / "checkpoint_last.pt"
    task = multilingual["task"] + TAG_STRATEGIES[strategy] + ["--source-lang", "de", "--target-lang", "fr"]
    decoding = ["--beam", str(beam), "--max-len-a", str(ZERO_SHOT_LEN_A), "--max-len-b", str(ZERO_SHOT_LEN_B)]
    results = tmp / f"generate_{strategy}_beam{beam}"
    fairseq_main("generate", [str(data), "--user-dir", USER_DIR, "--path", str(checkpoint), *task, *decoding,
                              "--gen-subset", "test", "--cpu", "--max-tokens", "300", "--required-batch-size-multiple",
                              "1", "--num-workers", "0", "--results-path", str(results)])
    output = (results / "generate-test.txt").read_text(encoding="utf-8")
    hypotheses = {int(f[0][2:]): f[2] for f in (line.split("\t") for line in output.splitlines() if line.startswith("H-"))}
    expected = [hypotheses[i] for i in range(len(hypotheses))]

    model_dir = tmp / f"ct2_{strategy}"
    if not (model_dir / "deploy.json").exists():
        export_to(checkpoint, "ctranslate2", model_dir)
    translator = DeployedTranslator(model_dir)
    assert (translator.settings["encoder_langtok"], translator.settings["decoder_langtok"]) == (
        {"S-ENC-T-DEC": ("src", True), "T-ENC": ("tgt", False)}[strategy])
    batches = fairseq_generate_batches({"data": {}, "eval": {"subset": "test", "max_tokens": 300}}, task, data)
    sources = [line.split() for line in tp.read_lines(multilingual["raw"] / "test.de-fr.de")]
    outputs = translator.translate_segmented(sources, "de", "fr", beam=beam, lenpen=1.0, max_len_a=ZERO_SHOT_LEN_A,
                                             max_len_b=ZERO_SHOT_LEN_B, batches=batches)
    assert [" ".join(tokens) for tokens in outputs] == expected and len(expected) == 60

    # each sentence's limit (fairseq's: 0.3 x its batch's longest source, tag and </s> in, + 2), and
    # CTranslate2's own best under it, without the translator's ranking
    limits, own_best = {}, {}
    source_tags, target_prefix = translator.language_tokens("de", "fr")
    for batch in batches:
        limit = int(ZERO_SHOT_LEN_A * (max(len(sources[i]) for i in batch) + len(source_tags) + 1) + ZERO_SHOT_LEN_B)
        for i in batch:
            limits[i] = limit
            (result,) = translator.translator.translate_batch(
                [source_tags + sources[i]], [target_prefix] if target_prefix else None, beam_size=beam,
                num_hypotheses=1, length_penalty=1.0, max_decoding_length=limit, max_input_length=0)
            own_best[i] = " ".join(t for t in result.hypotheses[0] if t not in target_prefix)
    at_limit = sum(len(expected[i].split()) + len(target_prefix) == limits[i] for i in range(len(expected)))
    differ = sum(own_best[i] != expected[i] for i in range(len(expected)))
    ranks = translator.end_rank_after([source_tags + x for x in sources], target_prefix) if target_prefix else []
    print(f"\n{strategy} beam {beam} de-fr (zero-shot): {len(expected)} hypotheses = fairseq-generate's, "
          f"{len(set(expected))} distinct, {at_limit} at the length limit ({len(batches)} batches, limits "
          f"{sorted(set(limits.values()))}), {sum(0 < r < beam for r in ranks)} with </s> ranked 2 to {beam} after "
          f"the tag; CTranslate2's own best differs on {differ}")
    assert len(batches) >= 3 and at_limit >= 10 and len(set(expected)) >= 3
    assert differ > 0


# -- the translator and bad input ------------------------------------------------------------------

@pytest.fixture(scope="module")
def translator_dir(setup, tmp_path_factory):
    """The 2L-3L DeepNet exported with the setup's Moses and BPE (decoding: beam 5, at most 40 tokens)."""
    return export_to(setup["checkpoint"], "ctranslate2", tmp_path_factory.mktemp("translator") / "ct2")


def translate_bytes(model_dir, data, folder, capsys):
    """The translate command's ``main`` with ``data`` (bytes) as its input file, in this process (the stdin/stdout
    process is test_ctranslate2_directory_translates_raw_text_end_to_end; both read the bytes the same way):
    (returncode, output lines, stderr)."""
    from deepnet_fairseq import translate

    (folder / "input.de").write_bytes(data)
    capsys.readouterr()
    code = translate.main([str(model_dir), "--input", str(folder / "input.de"), "--output", str(folder / "output.en")])
    err = capsys.readouterr().err
    out = (folder / "output.en").read_bytes().decode("utf-8").split("\n")[:-1] if code == 0 else []
    return code, out, err


def test_translator_keeps_every_line_through_bad_input(setup, translator_dir, tmp_path, capsys):
    """Invalid UTF-8, a 3,000-word line (the model has 1,024 source positions), empty and blank lines, and no
    newline at the end: one output line per input line, one warning naming each bad line, and every
    good line translated as it is alone."""
    from deepnet_fairseq.translate import DeployedTranslator

    good = tp.read_lines(setup["raw"] / "test2016.de")[:4]
    words = " ".join(good).split()
    long_line = " ".join((words * (3000 // len(words) + 1))[:3000])  # 3,000 words
    lines = [good[0].encode(), good[1].encode()[:5] + b"\xff\xfe caf\xe9 " + good[1].encode()[5:], b"",
             long_line.encode(), b"  \t ", good[2].encode(), good[3].encode()]
    code, out, err = translate_bytes(translator_dir, b"\n".join(lines), tmp_path, capsys)  # no newline at the end
    assert code == 0, err
    assert len(out) == len(lines)
    warnings = [line for line in err.splitlines() if line.startswith("[translate] warning")]
    assert len(warnings) == 2, err
    assert warnings[0].startswith("[translate] warning: line 2: invalid UTF-8 (byte 0xff at byte 6)")
    assert warnings[1].startswith("[translate] warning: line 4: ") and "cut to the first 1023" in warnings[1]
    assert out[2] == out[4] == ""
    translator = DeployedTranslator(translator_dir)
    expected = translator.translate([good[0], lines[1].decode("utf-8", errors="replace"), good[2], good[3]])
    assert [out[0], out[1], out[5], out[6]] == expected and all(expected)
    segmented = translator.segment([long_line])[0]
    assert len(segmented) > 1023
    (cut,) = translator.translate_segmented([segmented[:1023]])
    assert out[3] == translator.detokenize([translator.desegment(cut)])[0]


def test_translator_invalid_utf8_as_an_error_names_the_line(translator_dir, tmp_path, capsys):
    from deepnet_fairseq import translate

    source = tmp_path / "source.de"
    source.write_bytes(b"ein mann .\nzwei \xc3\x28 hunde\n")
    capsys.readouterr()
    code = translate.main([str(translator_dir), "--invalid-utf8", "error", "--input", str(source),
                           "--output", str(tmp_path / "out.en")])
    assert code == 2 and not (tmp_path / "out.en").exists()
    assert capsys.readouterr().err.strip().splitlines() == ["error: line 2: invalid UTF-8 (byte 0xc3 at byte 6)"]


def test_translator_keeps_the_other_sentences_when_one_fails(translator_dir):
    """A sentence that CTranslate2 cannot decode costs that sentence only: an empty line and a warning."""
    from deepnet_fairseq.translate import DeployedTranslator

    translator = DeployedTranslator(translator_dir)
    sentences = ["ein mann schläft .", "zwei hunde spielen im schnee .", "eine frau liest ."]
    expected = translator.translate(sentences)
    real = translator.translator

    class FailsOnHunde:  # stands in for a decoding error on one sentence
        def translate_batch(self, sources, *args, **kwargs):
            if any("hunde" in source for source in sources):
                raise RuntimeError("decoding failed")
            return real.translate_batch(sources, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(real, name)

    translator.translator = FailsOnHunde()
    warnings = []
    assert translator.translate(sentences, warn=lambda i, message: warnings.append((i, message))) == [
        expected[0], "", expected[2]]
    assert warnings == [(1, "not translated (RuntimeError: decoding failed); output left empty")]
