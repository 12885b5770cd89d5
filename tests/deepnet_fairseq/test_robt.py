"""``--task translation_multi_robt --robt-share P`` (random online back-translation, Zhang et al. 2020): the
back-translated batch is what fairseq's own multilingual inference gives for each target sentence in the drawn
language, with the tags of the run's strategy, and a run with it resumes exactly."""

import subprocess
from argparse import Namespace

import numpy as np
import pytest
import torch

from conftest import BIN, TINY_MODEL, USER_DIR
from test_deploy import LANG_PAIRS, fairseq_main
from test_reliability_resume import losses, train_env

from deepnet_setups import lang_tags
from deepnet_setups.runner import fairseq_options

PAIRS = 120  # captions per corpus: de-en from the first, en-fr from the next (no English sentence in both)


@pytest.fixture(scope="module")
def english_centric(tmp_path_factory, multi30k):
    """Multi30k de-en and en-fr, word tokens, one dictionary, binarised as fairseq's multilingual task reads them."""
    from deepnet_text import textprep as tp

    tmp = tmp_path_factory.mktemp("robt")
    raw, data = tmp / "raw", tmp / "bin"
    raw.mkdir()
    corpora = {"de-en": (multi30k, 0), "en-fr": (multi30k.parent / "multi30k_en_fr", PAIRS)}
    for pair, (folder, start) in corpora.items():
        for lang in pair.split("-"):
            tp.write_lines(raw / f"train.{pair}.{lang}", tp.read_lines(folder / f"train.{lang}")[start:start + PAIRS])
    tp.write_lines(raw / "all.txt", [line for path in sorted(raw.glob("train.*")) for line in tp.read_lines(path)])
    fairseq_main("preprocess", ["--only-source", "--trainpref", str(raw / "all.txt"), "--destdir", str(tmp / "dict"),
                                "--workers", "1"])
    for pair in corpora:
        source, target = pair.split("-")
        fairseq_main("preprocess", ["-s", source, "-t", target, "--trainpref", str(raw / f"train.{pair}"),
                                    "--destdir", str(data), "--srcdict", str(tmp / "dict/dict.txt"),
                                    "--tgtdict", str(tmp / "dict/dict.txt"), "--workers", "1"])
    for lang in ("de", "en", "fr"):
        (data / f"dict.{lang}.txt").write_bytes((tmp / "dict/dict.txt").read_bytes())
    return data


def task_args(data, strategy):
    return [str(data), "--user-dir", USER_DIR, "--task", "translation_multi_robt", "--lang-pairs", LANG_PAIRS,
            "--langs", "de,en,fr", *fairseq_options(lang_tags.task_options(strategy)), "--arch", "deepnet_transformer",
            "--encoder-layers", "2", "--decoder-layers", "2", *TINY_MODEL, "--cpu", "--seed", "3"]


