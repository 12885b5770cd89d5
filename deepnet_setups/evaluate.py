"""Stage 4: average the last K checkpoints, translate the test set, score it with the setup's metric.

    python -m deepnet_setups.evaluate CONFIG [key=value ...] --arch deepnet --layers 18,18 [--run-dir DIR]

Metrics (``eval.metric``):
  tok_bleu             IWSLT-14: fairseq's BLEU (= multi-bleu) on BPE-removed, tokenised text
  compound_split_bleu  WMT-17: tokenised BLEU after fairseq's compound splitting, plus detokenised sacreBLEU
  sacrebleu            multilingual: detokenised, case-sensitive sacreBLEU per direction (CSV + heatmap)
Every score comes from sacreBLEU (``tokenize='none'`` is the tokenised BLEU) with its signature. The copy-
the-source baseline is scored the same way. Results go to <run>/eval/ and a record to ``paths.results``.
"""

import argparse
import csv
import json
import logging
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from deepnet_fairseq import textprep as tp
from . import langid
from deepnet_fairseq.average import average_checkpoints, last_checkpoints
from .config import ConfigError, load
from .launch import LaunchError, fairseq_arch, parse_layers, run_dir, run_settings
from .runner import BIN_DIR, USER_DIR, append_record, deepnorm_from_log


def bleu(hyps, refs, tokenize, lowercase=False):
    """(score, signature) of sacreBLEU."""
    from sacrebleu.metrics import BLEU

    metric = BLEU(tokenize=tokenize, lowercase=lowercase, force=True)
    return round(metric.corpus_score(hyps, [refs]).score, 2), str(metric.get_signature())


def generate_args(cfg, checkpoint, gen_args, cpu, plugin=True):
    """fairseq-generate's arguments (with ``--user-dir deepnet_fairseq`` unless ``plugin`` is False)."""
    ev = cfg["eval"]
    return [str(Path(cfg["paths"]["work"]) / "bin")] + (["--user-dir", str(USER_DIR)] if plugin else []) + [
            "--path", str(checkpoint),
            "--gen-subset", ev["subset"], "--beam", str(ev["beam"]), "--lenpen", str(ev["lenpen"]),
            "--max-tokens", str(ev["max_tokens"]), "--max-len-a", str(ev["max_len_a"]), "--max-len-b", str(ev["max_len_b"]),
            # fairseq 0.12's batch_by_size drops a last batch whose size is not a multiple of 8 otherwise
            "--required-batch-size-multiple", "1"] + gen_args + (["--cpu"] if cpu else [])


def hypotheses(output):
    """fairseq-generate's hypotheses (H- lines), ordered by sentence id."""
    hyps = {}
    for line in output.splitlines():
        match = re.match(r"^H-(\d+)\t[^\t]*\t?(.*)$", line)
        if match:
            hyps[int(match.group(1))] = match.group(2)
    return [hyps.get(i, "") for i in range(max(hyps) + 1)] if hyps else []


