"""The OPUS-100 setup end to end on Multi30k de/en/fr (three-way parallel) in OPUS-100's layout, through
its scripts: joint SentencePiece, language tokens, per-direction sacreBLEU table with the zero-shot de-fr / fr-de."""

import csv
import json

import pytest
from conftest import ROOT, SHARED_DATA
from test_setup_pipelines import TINY, all_stages, paths

from deepnet_text import textprep as tp
from deepnet_setups import langid, report
from deepnet_setups import evaluate
from deepnet_setups.evaluate import bleu

# The whole OPUS-100 pipeline (SentencePiece, 4 directions, 6 evaluated and 2 pivoted, both engines): ~5 min of a
# make test worker. make test keeps the multilingual contracts that are cheaper to build: tags, mismatch refusal and
# CTranslate2 = fairseq-generate zero-shot (tests/deepnet_fairseq/test_deploy.py), the study's folders and table,
# the evaluation's printed table (test_langid.py) and scripts/report's cell with the pivot (test_report.py).
pytestmark = pytest.mark.slow


def opus_layout(tmp, n_train=6000, n_test=100):
    """Multi30k de-en + en-fr in OPUS-100's layout; de-fr (three-way parallel test) as zero-shot."""
    raw = tmp / "raw"
    m30 = {"de": SHARED_DATA / "multi30k_de_en", "en": SHARED_DATA / "multi30k_de_en", "fr": SHARED_DATA / "multi30k_en_fr"}

    def lines(lang, split, n):
        return (m30[lang] / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:n]

    for group, corpus, splits in (("supervised", "de-en", ("train", "dev", "test")),
                                  ("supervised", "en-fr", ("train", "dev", "test")), ("zeroshot", "de-fr", ("test",))):
        folder = raw / group / corpus
        folder.mkdir(parents=True)
        for split in splits:
            source, n = {"train": ("train", n_train), "dev": ("valid", 200), "test": ("test2016", n_test)}[split]
            for lang in corpus.split("-"):
                tp.write_lines(folder / f"opus.{corpus}-{split}.{lang}", lines(lang, source, n))
    return raw


OPUS_DATA = ["data.langs=[de,en,fr]", "data.lang_pairs=[de-en,en-de,en-fr,fr-en]", "data.zero_shot_pairs=[de-fr,fr-de]",
             "prep.spm_vocab_size=2000", "prep.spm_sample_sentences=20000"]
# 110 updates, 100 test sentences per direction: de-en BLEU 2.73 against 0.18 for copying the source (150 updates,
# checkpoints 66 and 132 averaged: 1.45; 100 updates: 0.07, and 2L-2L at 100: 0.12, below copying)
OPUS_TRAIN = TINY + ["train.max_update=110", "train.warmup_updates=50", "train.lr=5e-3", "train.max_tokens=2048",
                     "train.batch_tokens=2048", "train.save_interval_updates=55", "train.validate_interval_updates=110",
                     "train.max_epoch=null", "eval.average_last=2", "eval.max_tokens=4000"]


@pytest.fixture(scope="session")
def opus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("opus")
    raw = opus_layout(tmp)
    stages, proc = all_stages("opus100", raw, paths(tmp) + OPUS_DATA, "deepnet", "3,3", OPUS_TRAIN)
    print(f"\nOPUS-100 pipeline on Multi30k de/en/fr: stage wall times (s) {stages}\n{proc.stdout[-900:]}")
    return {"tmp": tmp, "run": tmp / "runs/opus100/deepnet/3L-3L", "stdout": proc.stdout}


