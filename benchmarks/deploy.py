"""Deployment speed: fairseq-generate vs CTranslate2 (float32 and int8) on a trained run, with BLEU.

    .venv/bin/python -m benchmarks.deploy --run-dir RUN --config configs/iwslt14_de_en.yaml [key=value ...]
    .venv/bin/python -m benchmarks.deploy --run-dir RUN --config configs/opus100.yaml [key=value ...]   (multilingual)

RUN is a run folder of the shipped pipeline (docs/deploy.md has the commands that trained the one
measured). Its last ``eval.average_last`` checkpoints are averaged as ``scripts/evaluate.sh`` does;
the average is exported to CTranslate2 at float32 and int8 (``deepnet_fairseq.export``) and to
fairseq's ``transformer``. Then, in ``--rounds`` rounds with the order rotated each round, the
segmented test set (BPE; a multilingual setup's SentencePiece test sets, every direction with
references, zero-shot included) is decoded, one thread, with the setup's eval settings (beam,
length penalty, maximum length):

- ``fairseq``: fairseq-generate with the plugin on the averaged DeepNet checkpoint (what
  ``scripts/evaluate.sh`` runs: a subprocess for a bilingual setup, fairseq-generate's ``main`` in
  this process for each direction of a multilingual one); time = N / the sentences/s of its own
  "Translated N sentences ... (S sentences/s)" (model loading and data reading excluded), summed over
  directions;
- ``ct2_float32``, ``ct2_int8``: ``DeployedTranslator.translate_segmented`` on fairseq-generate's
  batches (what ``evaluate.sh --engine ctranslate2`` runs), timed around the call (model loading
  excluded).

Bilingual setups, once, untimed: ``fairseq-generate`` without the plugin on the exported
``transformer`` checkpoint, and the exactness of each export (teacher-forced log-probabilities).
Each engine's hypotheses are scored with the setup's metric (evaluate.py's ``bleu``; multilingual:
per direction and averaged), and compared sentence by sentence with fairseq's. Writes
``benchmarks/results/deploy_cpu.json`` (``--out``).
"""

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from deepnet_fairseq import export  # noqa: E402
from deepnet_fairseq.average import average_checkpoints, last_checkpoints  # noqa: E402
from deepnet_setups.config import load  # noqa: E402
from deepnet_setups.evaluate import (  # noqa: E402
    bleu, check_lang_tags, fairseq_generate_batches, generate, generate_here, multilingual_test_directions)
from deepnet_fairseq.translate import DeployedTranslator  # noqa: E402
from deepnet_text import textprep as tp  # noqa: E402

from .common import ROOT, machine, write_json  # noqa: E402

# fairseq-generate's summary; its sentences/s (2 decimals) times more finely than its seconds (1 decimal)
SPEED = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s \(([\d.]+) sentences/s")


def fairseq_engine(cfg, checkpoint, direction, log, plugin=True):
    """(hypotheses, seconds) of fairseq-generate on one direction, timed by fairseq-generate itself."""
    if direction["multilingual"]:
        hyps = generate_here(cfg, checkpoint, direction["task_args"] + ["--remove-bpe", "sentencepiece"], True, log)
    else:
        hyps = generate(cfg, checkpoint, direction["task_args"] + ["--remove-bpe"], True, log, plugin)
    match = SPEED.search(log.read_text())
    return hyps, int(match.group(1).replace(",", "")) / float(match.group(4))


def ct2_engine(translator, direction):
    start = time.perf_counter()
    outputs = translator.translate_segmented(direction["sources"], direction["src"], direction["tgt"],
                                             batches=direction["batches"])
    seconds = time.perf_counter() - start
    return [translator.desegment(tokens) for tokens in outputs], seconds


def reference_log_probs(checkpoint, data, sentences=100):
    """Per-sentence log-probabilities of the test references (</s> included) under a fairseq checkpoint,
    teacher-forced; with each sentence's source and target as the tokens CTranslate2 reads."""
    import torch
    from fairseq import checkpoint_utils

    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides={"data": str(data)})
    model.eval()
    task.load_dataset("test")
    dataset, src_dict, tgt_dict = task.dataset("test"), task.source_dictionary, task.target_dictionary
    log_probs, pairs = {}, {}
    with torch.no_grad():
        for start in range(0, len(dataset), sentences):
            batch = dataset.collater([dataset[i] for i in range(start, min(start + sentences, len(dataset)))])
            out = model(**batch["net_input"])
            lprobs = model.get_normalized_probs(out, log_probs=True).gather(2, batch["target"][:, :, None])[:, :, 0]
            for i, lp, s, t in zip(batch["id"].tolist(), lprobs, batch["net_input"]["src_tokens"], batch["target"]):
                log_probs[i] = lp[t.ne(tgt_dict.pad())].numpy()
                pairs[i] = ([src_dict[x] for x in s[s.ne(src_dict.pad())][:-1]], [tgt_dict[x] for x in t[t.ne(tgt_dict.pad())][:-1]])
    return log_probs, pairs