@pytest.mark.parametrize("strategy", ["t-enc-t-dec", "t-enc", "s-enc-t-dec"])
def test_back_translation_is_fairseqs_own_translation_into_the_drawn_language(english_centric, strategy):
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), task_args(english_centric, strategy))
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    model = task.build_model(args)  # as fairseq-train: before the data (it sets the maximum positions)
    task.load_dataset("train")
    dataset = task.dataset("train")
    sample = dataset.collater([dataset[i] for i in range(0, len(dataset), len(dataset) // 12)])
    model.train()  # as in a training step
    synthetic, into = task.back_translated(sample, model, np.random.default_rng(7))
    assert model.training  # restored after decoding
    assert synthetic["target"] is sample["target"]
    assert synthetic["net_input"]["prev_output_tokens"] is sample["net_input"]["prev_output_tokens"]
    manager, pad, spec = task.data_manager, task.source_dictionary.pad(), task.args.langtoks["main"]
    model.eval()
    langs_seen, rows = set(), 0
    for i, target in enumerate(sample["target"]):
        y = target[target.ne(pad)]
        if spec[1]:
            lang_y = next(lang for lang in ("de", "en", "fr") if manager.get_decoder_langtok(lang, spec[1]) == y[0])
            y = y[1:]
        else:
            src = sample["net_input"]["src_tokens"][i]
            lang_y = next(lang for lang in ("de", "en", "fr")
                          if manager.get_encoder_langtok(None, lang, spec[0]) == src[src.ne(pad)][0])
        assert into[i] in {"de", "en", "fr"} - {lang_y}
        langs_seen.add(lang_y)
        # fairseq's own multilingual inference for lang_y -> into[i], one sentence at a time
        task.args.source_lang, task.args.target_lang = lang_y, into[i]
        generator = task.build_generator([model], Namespace(beam=1, max_len_a=1.2, max_len_b=10))
        query = torch.cat([y.new_tensor([manager.get_encoder_langtok(lang_y, into[i], spec[0])]), y])
        hypothesis = task.inference_step(generator, [model], {"net_input": {
            "src_tokens": query[None], "src_lengths": torch.tensor([len(query)])}})[0][0]["tokens"]
        row = synthetic["net_input"]["src_tokens"][i]
        row = row[row.ne(pad)]
        assert row[0] == manager.get_encoder_langtok(into[i], lang_y, spec[0])  # the tag of the trained direction
        mine, theirs = row[1:].tolist(), hypothesis[1 if spec[1] else 0:].tolist()  # without the decoder tag
        assert mine[-1] == theirs[-1] == task.source_dictionary.eos()
        # the same greedy tokens up to the shorter of the two length limits (fairseq's is max_len_a times the
        # batch's longest source plus max_len_b: longer in a batch than alone)
        common = min(len(mine), len(theirs)) - 1
        assert common >= 5 and mine[:common] == theirs[:common]
        rows += 1
    assert rows == len(sample["target"]) and langs_seen == {"de", "en", "fr"}


@pytest.mark.slow  # three fairseq-train starts, ~35 s; make test checks the residual drop's exact resume
def test_a_run_with_back_translation_resumes_exactly(english_centric, tmp_path):
    """Stopped at update 4 (a checkpoint) and rerun to 8, the run logs the uninterrupted run's losses; half the
    updates back-translate (drawn from the seed and the update)."""
    train = [BIN / "fairseq-train", *task_args(english_centric, "t-enc-t-dec"), "--robt-share", "0.5", "--robt-from-update", "2",
             "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4",
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "400",
             "--save-interval-updates", "4", "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0",
             "--log-format", "json", "--log-interval", "1"]
    drawn = [np.random.default_rng([3, update]).random() < 0.5 for update in range(2, 8)]
    assert 0 < sum(drawn) < 6  # both kinds of update in the run, before and after the resume
    logs = {}
    for name, stops in (("straight", [8]), ("resumed", [4, 8])):
        logs[name] = ""
        for stop in stops:
            proc = subprocess.run([str(c) for c in [*train, "--max-update", stop, "--save-dir", tmp_path / name]],
                                  capture_output=True, text=True, env=train_env())
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
            logs[name] += proc.stdout + proc.stderr
    straight, resumed = losses(logs["straight"]), losses(logs["resumed"])
    assert sorted(resumed) == sorted(straight) == list(range(1, 9))
    assert resumed == straight


def test_an_export_decodes_with_fairseqs_multilingual_task():
    from deepnet_fairseq.export import plain_cfg

    task = {"_name": "translation_multi_robt", "task": "translation_multi_robt", "robt_share": 0.5,
            "robt_from_update": 750, "encoder_langtok": "tgt", "decoder_langtok": True, "langs": ["de", "en", "fr"]}
    plain = plain_cfg({"common": {"user_dir": USER_DIR}, "task": task}, {"_name": "transformer"})
    assert plain["task"] == {"_name": "translation_multi_simple_epoch", "task": "translation_multi_simple_epoch",
                             "encoder_langtok": "tgt", "decoder_langtok": True, "langs": ["de", "en", "fr"]}
