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

import deepnet_methods
from deepnet_text import textprep as tp

from . import lang_tags, langid
from .config import ConfigError, load
from . import records
from .launch import LaunchError, config_block, fairseq_arch, parse_layers, run_dir
from .runner import USER_DIR, append_record, fairseq_options, program


def bleu(hyps, refs, tokenize, lowercase=False):
    """(score, signature) of sacreBLEU."""
    from sacrebleu.metrics import BLEU

    metric = BLEU(tokenize=tokenize, lowercase=lowercase, force=True)
    return round(metric.corpus_score(hyps, [refs]).score, 2), str(metric.get_signature())


def chrf(hyps, refs):
    """chrF++ (sacreBLEU's chrF with word bigrams): where BLEU is near 0 it still tells outputs apart."""
    from sacrebleu.metrics import CHRF

    return round(CHRF(word_order=2).corpus_score(hyps, [refs]).score, 2)


def generate_args(cfg, checkpoint, gen_args, cpu, plugin=True, data_dir=None):
    """fairseq-generate's arguments (with ``--user-dir deepnet_fairseq`` unless ``plugin`` is False) on the
    setup's binarised data, or on ``data_dir``."""
    ev = cfg["eval"]
    data_dir = data_dir or Path(cfg["paths"]["work"]) / "bin"
    return [str(data_dir)] + (["--user-dir", str(USER_DIR)] if plugin else []) + [
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
    cmd = [program("fairseq-generate")] + generate_args(cfg, checkpoint, gen_args, cpu, plugin)
    print("[evaluate] " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log_path.write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise tp.DataError(f"fairseq-generate failed ({tail}); log: {log_path}")
    return hypotheses(proc.stdout)


def generate_here(cfg, checkpoint, gen_args, cpu, log_path, data_dir=None):
    """fairseq-generate's own ``main`` with generate()'s arguments, in this process: one start (imports,
    plugin) for all the directions of a multilingual model instead of one each. Its log and output go to
    ``log_path``; returns the hypotheses ordered by sentence id."""
    from fairseq import options
    from fairseq_cli.generate import main as fairseq_generate

    results = log_path.with_name(log_path.name + ".d")  # fairseq writes generate-<subset>.txt there
    # no loader worker: in a process that lives on, torch joins it with a 5-second timeout per direction
    argv = generate_args(cfg, checkpoint, gen_args, cpu, data_dir=data_dir) + ["--num-workers", "0",
                                                                                "--results-path", str(results)]
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
# a zero-shot direction's scores through English (None elsewhere)
PIVOT_FIELDS = ("pivot_bleu", "pivot_chrf", "pivot_target_lang_acc", "zero_shot_over_pivot")


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


def fairseq_generate_batches(cfg, task_args=None, data_dir=None):
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
        str(data_dir or Path(cfg["paths"]["work"]) / "bin"), *task_args, "--gen-subset", ev["subset"],
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


def multilingual_task_args(cfg, source_lang, target_lang):
    """fairseq's task options for one direction of the setup's multilingual model, tags as data.lang_tags."""
    data = cfg["data"]
    return ["--task", "translation_multi_simple_epoch", "--lang-pairs", ",".join(data["lang_pairs"]),
            "--langs", ",".join(data["langs"]), "--source-lang", source_lang, "--target-lang", target_lang,
            *fairseq_options(lang_tags.task_options(data["lang_tags"]))]


def multilingual_test_directions(cfg):
    """(direction, its corpus) for every direction with test references: the training pairs, then the
    zero-shot ones."""
    data, work = cfg["data"], Path(cfg["paths"]["work"])
    for direction in data["lang_pairs"] + [p for p in data["zero_shot_pairs"] if p not in data["lang_pairs"]]:
        s, t = direction.split("-")
        corpus = "-".join(sorted((s, t)))
        if (work / "ref" / f"test.{corpus}.{t}").exists():
            yield direction, corpus


PIVOT_LANG = "en"  # the setups are English-centric: every language has a trained direction to and from it


def translate_multilingual(cfg, checkpoint, cpu, out, translator, source_lang, target_lang, segmented_source,
                           name, data_dir=None):
    """Hypotheses for a segmented source file in one direction, with the evaluation's engine: fairseq-generate
    on ``data_dir`` (default: the setup's binarised data), or CTranslate2 in fairseq-generate's batches."""
    task_args = multilingual_task_args(cfg, source_lang, target_lang)
    if translator:
        return ctranslate2_hypotheses(translator, segmented_source, fairseq_generate_batches(cfg, task_args, data_dir),
                                      source_lang, target_lang)
    return generate_here(cfg, checkpoint, task_args + ["--remove-bpe", "sentencepiece"], cpu,
                         out / f"generate.{name}.log", data_dir)


def binarise_lines(cfg, folder, source_lang, target_lang, source, target):
    """Segmented lines as a binarised test set of one direction in ``folder`` (the setup's joint dictionary,
    and one dict.<lang>.txt per language as the multilingual task reads them)."""
    work = Path(cfg["paths"]["work"])
    text = folder / "text"
    text.mkdir(parents=True, exist_ok=True)
    prefix = text / f"test.{source_lang}-{target_lang}"
    tp.write_lines(Path(f"{prefix}.{source_lang}"), source)
    tp.write_lines(Path(f"{prefix}.{target_lang}"), target)
    shutil.rmtree(folder / "bin", ignore_errors=True)
    dictionary = work / "spm" / "dict.txt"
    proc = subprocess.run([program("fairseq-preprocess"), "--source-lang", source_lang,
                           "--target-lang", target_lang, "--testpref", str(prefix), "--destdir", str(folder / "bin"),
                           "--srcdict", str(dictionary), "--tgtdict", str(dictionary), "--workers", "1"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise tp.DataError(f"fairseq-preprocess failed for {prefix} ({(proc.stderr.strip().splitlines() or ['?'])[-1]})")
    for lang_dict in (work / "bin").glob("dict.*.txt"):
        shutil.copy(lang_dict, folder / "bin" / lang_dict.name)
    return folder / "bin"


def pivot_hypotheses(cfg, checkpoint, cpu, out, translator, direction, corpus):
    """A zero-shot direction s-t through English with the same model and engine (s -> en -> t): the
    reference that a zero-shot score is judged against."""
    s, t = direction.split("-")
    work = Path(cfg["paths"]["work"])
    model = work / "spm" / "spm.model"
    source, target = work / "spm_text" / f"test.{corpus}.{s}", work / "spm_text" / f"test.{corpus}.{t}"
    # fairseq's task loads a target side for every test set; the first step has no English reference, so its
    # placeholder is the source itself (only the hypotheses are used)
    step = out / f"pivot.{direction}"
    first_bin = binarise_lines(cfg, step / f"{s}-{PIVOT_LANG}", s, PIVOT_LANG, tp.read_lines(source), tp.read_lines(source))
    pivot = translate_multilingual(cfg, checkpoint, cpu, out, translator, s, PIVOT_LANG,
                                   first_bin.parent / "text" / f"test.{s}-{PIVOT_LANG}.{s}",
                                   f"pivot.{s}-{PIVOT_LANG}-{t}.1", first_bin)
    tp.write_lines(out / f"hyp.pivot.{direction}.{PIVOT_LANG}", pivot)
    segmented_pivot = tp.sentencepiece_encode(pivot, model)
    second_bin = binarise_lines(cfg, step / f"{PIVOT_LANG}-{t}", PIVOT_LANG, t, segmented_pivot, tp.read_lines(target))
    return translate_multilingual(cfg, checkpoint, cpu, out, translator, PIVOT_LANG, t,
                                  second_bin.parent / "text" / f"test.{PIVOT_LANG}-{t}.{PIVOT_LANG}",
                                  f"pivot.{s}-{PIVOT_LANG}-{t}.2", second_bin)


def check_lang_tags(cfg, checkpoint):
    """Refuse, in one line, to decode a model with language tags other than those it was trained with."""
    from deepnet_fairseq.export import plain_options, read_checkpoint

    try:
        task_cfg = plain_options(read_checkpoint(checkpoint)["cfg"]["task"])
        lang_tags.check_model_strategy(cfg["data"]["lang_tags"], task_cfg, checkpoint)
    except ValueError as err:
        raise LaunchError(str(err)) from None


def evaluate_multilingual(cfg, checkpoint, cpu, out, engine="fairseq"):
    data, ev = cfg["data"], cfg["eval"]
    work = Path(cfg["paths"]["work"])
    translator = ctranslate2_translator(cfg, checkpoint, out, engine) if engine != "fairseq" else None
    rows = []
    for direction, corpus in multilingual_test_directions(cfg):
        s, t = direction.split("-")
        hyps = translate_multilingual(cfg, checkpoint, cpu, out, translator, s, t,
                                      work / "spm_text" / f"test.{corpus}.{s}", direction)
        refs = tp.read_lines(work / "ref" / f"test.{corpus}.{t}")
        sources = tp.read_lines(work / "ref" / f"test.{corpus}.{s}")
        tp.write_lines(out / f"hyp.{direction}.{t}", hyps)
        score, signature = bleu(hyps, refs, tokenize=ev["sacrebleu_tokenize"])
        copy, _ = bleu(sources, refs, tokenize=ev["sacrebleu_tokenize"])
        row = {"src": s, "tgt": t, "direction": direction, "zero_shot": direction in data["zero_shot_pairs"],
               "bleu": score, "chrf": chrf(hyps, refs), "copy_source_bleu": copy, "sentences": len(hyps),
               "signature": signature}
        row.update(langid.target_language_accuracy(hyps, t, data["langs"]))  # off-target output (issue 28)
        row.update(dict.fromkeys(PIVOT_FIELDS))
        if row["zero_shot"] and PIVOT_LANG not in (s, t):
            pivot = pivot_hypotheses(cfg, checkpoint, cpu, out, translator, direction, corpus)
            tp.write_lines(out / f"hyp.pivot.{direction}.{t}", pivot)
            on_target = langid.target_language_accuracy(pivot, t, data["langs"])["target_lang_acc"]
            row.update(pivot_bleu=bleu(pivot, refs, tokenize=ev["sacrebleu_tokenize"])[0], pivot_chrf=chrf(pivot, refs),
                       pivot_target_lang_acc=on_target)
            row["zero_shot_over_pivot"] = round(score / row["pivot_bleu"], 3) if row["pivot_bleu"] else None
        rows.append(row)
        pivot_note = f", pivot {row['pivot_bleu']}" if row["pivot_bleu"] is not None else ""
        print(f"[evaluate] {direction}: BLEU {score}, chrF++ {row['chrf']} (copy-source {copy}{pivot_note})", flush=True)
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
    return {"bleu": round(sum(by_direction.values()) / len(rows), 2), "chrf": round(sum(r["chrf"] for r in rows) / len(rows), 2),
            "lang_tags": data["lang_tags"], "signature": rows[0]["signature"],
            "copy_source_bleu": round(sum(r["copy_source_bleu"] for r in rows) / len(rows), 2),
            "metric": "average detokenised sacreBLEU over directions", "groups": groups, "directions": rows,
            "engine": engine, "langid": langid.identifier_name()}


HEATMAP_PANELS = (("bleu", "sacreBLEU"), ("target_lang_acc", "on target (%)"), ("pivot_bleu", "pivot BLEU (via en)"))


def heatmap(rows, langs, path, title):
    """Source x target matrices (the paper's Figures 9-10 style): BLEU, the share of hypotheses in the target
    language, and for zero-shot directions BLEU through English; a panel without values is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    used = [lang for lang in langs if any(lang in (r["src"], r["tgt"]) for r in rows)]
    index = {lang: i for i, lang in enumerate(used)}
    panels = [(key, label) for key, label in HEATMAP_PANELS if any(r.get(key) is not None for r in rows)]
    size = (3.5 + 0.5 * len(used), 2.5 + 0.45 * len(used))
    fig, axes = plt.subplots(1, len(panels), figsize=(size[0] * len(panels), size[1]), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        grid = np.full((len(used), len(used)), np.nan)
        for r in rows:
            if r.get(key) is not None:
                grid[index[r["src"]], index[r["tgt"]]] = r[key]
        image = ax.imshow(grid, cmap="viridis")
        ax.set_xticks(range(len(used)), used)
        ax.set_yticks(range(len(used)), used)
        ax.set_xlabel("target")
        ax.set_ylabel("source")
        ax.set_title(f"{title}: {label}" if key == "bleu" else label)
        if len(used) <= 12:
            for r in rows:
                if r.get(key) is not None:
                    ax.text(index[r["tgt"]], index[r["src"]], f"{r[key]:.1f}{'*' if r['zero_shot'] else ''}",
                            ha="center", va="center", color="white", fontsize=8)
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
    parser.add_argument("--arch", help=f"the method, of {', '.join(deepnet_methods.names())} (with --layers: finds "
                        "the run folder)")
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
        from deepnet_fairseq.average import average_checkpoints, last_checkpoints  # imports fairseq: not at start-up

        try:
            chosen = last_checkpoints(folder / "checkpoints", k)
        except FileNotFoundError as err:
            raise LaunchError(str(err)) from None
        averaged = average_checkpoints(chosen, folder / "checkpoints" / f"averaged_last{len(chosen)}.pt")
        print(f"[evaluate] averaged {len(chosen)} checkpoints: {', '.join(p.name for p in chosen)}", flush=True)
        if cfg["data"]["kind"] == "multilingual":
            check_lang_tags(cfg, averaged)
            result = evaluate_multilingual(cfg, averaged, cpu, out, opts.engine)
        else:
            result = evaluate_bilingual(cfg, averaged, cpu, out, opts.engine)
        result.update({"kind": "eval", "setup": cfg["setup"], "arch": arch,
                       "encoder_layers": layers[0] if layers else None, "decoder_layers": layers[1] if layers else None,
                       "averaged": [p.name for p in chosen], "updates": _updates(chosen[-1]),
                       "run_dir": str(folder), "eval_device": "cpu" if cpu else "cuda",
                       "wall_time_s": round(time.time() - start, 1), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                       "max_update": train_cfg.get("train", {}).get("max_update"),
                       "decoding": {key: cfg["eval"][key] for key in DECODING_KEYS},
                       **evaluated_run(folder, averaged, arch, train_cfg)})
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


# the eval settings a score depends on (or a decode's memory: max_tokens), as the record's "decoding"
DECODING_KEYS = ("beam", "lenpen", "max_len_a", "max_len_b", "max_tokens")


def evaluated_run(folder, checkpoint, arch, train_cfg):
    """The record's run facts: the averaged checkpoint's (shape, init, DeepNorm constants, updates), with where the
    training ran and its command from the run folder's run.json (the launcher's; unknown without it)."""
    from deepnet_fairseq.run_facts import checkpoint_facts

    facts = checkpoint_facts(checkpoint)
    trained = json.loads((folder / "run.json").read_text()) if (folder / "run.json").exists() else {}
    run = {key: facts.get(key, trained.get(key)) for key in records.RUN_KEYS}
    run.update({key: trained.get(key) for key in ("device", "gpu", "command")})
    run.update(git_commit=records.git_commit(), versions=records.versions())
    if not records.has_init(arch):
        del run["init"]
    fields = {"run": run, "deepnorm": facts.get("deepnorm"), "deepnorm_init": facts.get("init")}
    if train_cfg:
        fields["config"] = config_block(train_cfg, arch, run["device"])
    return fields


def _updates(checkpoint):
    match = re.search(r"_(\d+)\.pt$", checkpoint.name)
    return int(match.group(1)) if match else None


if __name__ == "__main__":
    sys.exit(main())