def test_multilingual_per_direction_table_with_zero_shot(opus):
    work = opus["tmp"] / "work"
    assert (work / "spm/spm.model").exists() and (work / "bin/train.de-en.de.bin").exists()
    assert (work / "bin/test.de-fr.fr.bin").exists() and not (work / "bin/train.de-fr.de.bin").exists()
    rows = list(csv.DictReader((opus["run"] / "eval/bleu.csv").open()))
    assert sorted(r["direction"] for r in rows) == ["de-en", "de-fr", "en-de", "en-fr", "fr-de", "fr-en"]
    for row in rows:
        s, t = row["src"], row["tgt"]
        corpus = "-".join(sorted((s, t)))
        hyps = tp.read_lines(opus["run"] / f"eval/hyp.{row['direction']}.{t}")
        refs = tp.read_lines(work / f"ref/test.{corpus}.{t}")  # raw, cased, detokenised references
        assert len(hyps) == len(refs) == 100
        score, signature = bleu(hyps, refs, tokenize="13a")
        assert float(row["bleu"]) == score and row["signature"] == signature
        assert "case:mixed" in signature and "tok:13a" in signature
        assert row["zero_shot"] == str(row["direction"] in ("de-fr", "fr-de"))
        assert not any("__" + t + "__" in h or "\u2581" in h for h in hyps)  # language tokens and pieces removed
        # target-language accuracy: the identifier's figures on the written hypotheses, over the setup's languages
        on_target = langid.target_language_accuracy(hyps, t, ["de", "en", "fr"])
        assert {k: row[k] for k in on_target} == {k: "" if v is None else str(v) for k, v in on_target.items()}
        labels = langid.identify(hyps, ["de", "en", "fr"])
        assert float(row["target_lang_acc"]) == round(100 * labels.count(t) / len(hyps), 1)
        assert row["top_wrong_lang"] in {"", *({"de", "en", "fr"} - {t})}
    supervised = {r["direction"]: float(r["bleu"]) for r in rows if r["zero_shot"] == "False"}
    copies = {r["direction"]: float(r["copy_source_bleu"]) for r in rows}
    assert supervised["de-en"] > copies["de-en"], (supervised, copies)
    scores = json.loads((opus["run"] / "eval/scores.json").read_text())
    assert set(scores["groups"]) == {"X->En", "En->X", "zero-shot"}
    assert scores["groups"]["zero-shot"]["directions"] == 2
    zero = [float(r["bleu"]) for r in rows if r["zero_shot"] == "True"]
    assert scores["groups"]["zero-shot"]["bleu"] == pytest.approx(round(sum(zero) / 2, 2))
    # the record: every direction's target-language accuracy as in the CSV, group averages, the identifier
    assert scores["langid"].startswith("py3langid ")
    by_direction = {r["direction"]: r for r in rows}
    for record in scores["directions"]:
        row = by_direction[record["direction"]]
        assert record["zero_shot"] == (row["zero_shot"] == "True")
        assert str(record["target_lang_acc"]) == row["target_lang_acc"]
        assert record["top_wrong_lang"] == row["top_wrong_lang"]
    # the directions into English are the model's best trained (de-en beats copying the source): English output
    assert scores["groups"]["X->En"]["target_lang_acc"] > 50, scores["groups"]
    zero_acc = [float(r["target_lang_acc"]) for r in rows if r["zero_shot"] == "True"]
    assert scores["groups"]["zero-shot"]["target_lang_acc"] == pytest.approx(round(sum(zero_acc) / 2, 1))
    appended = [json.loads(line) for line in (opus["tmp"] / "results.jsonl").read_text().splitlines()][-1]
    assert appended["directions"] == scores["directions"]
    # chrF++ everywhere; zero-shot directions also through English with the same model (s -> en -> t)
    for row in rows:
        t, corpus = row["tgt"], "-".join(sorted((row["src"], row["tgt"])))
        refs = tp.read_lines(work / f"ref/test.{corpus}.{t}")
        assert float(row["chrf"]) == evaluate.chrf(tp.read_lines(opus["run"] / f"eval/hyp.{row['direction']}.{t}"), refs)
        if row["zero_shot"] == "False":
            assert row["pivot_bleu"] == row["zero_shot_over_pivot"] == ""
            continue
        pivot = tp.read_lines(opus["run"] / f"eval/hyp.pivot.{row['direction']}.{t}")
        assert len(tp.read_lines(opus["run"] / f"eval/hyp.pivot.{row['direction']}.en")) == len(pivot) == 100
        assert float(row["pivot_bleu"]) == bleu(pivot, refs, tokenize="13a")[0]
        assert float(row["pivot_target_lang_acc"]) == langid.target_language_accuracy(pivot, t, ["de", "en", "fr"])[
            "target_lang_acc"]
        if float(row["pivot_bleu"]):
            assert float(row["zero_shot_over_pivot"]) == round(float(row["bleu"]) / float(row["pivot_bleu"]), 3)
    # the printed table: one line per direction, zero-shot ones marked with * and followed by their pivot
    for row in rows:
        name = row["direction"] + ("*" if row["zero_shot"] == "True" else "")
        line = (f"[evaluate] {name:<10} {float(row['bleu']):6.2f} {float(row['chrf']):7.2f} "
                f"{float(row['target_lang_acc']):9.1f}%")
        assert line in opus["stdout"], line
        if row["zero_shot"] == "True":
            assert f"{float(row['pivot_bleu']):6.2f} {float(row['pivot_target_lang_acc']):9.1f}%" in opus["stdout"]
    print("\n".join(line for line in opus["stdout"].splitlines() if "on-target" in line or "%" in line))
    assert (opus["run"] / "eval/bleu_heatmap.png").read_bytes()[:4] == b"\x89PNG"
    # scripts/report's table: BLEU with the on-target shares of the supervised and the zero-shot directions
    assert report.main([str(opus["tmp"] / "results.jsonl"), "--out-dir", str(opus["tmp"] / "report")]) == 0
    supervised_acc = [float(r["target_lang_acc"]) for r in rows if r["zero_shot"] == "False"]
    pivots = [float(r["pivot_bleu"]) for r in rows if r["zero_shot"] == "True"]
    ratio = f"{100 * sum(zero) / sum(pivots):.0f}% of " if sum(pivots) else ""
    cell = (f"{scores['bleu']:.2f} (on target {sum(supervised_acc) / 4:.0f}% / zero-shot {sum(zero_acc) / 2:.0f}%; "
            f"zero-shot BLEU {ratio}pivot {sum(pivots) / 2:.2f})")
    assert f"| DeepNet | {cell} |" in (opus["tmp"] / "report/results.md").read_text()


