"""The WMT-17 setup end to end on a Multi30k slice with newstest2013/2014 as valid/test, through its scripts:
Moses -a, compound-split BLEU and detokenised sacreBLEU."""

import json

import pytest
from conftest import SHARED_DATA
from test_setup_pipelines import TINY, all_stages, paths

from deepnet_text import textprep as tp
from deepnet_setups.evaluate import bleu

# ~100 s of a make test worker; make test runs the IWSLT-14 pipeline end to end (test_setup_pipelines.py)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def wmt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wmt")
    raw = tmp / "raw"
    for lang in ("en", "de"):
        train = (SHARED_DATA / f"multi30k_de_en/train.{lang}").read_text(encoding="utf-8").splitlines()[:4000]
        tp.write_lines(raw / f"train.{lang}", train)
        for name, n in (("newstest2013", 100), ("newstest2014", 100)):
            news = (SHARED_DATA / f"wmt_newstest_de_en/{name}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            tp.write_lines(raw / f"{name}.{lang}", news)
    args = paths(tmp) + ["data.train=[train]", "data.valid=[newstest2013]", "data.test=[newstest2014]",
                         "prep.bpe_merges=2000"]
    train = TINY + ["train.max_update=20", "train.warmup_updates=10", "train.lr=3e-3", "train.max_tokens=2048",
                    "train.batch_tokens=2048", "train.save_interval_updates=10", "train.validate_interval_updates=20",
                    "eval.average_last=2", "eval.max_tokens=4000"]
    stages, proc = all_stages("wmt17_en_de", raw, args, "postln", "2,2", train)
    print(f"\nWMT-17 pipeline on a Multi30k slice: stage wall times (s) {stages}\n{proc.stdout[-600:]}")
    return {"tmp": tmp, "raw": raw, "run": tmp / "runs/wmt17_en_de/postln/2L-2L", "stdout": proc.stdout}


def test_wmt_pipeline_scores_compound_split_bleu_and_sacrebleu(wmt):
    work = wmt["tmp"] / "work"
    tok_refs = tp.read_lines(work / "tok/test.de")
    assert any(" @-@ " in line for line in tok_refs)  # Moses -a splits dashes; compound splitting sees them
    scores = json.loads((wmt["run"] / "eval/scores.json").read_text())
    hyps = tp.read_lines(wmt["run"] / "eval/hyp.de")
    split_refs = [tp.compound_split(r) for r in tok_refs]
    assert any("##AT##-##AT##" in r for r in split_refs)
    assert (scores["bleu"], scores["signature"]) == bleu([tp.compound_split(h) for h in hyps], split_refs, tokenize="none")
    raw_refs = tp.read_lines(wmt["raw"] / "newstest2014.de")
    detok = tp.read_lines(wmt["run"] / "eval/hyp.detok.de")
    assert (scores["sacrebleu"], scores["sacrebleu_signature"]) == bleu(detok, raw_refs, tokenize="13a")
    assert "compound-split" in scores["metric"] and len(hyps) == 100
    assert f"detokenised sacreBLEU {scores['sacrebleu']}" in wmt["stdout"]
