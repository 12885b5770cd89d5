"""Setups end to end on real text, offline, through the scripts a user runs.

- IWSLT-14 pipeline on Multi30k de-en (--raw-dir): prepare, binarise, train a tiny 2L-2L DeepNet,
  average, generate, score; BLEU must beat copying the source (2-process and 2-node runs: test_two_nodes.py).
- OPUS-100 (test_setup_opus.py) and WMT-17 (test_setup_wmt.py), with this module's helpers.
Models are d64 with 2 heads and train for a few hundred updates at most, on one CPU thread.
"""

import csv
import json
import time

import pytest
from conftest import IWSLT_DATA, ROOT, SCRIPTS, run

from deepnet_fairseq.models.deepnorm import deepnorm_constants
from deepnet_text import textprep as tp
from deepnet_setups import records as records_schema
from deepnet_setups.evaluate import bleu

TINY = ["model.embed_dim=64", "model.ffn_dim=128", "model.heads=2", "model.share_all_embeddings=true",
        "model.share_decoder_input_output_embed=false", "train.dropout=0.0", "train.log_interval=50",
        "eval.max_len_a=1.2", "eval.max_len_b=10"]  # an undertrained model must not ramble for 200 tokens


def paths(tmp):
    return [f"paths.work={tmp / 'work'}", f"paths.runs={tmp / 'runs'}", f"paths.results={tmp / 'results.jsonl'}"]


def timed(stages, name, cmd):
    start = time.time()
    proc = run(cmd)
    stages[name] = round(time.time() - start, 1)
    return proc


def all_stages(setup, raw, args, arch, layers, train):
    """A setup's four scripts (prepare, binarize, train, evaluate) on CPU: (wall time per stage, evaluate's output)."""
    config = ROOT / f"configs/{setup}.yaml"
    stages = {}
    timed(stages, "prepare", ["bash", SCRIPTS / f"prepare_{setup.split('_')[0]}.sh", "--raw-dir", raw, "--workers", "2",
                              *args])
    timed(stages, "binarize", ["bash", SCRIPTS / "binarize.sh", "--config", config, "--workers", "2", *args])
    timed(stages, "train", ["bash", SCRIPTS / f"train_{setup.split('_')[0]}.sh", "--arch", arch, "--layers", layers,
                            "--cpu", *args, *train])
    proc = timed(stages, "evaluate", ["bash", SCRIPTS / "evaluate.sh", "--config", config, "--arch", arch,
                                      "--layers", layers, "--cpu", *args, *train])
    return stages, proc


def records(tmp):
    return [json.loads(line) for line in (tmp / "results.jsonl").read_text().splitlines()]


# -- IWSLT-14 ------------------------------------------------------------------------------------

# 2L-2L, 120 updates: BLEU 3.02 against 0.66 for copying the source on the first 300 test sentences (on all
# 1000: 2.67 against 0.61; 4L-4L needed 200 updates for 2.03, in twice the time; 100 updates at lr 8e-3: 0.01)
IWSLT_TRAIN = TINY + ["train.max_update=120", "train.warmup_updates=40", "train.lr=5e-3", "train.max_tokens=2048",
                      "train.batch_tokens=2048", "train.save_interval_updates=20", "train.validate_interval_updates=120",
                      "eval.average_last=3"]


@pytest.fixture(scope="session")
def iwslt(tmp_path_factory, iwslt_work):
    tmp = tmp_path_factory.mktemp("iwslt")
    args = [f"paths.work={iwslt_work}", f"paths.runs={tmp / 'runs'}", f"paths.results={tmp / 'results.jsonl'}",
            *IWSLT_DATA]
    stages = {}
    timed(stages, "train", ["bash", SCRIPTS / "train_iwslt.sh", "--arch", "deepnet", "--layers", "2,2", "--cpu",
                            *args, *IWSLT_TRAIN])
    proc = timed(stages, "evaluate", ["bash", SCRIPTS / "evaluate.sh", "--config", ROOT / "configs/iwslt14_de_en.yaml",
                                      "--arch", "deepnet", "--layers", "2,2", "--cpu", *args, *IWSLT_TRAIN])
    print(f"\nIWSLT pipeline on Multi30k: stage wall times (s) {stages}\n{proc.stdout[-600:]}")
    return {"tmp": tmp, "work": iwslt_work, "args": args, "run": tmp / "runs/iwslt14_de_en/deepnet_source/2L-2L",
            "stages": stages, "eval_stdout": proc.stdout}