def generate(cfg, checkpoint, gen_args, cpu, log_path, plugin=True):
    """Run fairseq-generate; returns the hypotheses ordered by sentence id."""
    program = str(BIN_DIR / "fairseq-generate") if (BIN_DIR / "fairseq-generate").exists() else "fairseq-generate"
    cmd = [program] + generate_args(cfg, checkpoint, gen_args, cpu, plugin)
    print("[evaluate] " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log_path.write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise tp.DataError(f"fairseq-generate failed ({tail}); log: {log_path}")
    return hypotheses(proc.stdout)


def generate_here(cfg, checkpoint, gen_args, cpu, log_path):
    """fairseq-generate's own ``main`` with generate()'s arguments, in this process: one start (imports,
    plugin) for all the directions of a multilingual model instead of one each. Its log and output go to
    ``log_path``; returns the hypotheses ordered by sentence id."""
    from fairseq import options
    from fairseq_cli.generate import main as fairseq_generate

    results = log_path.with_name(log_path.name + ".d")  # fairseq writes generate-<subset>.txt there
    # no loader worker: in a process that lives on, torch joins it with a 5-second timeout per direction
    argv = generate_args(cfg, checkpoint, gen_args, cpu) + ["--num-workers", "0", "--results-path", str(results)]
    print("[evaluate] fairseq-generate (in this process) " + " ".join(shlex.quote(c) for c in argv), flush=True)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    with open(log_path, "w", encoding="utf-8") as log:
        root.handlers = [logging.StreamHandler(log)]
        root.setLevel(logging.INFO)
        try:
            fairseq_generate(options.parse_args_and_arch(options.get_generation_parser(), input_args=argv))
        except (Exception, SystemExit) as error:  # argparse exits; anything else is fairseq's failure
            logging.exception("fairseq-generate failed")
            raise tp.DataError(f"fairseq-generate failed ({type(error).__name__}: {error}); log: {log_path}") from None
        finally:
            root.handlers, root.level = handlers, level
        output = (results / f"generate-{cfg['eval']['subset']}.txt").read_text(encoding="utf-8")
        log.write(output)
    shutil.rmtree(results)
    return hypotheses(output)


ENGINES = ("fairseq", "ctranslate2", "ctranslate2_int8")


def ctranslate2_translator(cfg, checkpoint, out, engine):
    """``--engine ctranslate2[_int8]``: the checkpoint exported to ``<run>/eval/<engine>/``
    (deepnet_fairseq.export; int8 weights for ``ctranslate2_int8``) as a translator."""
    from deepnet_fairseq.export import ExportError, read_checkpoint, to_ctranslate2, to_plain_fairseq
    from deepnet_fairseq.translate import DeployedTranslator

    quantization = "int8" if engine == "ctranslate2_int8" else None
    try:
        exported = to_plain_fairseq(read_checkpoint(checkpoint), str(checkpoint))
        model_dir = to_ctranslate2(exported, out / engine, Path(cfg["paths"]["work"]), quantization, run_config=cfg)
    except ExportError as err:
        raise LaunchError(str(err)) from None
    print(f"[evaluate] CTranslate2 model: {model_dir}", flush=True)
    return DeployedTranslator(model_dir)


def ctranslate2_hypotheses(translator, segmented_source, batches, source_lang=None, target_lang=None):
    """The hypotheses for a segmented test source (BPE or SentencePiece, as fairseq-generate reads it)
    from CTranslate2, decoded in fairseq-generate's batches (so with its length limits), subwords
    removed as fairseq-generate's ``--remove-bpe`` does."""
    sources = [line.split() for line in tp.read_lines(segmented_source)]
    outputs = translator.translate_segmented(sources, source_lang, target_lang, batches=batches)
    return [translator.desegment(tokens) for tokens in outputs]


def fairseq_generate_batches(cfg, task_args=None):
    """The test set's sentence ids in fairseq-generate's batches (fairseq's own batching, eval.max_tokens),
    for the task that ``task_args`` sets (default: the bilingual setup's language pair).

    fairseq-generate's length limit is ``max_len_a * (the batch's longest source) + max_len_b``, so the
    same batches give CTranslate2 the same limit for every sentence."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    data, ev = cfg["data"], cfg["eval"]
    task_args = task_args or ["--source-lang", data["source_lang"], "--target-lang", data["target_lang"]]
    parser = options.get_generation_parser()
    gen = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, [
        str(Path(cfg["paths"]["work"]) / "bin"), *task_args, "--gen-subset", ev["subset"],
        "--max-tokens", str(ev["max_tokens"]), "--required-batch-size-multiple", "1"]))
    task = tasks.setup_task(gen.task)
    task.load_dataset(ev["subset"], task_cfg=gen.task)
    iterator = task.get_batch_iterator(  # as fairseq_cli/generate.py asks for it
        dataset=task.dataset(ev["subset"]), max_tokens=gen.dataset.max_tokens, max_sentences=gen.dataset.batch_size,
        max_positions=task.max_positions(), required_batch_size_multiple=1, seed=gen.common.seed)
    return [batch["id"].tolist() for batch in iterator.next_epoch_itr(shuffle=False)]


def evaluate_bilingual(cfg, checkpoint, cpu, out, engine="fairseq"):
    data, ev = cfg["data"], cfg["eval"]
    src, tgt = data["source_lang"], data["target_lang"]
    work = Path(cfg["paths"]["work"])
    if engine != "fairseq":
        translator = ctranslate2_translator(cfg, checkpoint, out, engine)
        hyps = ctranslate2_hypotheses(translator, work / "bpe" / f"test.{src}", fairseq_generate_batches(cfg))
    else:
        hyps = generate(cfg, checkpoint, ["--source-lang", src, "--target-lang", tgt, "--remove-bpe"], cpu,
                        out / "generate.log")
    refs = tp.read_lines(work / "tok" / f"test.{tgt}")
    sources = tp.read_lines(work / "tok" / f"test.{src}")
    if len(hyps) != len(refs):
        raise tp.DataError(f"{out / 'generate.log'}: {len(hyps)} hypotheses for {len(refs)} references")
    tp.write_lines(out / f"hyp.{tgt}", hyps)
    result = {}
    if ev["metric"] == "compound_split_bleu":
        split = [tp.compound_split(x) for x in hyps], [tp.compound_split(x) for x in refs]
        result["bleu"], result["signature"] = bleu(*split, tokenize="none")
        result["copy_source_bleu"], _ = bleu([tp.compound_split(x) for x in sources], split[1], tokenize="none")
        result["metric"] = "compound-split tokenised BLEU (fairseq's compound_split_bleu.sh)"
        detok = tp.moses_detokenize(hyps, tgt)
        raw_refs = tp.read_lines(work / "ref" / f"test.{tgt}")
        tp.write_lines(out / f"hyp.detok.{tgt}", detok)
        result["sacrebleu"], result["sacrebleu_signature"] = bleu(detok, raw_refs, tokenize=ev["sacrebleu_tokenize"])
    elif ev["metric"] == "tok_bleu":
        result["bleu"], result["signature"] = bleu(hyps, refs, tokenize="none")
        result["copy_source_bleu"], _ = bleu(sources, refs, tokenize="none")
        result["metric"] = "tokenised BLEU on BPE-removed text (fairseq's BLEU)"
    else:
        raw_refs = tp.read_lines(work / "ref" / f"test.{tgt}")
        detok = tp.moses_detokenize(hyps, tgt) if cfg["prep"]["tokenizer"] == "moses" else hyps
        result["bleu"], result["signature"] = bleu(detok, raw_refs, tokenize=ev["sacrebleu_tokenize"])
        result["copy_source_bleu"], _ = bleu(tp.read_lines(work / "ref" / f"test.{src}"), raw_refs,
                                             tokenize=ev["sacrebleu_tokenize"])
        result["metric"] = "detokenised sacreBLEU"
    result["sentences"] = len(hyps)
    result["engine"] = engine
    return result


def group_members(cfg, pattern, directions):
    zero_shot = set(cfg["data"]["zero_shot_pairs"])
    if pattern == "zero-shot":
        return [d for d in directions if d in zero_shot]
    if pattern == "non-en":
        return [d for d in directions if "en" not in d.split("-")]
    src, _, tgt = pattern.partition("-")
    return [d for d in directions if (src in ("*", d.split("-")[0])) and (tgt in ("*", d.split("-")[1]))]


def multilingual_test_directions(cfg):
    """(direction, its corpus, fairseq's task options for it) for every direction with test references:
    the training pairs, then the zero-shot ones."""
    data, work = cfg["data"], Path(cfg["paths"]["work"])
    for direction in data["lang_pairs"] + [p for p in data["zero_shot_pairs"] if p not in data["lang_pairs"]]:
        s, t = direction.split("-")
        corpus = "-".join(sorted((s, t)))
        if (work / "ref" / f"test.{corpus}.{t}").exists():
            yield direction, corpus, ["--task", "translation_multi_simple_epoch", "--lang-pairs",
                                      ",".join(data["lang_pairs"]), "--langs", ",".join(data["langs"]),
                                      "--source-lang", s, "--target-lang", t, "--encoder-langtok", "src",
                                      "--decoder-langtok"]


def evaluate_multilingual(cfg, checkpoint, cpu, out, engine="fairseq"):
    data, ev = cfg["data"], cfg["eval"]
    work = Path(cfg["paths"]["work"])
    translator = ctranslate2_translator(cfg, checkpoint, out, engine) if engine != "fairseq" else None
    rows = []
    for direction, corpus, task_args in multilingual_test_directions(cfg):
        s, t = direction.split("-")
        ref_path = work / "ref" / f"test.{corpus}.{t}"
        if translator:
            hyps = ctranslate2_hypotheses(translator, work / "spm_text" / f"test.{corpus}.{s}",
                                          fairseq_generate_batches(cfg, task_args), s, t)
        else:
            hyps = generate_here(cfg, checkpoint, task_args + ["--remove-bpe", "sentencepiece"], cpu,
                                 out / f"generate.{direction}.log")
        refs = tp.read_lines(ref_path)
        sources = tp.read_lines(work / "ref" / f"test.{corpus}.{s}")
        tp.write_lines(out / f"hyp.{direction}.{t}", hyps)
        score, signature = bleu(hyps, refs, tokenize=ev["sacrebleu_tokenize"])
        copy, _ = bleu(sources, refs, tokenize=ev["sacrebleu_tokenize"])
        rows.append({"src": s, "tgt": t, "direction": direction, "zero_shot": direction in data["zero_shot_pairs"],
                     "bleu": score, "copy_source_bleu": copy, "sentences": len(hyps), "signature": signature})
        rows[-1].update(langid.target_language_accuracy(hyps, t, data["langs"]))  # off-target output (issue 28)
        print(f"[evaluate] {direction}: BLEU {score} (copy-source {copy})", flush=True)
    if not rows:
        raise tp.DataError(f"{work / 'ref'}: no test references for any direction")
    with tp.atomic_write(out / "bleu.csv") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    heatmap(rows, data["langs"], out / "bleu_heatmap.png", cfg["setup"])
    directions = [r["direction"] for r in rows]
    by_direction = {r["direction"]: r["bleu"] for r in rows}
    groups = {}
    for name, patterns in ev["groups"].items():
        members = sorted({d for p in patterns for d in group_members(cfg, p, directions)})
        if members:
            groups[name] = {"bleu": round(sum(by_direction[d] for d in members) / len(members), 2),
                            "directions": len(members)}
            groups[name]["target_lang_acc"] = langid.mean_accuracy([r for r in rows if r["direction"] in members])
    print(langid.table(rows, groups), flush=True)
    return {"bleu": round(sum(by_direction.values()) / len(rows), 2), "signature": rows[0]["signature"],
            "copy_source_bleu": round(sum(r["copy_source_bleu"] for r in rows) / len(rows), 2),
            "metric": "average detokenised sacreBLEU over directions", "groups": groups, "directions": rows,
            "engine": engine, "langid": langid.identifier_name()}


def heatmap(rows, langs, path, title):
    """Source x target BLEU matrix (the paper's Figures 9-10 style)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    used = [lang for lang in langs if any(lang in (r["src"], r["tgt"]) for r in rows)]
    index = {lang: i for i, lang in enumerate(used)}
    grid = np.full((len(used), len(used)), np.nan)
    for r in rows:
        grid[index[r["src"]], index[r["tgt"]]] = r["bleu"]
    fig, ax = plt.subplots(figsize=(3.5 + 0.5 * len(used), 2.5 + 0.45 * len(used)))
    image = ax.imshow(grid, cmap="viridis")
    ax.set_xticks(range(len(used)), used)
    ax.set_yticks(range(len(used)), used)
    ax.set_xlabel("target")
    ax.set_ylabel("source")
    ax.set_title(f"{title}: sacreBLEU")
    if len(used) <= 12:
        for r in rows:
            mark = "*" if r["zero_shot"] else ""
            ax.text(index[r["tgt"]], index[r["src"]], f"{r['bleu']:.1f}{mark}", ha="center", va="center",
                    color="white", fontsize=8)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.rename(path)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--arch", help="deepnet | preln | postln (with --layers: finds the run folder)")
    parser.add_argument("--layers", help="N or N,M")
    parser.add_argument("--run-dir", help="the run folder (default: from --arch/--layers)")
    parser.add_argument("--average-last", type=int, help="average the last K checkpoints (default: eval.average_last)")
    parser.add_argument("--cpu", action="store_true", help="generate on CPU (default when no GPU is visible)")
    parser.add_argument("--engine", choices=ENGINES, default="fairseq",
                        help="decode with fairseq-generate (default) or CTranslate2, float32 or int8 weights "
                             "(docs/deploy.md)")
    opts = parser.parse_intermixed_args(argv)
    try:
        cfg = load(opts.config, opts.overrides)
        if opts.run_dir:
            folder = Path(opts.run_dir)
        elif opts.arch:
            fairseq_arch(opts.arch, cfg["model"]["size"])
            layers = parse_layers(opts.layers) if opts.layers else (cfg["model"]["encoder_layers"], cfg["model"]["decoder_layers"])
            folder = run_dir(cfg, opts.arch, layers)
        else:
            raise LaunchError("give --run-dir DIR or --arch A [--layers N,M]")
        if not (folder / "checkpoints").is_dir():
            raise LaunchError(f"{folder / 'checkpoints'}: no checkpoints (train first)")
        train_cfg = json.loads((folder / "config.resolved.json").read_text()) if (folder / "config.resolved.json").exists() else {}
        arch = opts.arch or folder.parent.name
        layers = tuple(int(x) for x in folder.name.rstrip("L").split("L-")) if re.match(r"^\d+L-\d+L$", folder.name) else None
        cpu = opts.cpu
        if not cpu:
            import torch

            cpu = not torch.cuda.is_available()
        start = time.time()
        out = folder / "eval"
        out.mkdir(parents=True, exist_ok=True)
        k = opts.average_last or cfg["eval"]["average_last"]
        try:
            chosen = last_checkpoints(folder / "checkpoints", k)
        except FileNotFoundError as err:
            raise LaunchError(str(err)) from None
        averaged = average_checkpoints(chosen, folder / "checkpoints" / f"averaged_last{len(chosen)}.pt")
        print(f"[evaluate] averaged {len(chosen)} checkpoints: {', '.join(p.name for p in chosen)}", flush=True)
        if cfg["data"]["kind"] == "multilingual":
            result = evaluate_multilingual(cfg, averaged, cpu, out, opts.engine)
        else:
            result = evaluate_bilingual(cfg, averaged, cpu, out, opts.engine)
        result.update({"kind": "eval", "setup": cfg["setup"], "arch": arch,
                       "encoder_layers": layers[0] if layers else None, "decoder_layers": layers[1] if layers else None,
                       "deepnorm": deepnorm_from_log(folder / "train.log"),
                       "averaged": [p.name for p in chosen], "updates": _updates(chosen[-1]),
                       "run_dir": str(folder), "wall_time_s": round(time.time() - start, 1),
                       "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                       "max_update": train_cfg.get("train", {}).get("max_update"), **run_settings(train_cfg)})
        with tp.atomic_write(out / "scores.json") as handle:
            json.dump(result, handle, indent=1)
        append_record(cfg["paths"]["results"], result)
        print(f"[evaluate] BLEU {result['bleu']} ({result['metric']}); copy-source baseline "
              f"{result.get('copy_source_bleu', '-')}\n[evaluate] signature: {result['signature']}")
        if "sacrebleu" in result:
            print(f"[evaluate] detokenised sacreBLEU {result['sacrebleu']} ({result['sacrebleu_signature']})")
        for name, group in result.get("groups", {}).items():
            print(f"[evaluate] {name}: {group['bleu']} over {group['directions']} directions")
    except (ConfigError, LaunchError, tp.DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _updates(checkpoint):
    match = re.search(r"_(\d+)\.pt$", checkpoint.name)
    return int(match.group(1)) if match else None


if __name__ == "__main__":
    sys.exit(main())