def reference_log_probs(checkpoint, data, src, tgt):
    """Log-probabilities of the test references under the fairseq model, teacher-forced, with the source and
    target token lists as fairseq's multilingual task builds them (language tokens included, </s> not)."""
    import torch
    from fairseq import checkpoint_utils

    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data), "source_lang": src, "target_lang": tgt})
    task.load_dataset("test")
    dataset, vocab = task.dataset("test"), task.source_dictionary
    batch = dataset.collater([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        out = model.eval()(**batch["net_input"])
        log_probs = model.get_normalized_probs(out, log_probs=True).gather(2, batch["target"][:, :, None])[:, :, 0]
    rows = zip(batch["net_input"]["src_tokens"], batch["target"], log_probs)
    return [([vocab[x] for x in s[s.ne(vocab.pad())][:-1]], [vocab[x] for x in t[t.ne(vocab.pad())][:-1]],
             lp[t.ne(vocab.pad())].numpy()) for s, t, lp in rows]


def test_ctranslate2_gives_fairseqs_hypotheses_in_every_direction(opus, capsys):
    """evaluate --engine ctranslate2 on the pipeline's model: fairseq-generate's hypotheses and BLEU in all six
    directions, zero-shot de-fr and fr-de included; CTranslate2's log-probabilities of the references
    (language tokens as fairseq's task places them) are the DeepNet's; the translate command on raw German
    with --source-lang de --target-lang fr gives the zero-shot hypotheses."""
    import numpy as np

    from deepnet_fairseq import translate

    run_dir, work = opus["run"], opus["tmp"] / "work"
    rows = {r["direction"]: r for r in csv.DictReader((run_dir / "eval/bleu.csv").open())}
    fairseq_hyps = {d: tp.read_lines(run_dir / f"eval/hyp.{d}.{d[3:]}") for d in rows}
    assert json.loads((run_dir / "eval/scores.json").read_text())["engine"] == "fairseq"
    args = [str(ROOT / "configs/opus100.yaml"), *paths(opus["tmp"]), *OPUS_DATA, *OPUS_TRAIN,
            "--arch", "deepnet", "--layers", "3,3", "--cpu", "--engine", "ctranslate2"]
    assert evaluate.main(args) == 0
    ct2_rows = {r["direction"]: r for r in csv.DictReader((run_dir / "eval/bleu.csv").open())}
    assert ct2_rows.keys() == rows.keys()
    assert json.loads((run_dir / "eval/scores.json").read_text())["engine"] == "ctranslate2"
    for direction, row in rows.items():
        assert tp.read_lines(run_dir / f"eval/hyp.{direction}.{direction[3:]}") == fairseq_hyps[direction], direction
        assert (ct2_rows[direction]["bleu"], ct2_rows[direction]["zero_shot"]) == (row["bleu"], row["zero_shot"])
        same = ("target_lang_acc", "top_wrong_lang", "top_wrong_share", "empty_share", "chrf", *evaluate.PIVOT_FIELDS)
        assert [ct2_rows[direction][k] for k in same] == [row[k] for k in same], direction

    model_dir = run_dir / "eval/ctranslate2"
    settings = json.loads((model_dir / "deploy.json").read_text())
    languages = settings["langs"], settings["encoder_langtok"], settings["decoder_langtok"]
    # the config's tags, t-enc-t-dec: the target's tag before the source and as the decoder's first token
    assert settings["segmentation"] == "sentencepiece" and languages == (["de", "en", "fr"], "tgt", True)
    scorer = translate.DeployedTranslator(model_dir).translator
    differences = {}
    for direction in rows:
        references = reference_log_probs(run_dir / "checkpoints/averaged_last2.pt", work / "bin", *direction.split("-"))
        assert references[0][0][0] == references[0][1][0] == f"__{direction[3:]}__"
        scored = scorer.score_batch([s for s, _, _ in references], [t for _, t, _ in references], max_input_length=0)
        differences[direction] = max(float(np.abs(np.array(r.log_probs) - lp).max())
                                     for r, (_, _, lp) in zip(scored, references))
    print(f"\nCTranslate2 vs the DeepNet, max |log-prob diff| per direction: {differences}")
    assert max(differences.values()) <= 1e-4

    out = opus["tmp"] / "translated.fr"
    capsys.readouterr()
    assert translate.main([str(model_dir), "--input", str(work / "ref/test.de-fr.de"), "--output", str(out)]) == 2
    assert "a multilingual model needs --source-lang and --target-lang from its languages: de en fr" in \
        capsys.readouterr().err
    assert translate.main([str(model_dir), "--source-lang", "de", "--target-lang", "fr", "--input",
                           str(work / "ref/test.de-fr.de"), "--output", str(out)]) == 0
    assert tp.read_lines(out) == fairseq_hyps["de-fr"]
    # a model decodes only with the language tags it was trained with: another strategy is refused in one line
    capsys.readouterr()
    assert evaluate.main([*args, "data.lang_tags=t-enc"]) == 2
    assert "trained with language tags t-enc-t-dec, but data.lang_tags is t-enc" in capsys.readouterr().err