def test_iwslt_pipeline_bleu_beats_copying_the_source(iwslt):
    scores = json.loads((iwslt["run"] / "eval/scores.json").read_text())
    work = iwslt["work"]
    refs = tp.read_lines(work / "tok/test.en")
    hyps = tp.read_lines(iwslt["run"] / "eval/hyp.en")
    assert len(hyps) == len(refs) == 300
    # the score is sacreBLEU's on the BPE-removed tokenised output, and beats the copy-source baseline
    assert (scores["bleu"], scores["signature"]) == bleu(hyps, refs, tokenize="none")
    assert scores["copy_source_bleu"] == bleu(tp.read_lines(work / "tok/test.de"), refs, tokenize="none")[0]
    assert "tok:none" in scores["signature"] and "nrefs:1" in scores["signature"]
    assert scores["bleu"] > scores["copy_source_bleu"], scores
    assert not any("@@" in h for h in hyps)
    assert [name.rsplit("_", 1)[1] for name in scores["averaged"]] == ["80.pt", "100.pt", "120.pt"]
    # the record names the decoding as it ran: TINY's length limit, the config's beam and batch
    assert scores["decoding"] == {"beam": 5, "lenpen": 1.0, "max_len_a": 1.2, "max_len_b": 10, "max_tokens": 8000}
    assert f"BLEU {scores['bleu']}" in iwslt["eval_stdout"]


def test_iwslt_prepared_text_and_records(iwslt, iwslt_raw):
    work = iwslt["work"]
    train_de = tp.read_lines(work / "tok/train.de")
    valid_de = tp.read_lines(work / "tok/valid.de")
    assert len(train_de) + len(valid_de) <= 10000 and len(valid_de) == (len(train_de) + len(valid_de)) // 23
    assert all(line == line.lower() for line in train_de[:500])
    codes = (work / "bpe/codes").read_text(encoding="utf-8").splitlines()
    assert codes[0].startswith("#version") and len(codes) - 1 <= 3000
    assert (work / "bin/.done").exists() and (work / "bin/dict.de.txt").read_text() == (work / "bin/dict.en.txt").read_text()
    train, evaluation = records(iwslt["tmp"])
    assert train["kind"] == "train" and evaluation["kind"] == "eval"
    assert (train["updates"], train["diverged"], train["returncode"], train["world_size"]) == (120, False, 0, 1)
    for record in (train, evaluation):  # records say how the run ran, in the schema
        assert records_schema.problems(record) == [] and record["run"]["device"] == "cpu"
        assert {key: record["run"][key] for key in ("precision", "width", "ffn", "heads", "encoder_layers", "init")} == \
            {"precision": "fp32", "width": 64, "ffn": 128, "heads": 2, "encoder_layers": 2, "init": "source"}
        assert record["run"]["command"][0].endswith("fairseq-train") and record["run"]["versions"]["torch"]
        assert "precision" not in record["config"]["train"]  # a CPU run is given no precision: it computes in fp32
    assert evaluation["eval_device"] == "cpu" and evaluation["run"]["updates"] == evaluation["updates"]
    assert 0 < train["final_loss"] < 12
    constants = deepnorm_constants(2, 2)
    assert train["deepnorm"]["encoder_alpha"] == pytest.approx(constants.encoder_alpha)
    assert train["deepnorm_init"] == train["run"]["init"] == "source"  # the bilingual setups' default
    assert evaluation["deepnorm"] == train["deepnorm"]
    for record in (train, evaluation):  # the config names the depth trained (--layers), not the config file's
        assert (record["config"]["model"]["encoder_layers"], record["config"]["model"]["decoder_layers"]) == (2, 2)
    assert evaluation["bleu"] == json.loads((iwslt["run"] / "eval/scores.json").read_text())["bleu"]
    # a rerun of every stage skips the finished work
    proc = run(["bash", SCRIPTS / "prepare_iwslt14.sh", "--raw-dir", iwslt_raw, *iwslt["args"]])
    assert proc.stdout.count("already done") == 2
    proc = run(["bash", SCRIPTS / "train_iwslt.sh", "--arch", "deepnet", "--layers", "2,2", "--cpu",
                *iwslt["args"], *IWSLT_TRAIN])
    assert "already trained" in proc.stdout
    # another prep setting on the same work folder is refused rather than mixed in
    proc = run(["bash", SCRIPTS / "prepare_iwslt14.sh", "--raw-dir", iwslt_raw, *iwslt["args"],
                "prep.bpe_merges=5000"], check=False)
    assert proc.returncode == 2 and "different 'prep.bpe_merges'" in proc.stderr


def test_report_turns_records_into_a_depth_table(iwslt):
    out = iwslt["tmp"] / "report"
    run(["bash", SCRIPTS / "report", iwslt["tmp"] / "results.jsonl", "--out-dir", out])
    score = json.loads((iwslt["run"] / "eval/scores.json").read_text())["bleu"]
    table = (out / "results.md").read_text()
    assert "## iwslt14_de_en" in table and "| model | 2L-2L |" in table
    assert f"| DeepNet, source init | {score:.2f} |" in table  # the config's init, named where not the paper's
    rows = list(csv.reader((out / "iwslt14_de_en.csv").open()))
    assert rows == [["model", "2L-2L"], ["DeepNet, source init", f"{score:.2f}"]]