def exactness(averaged, plain, translators, data):
    """Max |log-prob difference| against the original DeepNet: the exported transformer, each CTranslate2 model."""
    import numpy as np

    original, pairs = reference_log_probs(averaged, data)
    ids = sorted(original)
    differences = {"fairseq_plain_transformer": reference_log_probs(plain, data)[0]}
    for name, translator in translators.items():
        scored = translator.translator.score_batch([pairs[i][0] for i in ids], [pairs[i][1] for i in ids],
                                                   max_batch_size=32, max_input_length=0)
        differences[name] = {i: np.array(r.log_probs) for i, r in zip(ids, scored)}
    return {name: float(max(np.abs(values[i] - original[i]).max() for i in ids)) for name, values in differences.items()}


def decoded_directions(cfg):
    """The directions decoded: the bilingual pair, or every direction of a multilingual setup with test
    references; each with its segmented sources, references, BLEU tokenisation and fairseq's batches."""
    work, data, ev = Path(cfg["paths"]["work"]), cfg["data"], cfg["eval"]
    if data["kind"] != "multilingual":
        src, tgt = data["source_lang"], data["target_lang"]
        yield {"name": f"{src}-{tgt}", "src": src, "tgt": tgt, "multilingual": False, "tokenize": "none",
               "task_args": ["--source-lang", src, "--target-lang", tgt],
               "sources": [line.split() for line in tp.read_lines(work / "bpe" / f"test.{src}")],
               "refs": tp.read_lines(work / "tok" / f"test.{tgt}"), "batches": fairseq_generate_batches(cfg)}
        return
    for name, corpus, task_args in multilingual_test_directions(cfg):
        src, tgt = name.split("-")
        yield {"name": name, "src": src, "tgt": tgt, "multilingual": True, "tokenize": ev["sacrebleu_tokenize"],
               "zero_shot": name in data["zero_shot_pairs"], "task_args": task_args,
               "sources": [line.split() for line in tp.read_lines(work / "spm_text" / f"test.{corpus}.{src}")],
               "refs": tp.read_lines(work / "ref" / f"test.{corpus}.{tgt}"),
               "batches": fairseq_generate_batches(cfg, task_args)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("overrides", nargs="*", help="section.key=value, as given to the pipeline's scripts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/deploy_cpu.json"))
    args = parser.parse_args(argv)
    cfg = load(args.config, args.overrides)
    run_dir, work = Path(args.run_dir), Path(cfg["paths"]["work"])
    multilingual = cfg["data"]["kind"] == "multilingual"
    scratch = run_dir / "deploy_bench"
    scratch.mkdir(exist_ok=True)
    chosen = last_checkpoints(run_dir / "checkpoints", cfg["eval"]["average_last"])
    if multilingual:  # decode with the language tags the model learnt (data.lang_tags), or stop in one line
        try:
            check_lang_tags(cfg, chosen[-1])
        except ValueError as err:
            sys.exit(f"benchmarks.deploy: {err}")
    averaged = average_checkpoints(chosen, scratch / f"averaged_last{len(chosen)}.pt")
    exported = export.to_plain_fairseq(export.read_checkpoint(averaged), str(averaged))
    export.save_atomic(exported, scratch / "transformer.pt")
    translators = {}
    for name, quantization in (("ct2_float32", None), ("ct2_int8", "int8")):
        model_dir = export.to_ctranslate2(exported, scratch / name, work, quantization, run_config=cfg)
        translators[name] = DeployedTranslator(model_dir, threads=1)
    directions = list(decoded_directions(cfg))
    sentences = sum(len(d["sources"]) for d in directions)

    engines = ["fairseq", "ct2_float32", "ct2_int8"]
    seconds = {name: [] for name in engines}
    hyps = {name: {} for name in engines}
    for round_index in range(args.rounds):
        order = engines[round_index % len(engines):] + engines[:round_index % len(engines)]
        for name in order:
            spent = 0.0
            for d in directions:
                if name == "fairseq":
                    hyps[name][d["name"]], took = fairseq_engine(cfg, averaged, d, scratch / f"generate.{d['name']}.log")
                else:
                    hyps[name][d["name"]], took = ct2_engine(translators[name], d)
                spent += took
            seconds[name].append(spent)
            print(f"[deploy] round {round_index + 1} {name}: {sentences / spent:.1f} sentences/s", flush=True)
    max_log_prob_difference = {}
    if not multilingual:  # once, untimed: plain fairseq without the plugin, and each export's exactness
        (d,) = directions
        engines.append("fairseq_plain_transformer")
        hyps["fairseq_plain_transformer"] = {d["name"]: fairseq_engine(cfg, scratch / "transformer.pt", d,
                                                                       scratch / "generate_plain.log", plugin=False)[0]}
        max_log_prob_difference = exactness(averaged, scratch / "transformer.pt", translators, work / "bin")

    results = {}
    for name in engines:
        row = {"same_hypotheses_as_fairseq": 0, "bleu_by_direction": {}}
        for d in directions:
            lines = hyps[name][d["name"]]
            tp.write_lines(scratch / f"hyp.{name}.{d['name']}.{d['tgt']}", lines)
            row["bleu_by_direction"][d["name"]], row["signature"] = bleu(lines, d["refs"], tokenize=d["tokenize"])
            row["same_hypotheses_as_fairseq"] += sum(a == b for a, b in zip(lines, hyps["fairseq"][d["name"]]))
        row["bleu"] = round(statistics.mean(row["bleu_by_direction"].values()), 2)
        if name != "fairseq":
            row["bleu_change_vs_fairseq"] = {k: round(v - results["fairseq"]["bleu_by_direction"][k], 2)
                                             for k, v in row["bleu_by_direction"].items()}
        if name in max_log_prob_difference:
            row["max_abs_log_prob_difference_vs_original"] = max_log_prob_difference[name]
        if name in seconds:
            row["sentences_per_s"] = [round(sentences / s, 2) for s in seconds[name]]
            row["median_sentences_per_s"] = round(sentences / statistics.median(seconds[name]), 2)
        results[name] = row
    base = results["fairseq"]["median_sentences_per_s"]
    for name in ("ct2_float32", "ct2_int8"):
        results[name]["speedup_vs_fairseq"] = round(results[name]["median_sentences_per_s"] / base, 2)
    payload = {
        "what": "beam search on the test set, one thread: fairseq-generate vs CTranslate2 (docs/deploy.md)",
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.deploy " + " ".join(sys.argv[1:] if argv is None else argv),
        "run_dir": str(run_dir), "averaged": [p.name for p in chosen], "sentences": sentences,
        "directions": {d["name"]: {"sentences": len(d["sources"]), "batches": len(d["batches"]),
                                   "zero_shot": d.get("zero_shot", False)} for d in directions},
        "decoding": {k: cfg["eval"][k] for k in ("beam", "lenpen", "max_len_a", "max_len_b", "max_tokens")},
        "rounds": args.rounds, "deepnorm_alpha": exported["exported_from"]["deepnorm_alpha"],
        "layer_norm_epsilon_ct2": json.loads((scratch / "ct2_float32" / "deploy.json").read_text())["layer_norm_epsilon"],
        "machine": machine(), "load_average": os.getloadavg(), "results": results,
    }
    write_json(args.out, payload)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
